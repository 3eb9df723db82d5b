"""Training loops on Relay's GPUs (docs/sessions.md): your program is the loop, each call a step.

from relay.training import ServiceClient, types

service_client = ServiceClient()
with service_client.create_lora_training_client(base_model="pi05", rank=32) as training_client:
    training_client.forward_backward(batch, "flow_matching")
    training_client.optim_step(types.AdamParams(learning_rate=1e-4))

A whole loop (data, schedule, logging, saving, resuming, evaluation) is examples/session_loop.py.
"""

from __future__ import annotations

from relay.errors import RequestFailedError
from relay.training import types
from relay.training.client import SamplingClient, ServiceClient, TrainingClient
from relay.training.futures import APIFuture

__all__ = ["APIFuture", "RequestFailedError", "SamplingClient", "ServiceClient", "TrainingClient", "types"]
