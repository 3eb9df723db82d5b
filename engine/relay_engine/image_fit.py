"""How pi05 fits a camera's image into its input: `ImageFit`, the one definition of the uint8 image
the model reads, shared by its collator (relay_engine.models.processor) and the decoded-frame cache
(relay_engine.datasets.decoded_frames).

The model reads a fixed size (pi05 224x224): an image is resized keeping its aspect ratio
(bilinear, antialiased), rounded to uint8, as openpi's PIL resize of a uint8 image is, and centred
on black. Rounding is what lets the cache hold a video camera's frames at the model's size: a
frame fitted once at decode time is the very array the collator makes of the same frame decoded
per sample, and an image already at the model's size passes through unchanged, so a cached frame
is not resized twice. torch's antialiased kernel gives the same bytes with any number of threads
(its plain bilinear kernel does not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ImageFit:
    """Resize to fit `height` x `width` keeping the aspect ratio (bilinear with antialiasing),
    round to uint8, and centre on black."""

    height: int
    width: int

    @property
    def key(self) -> str:
        """A name for this fit, in file names: `224x224-centre-aa`."""
        return f"{self.height}x{self.width}-centre-aa"

    @property
    def frame_bytes(self) -> int:
        return self.height * self.width * 3

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """A uint8 (h, w, 3) image as a uint8 (height, width, 3) one; the image itself if it is at
        that size already."""
        height, width = image.shape[:2]
        if (height, width) == (self.height, self.width):
            return image
        ratio = max(width / self.width, height / self.height)
        new_h, new_w = max(1, int(height / ratio)), max(1, int(width / ratio))
        if (new_h, new_w) == (height, width):
            resized = np.asarray(image)
        else:
            pixels = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
            scaled = F.interpolate(
                pixels, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True
            )
            resized = scaled[0].round_().clamp_(0.0, 255.0).to(torch.uint8).permute(1, 2, 0).numpy()
        top, left = (self.height - new_h) // 2, (self.width - new_w) // 2
        fitted = np.zeros((self.height, self.width, 3), dtype=np.uint8)
        fitted[top : top + new_h, left : left + new_w] = resized
        return fitted
