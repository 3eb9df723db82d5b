"""Serving a model: a pi05 policy (observations checked and batched, chunks in the robot's raw
units) or a tuned RT-J (entity rows of its database -> the task's predictions), loaded once.
No web code here: the policy server's HTTP and websocket front is the
worker's (`relay_worker.serving`), and `relay serve` runs it on the user's machine."""

from relay_engine.serving.batcher import Batcher, ServerStopped, ServingStats
from relay_engine.serving.msgpack_numpy import WireError, pack, unpack
from relay_engine.serving.observations import (
    MAX_REQUEST_PIXELS,
    DecodedObservation,
    ObservationLayout,
    PixelBudget,
    decode_image,
)
from relay_engine.serving.policy import ActionChunk, ServedPolicy, StageTiming, check_seed
from relay_engine.serving.relational import DecodedRow, RowNotFound, RowPrediction, ServedRelationalModel
from relay_engine.serving.served import ServedModel, load_served_model

__all__ = [
    "MAX_REQUEST_PIXELS",
    "ActionChunk",
    "Batcher",
    "DecodedObservation",
    "DecodedRow",
    "ObservationLayout",
    "PixelBudget",
    "RowNotFound",
    "RowPrediction",
    "ServedModel",
    "ServedPolicy",
    "ServedRelationalModel",
    "ServerStopped",
    "ServingStats",
    "StageTiming",
    "WireError",
    "check_seed",
    "decode_image",
    "load_served_model",
    "pack",
    "unpack",
]
