"""A deployment's statuses and event kinds (docs/serving.md, "Deployments").

starting: accepted; waiting for a serving worker, then loading the model on it; also after its
          worker was lost, while another worker loads it again (``attempt`` counts the loads)
ready:    the model is loaded and answering; ``/actions`` and the websocket are proxied to it
stopped:  ended by ``DELETE`` (``stop()``), or after ``idle_timeout_seconds`` without a request
error:    could not start (``error`` says why), or its workers kept dying while loading it
"""

from __future__ import annotations

STARTING = "starting"
READY = "ready"
STOPPED = "stopped"
ERROR = "error"

STATUSES: tuple[str, ...] = (STARTING, READY, STOPPED, ERROR)
LIVE: tuple[str, ...] = (STARTING, READY)
ENDED: frozenset[str] = frozenset({STOPPED, ERROR})

# A deployment's events are its moves between statuses, each with a reason: one kind per status.
EVENT_KINDS: tuple[str, ...] = STATUSES
