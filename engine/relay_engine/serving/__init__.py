"""Serving a pi05 policy: the model loaded once, observations checked and batched, chunks in the
robot's raw units. No web code here: the policy server's HTTP and websocket front is the
worker's (`relay_worker.serving`), and `relay serve` runs it on the user's machine."""

from relay_engine.serving.batcher import Batcher, ServerStopped, ServingStats
from relay_engine.serving.msgpack_numpy import WireError, pack, unpack
from relay_engine.serving.observations import DecodedObservation, ObservationLayout, decode_image
from relay_engine.serving.policy import ActionChunk, ServedPolicy, StageTiming, check_seed

__all__ = [
    "ActionChunk",
    "Batcher",
    "DecodedObservation",
    "ObservationLayout",
    "ServedPolicy",
    "ServerStopped",
    "ServingStats",
    "StageTiming",
    "WireError",
    "check_seed",
    "decode_image",
    "pack",
    "unpack",
]
