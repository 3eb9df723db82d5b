"""How a training session's camera frames travel to the GPU (``codec=`` on the create call)."""

from __future__ import annotations

from enum import StrEnum


class Codec(StrEnum):
    """``LOSSLESS`` (the default) sends each frame's raw uint8 pixels: on a fast link that is the
    quickest lossless choice, since the CPU time of PNG-style compression costs more than the bytes
    it saves. ``JPEG_Q95`` sends JPEG at quality 95: a few times fewer bytes, slightly changed pixels."""

    LOSSLESS = "lossless"
    JPEG_Q95 = "jpeg_q95"
