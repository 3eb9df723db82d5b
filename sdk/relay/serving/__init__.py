"""Serve a tuned policy to robots (docs/serving.md): deploy a model on the service and ask it for
actions over HTTP, or connect openpi-client to its websocket.

import relay.serving

deployment = relay.serving.deploy("ft-3f9a1c0d2b7e", max_batch=8).wait_ready()
chunk = deployment.actions({"images": {"base_0_rgb": frame}, "state": state, "prompt": "..."}, seed=7)
deployment.stop()
"""

from __future__ import annotations

from relay.serving.config import DeploymentConfig
from relay.serving.deployment import Deployment, deploy, list_deployments, retrieve

__all__ = ["Deployment", "DeploymentConfig", "deploy", "list_deployments", "retrieve"]
