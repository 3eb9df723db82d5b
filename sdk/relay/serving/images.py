"""Camera images as POST /v1/deployments/{id}/actions takes them: base64 PNG (lossless, so the
model sees exactly the pixels the robot had, as it does over the websocket)."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image


def png_base64(image: Any) -> str:
    """A uint8 image (H, W, 3), or (3, H, W) as lerobot stores frames, as base64 PNG; text (already
    encoded) is passed on as it is."""
    if isinstance(image, str):
        return image
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
        array = np.moveaxis(array, 0, -1)
    if array.dtype != np.uint8:
        raise ValueError(f"an image must be uint8 (H, W, 3), got {array.dtype} {array.shape}")
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def observation_json(observation: Mapping[str, Any]) -> dict[str, Any]:
    """An observation (images as arrays, state as an array or list) as the JSON body's observation."""
    body = dict(observation)
    images = body.get("images")
    if isinstance(images, Mapping):
        body["images"] = {str(name): png_base64(image) for name, image in images.items()}
    state = body.get("state")
    if isinstance(state, np.ndarray):
        body["state"] = state.astype(float).tolist()
    return body
