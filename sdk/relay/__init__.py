"""Relay: fine-tune pi0.5 robot policies on LeRobot datasets.

``relay.sft`` starts recipe jobs, ``relay.training`` drives a training loop step by step on
Relay's GPUs. This package is the client: it needs no torch (except for custom losses).
"""

from __future__ import annotations

from relay.codec import Codec

__version__ = "0.1.0"

__all__ = ["Codec", "__version__"]
