"""A safetensors file written one tensor at a time.

safetensors' own `save_file` turns every tensor into bytes before it writes the first (for a
full-size pi05, a second copy of all 3.35 B weights: 15 GiB of a process's memory on top of the
model). The format is simple enough to stream: an 8-byte little-endian header length, a JSON
header giving each tensor's dtype, shape and byte range, then the tensors' bytes back to back. The
header needs only shapes and dtypes, so each tensor is made (a LoRA layer merged, a weight moved
off the GPU) just before its bytes are written and dropped after: the save holds one tensor at a
time beyond the model. The file reads back with safetensors (and lerobot) like one from
`save_file`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# safetensors' dtype names (its format's spec).
_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class PendingTensor:
    """A tensor to be written: its shape and dtype now, its values when `make()` is called."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> PendingTensor:
        """A tensor that already exists (nothing to compute; it is only read when written)."""
        return cls(tuple(tensor.shape), tensor.dtype, lambda: tensor)

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.dtype).element_size()


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of zeros whose memory is never written: numpy's zeros come from calloc, whose large
    blocks are fresh pages that the kernel maps to its one shared page of zeros when read. Writing
    it to a file then costs no resident memory, where torch.zeros writes every byte first (pi05's
    output holds a 257,152 x 1,024 bf16 table of zeros, 0.5 GiB, that lerobot's strict load needs)."""
    raw = np.zeros(math.prod(shape) * torch.empty((), dtype=dtype).element_size(), dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def write_streamed(
    path: Path, tensors: dict[str, PendingTensor], metadata: dict[str, str] | None = None
) -> None:
    """Write `tensors` to the safetensors file `path`, making and writing one at a time (by name)."""
    names = sorted(tensors)
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in names:
        pending = tensors[name]
        header[name] = {
            "dtype": _DTYPES[pending.dtype],
            "shape": list(pending.shape),
            "data_offsets": [offset, offset + pending.nbytes],
        }
        offset += pending.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for name in names:
            pending = tensors[name]
            tensor = pending.make().detach().to("cpu").contiguous()
            if tuple(tensor.shape) != pending.shape or tensor.dtype != pending.dtype:
                raise ValueError(
                    f"{name}: made {tuple(tensor.shape)} {tensor.dtype}, "
                    f"announced {pending.shape} {pending.dtype}"
                )
            # The tensor's own bytes, without a copy (little-endian, as every machine torch runs on).
            file.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
            del tensor
