"""The wire format of a session's calls and results: a JSON header, then the arrays' raw bytes.

    b"RLY1" | header length (uint32, little-endian) | header (UTF-8 JSON) | blob 0 | blob 1 | ...

The header is the message with each array replaced by ``{"$a": [blob, dtype, shape]}`` (its
bytes as they lie in memory) or, for a frame sent with Codec.JPEG_Q95, ``{"$j": blob}``; its
``"$blobs"`` lists the blobs' lengths. Arrays cost one copy to send and none to read back, unlike
JSON lists of numbers (about 5x the bytes, and slow to parse). The API passes bodies through
without reading them; the worker decodes them.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

MAGIC = b"RLY1"
MEDIA_TYPE = "application/x-relay-frames"
_LENGTH = struct.Struct("<I")
JPEG_QUALITY = 95


class WireError(ValueError):
    """A body that is not a valid message; the message says what is wrong with it."""


class Jpeg:
    """A frame to send as JPEG (quality 95), put in a message in place of its array."""

    __slots__ = ("frame",)

    def __init__(self, frame: np.ndarray) -> None:
        self.frame = frame


def encode(message: Any) -> bytes:
    """A message of dicts, lists, numbers, strings, numpy arrays and Jpeg frames, as bytes."""
    blobs: list[bytes | memoryview] = []
    header = _strip(message, blobs)
    text = json.dumps({"$blobs": [len(b) for b in blobs], "m": header}, separators=(",", ":"))
    head = text.encode()
    return b"".join([MAGIC, _LENGTH.pack(len(head)), head, *blobs])


def _strip(value: Any, blobs: list[bytes | memoryview]) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _strip(v, blobs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strip(v, blobs) for v in value]
    if isinstance(value, Jpeg):
        blobs.append(_jpeg_bytes(value.frame))
        return {"$j": len(blobs) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.names is not None:
            raise WireError(f"an array of {value.dtype} cannot be sent; send numbers")
        array = np.ascontiguousarray(value)
        blobs.append(array.reshape(-1).view(np.uint8).data if array.size else b"")
        return {"$a": [len(blobs) - 1, array.dtype.str, list(array.shape)]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise WireError(f"a {type(value).__name__} cannot be sent; send numbers, strings, lists or numpy arrays")


def _jpeg_bytes(frame: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def is_jpeg_frame(value: Any) -> bool:
    """Whether JPEG can carry this frame (uint8, (H, W, 3)); anything else goes as it is, so the
    worker's check names the problem."""
    return (
        isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3 and value.shape[2] == 3
    )


def check(data: bytes | bytearray | memoryview) -> None:
    """Raise WireError unless `data` starts like a message (the API's cheap look at a call's body)."""
    if bytes(data[:4]) != MAGIC or len(data) < 8:
        raise WireError("the body is not a Relay call (it must start with RLY1; use relay.training)")
    (length,) = _LENGTH.unpack_from(data, 4)
    if 8 + length > len(data):
        raise WireError("the body is shorter than its header says")


def decode(data: bytes | bytearray | memoryview, *, writable: bool = False) -> Any:
    """The message in `data`. Arrays share `data`'s memory (read-only for bytes); `writable`
    copies the body once so that they can be written to."""
    if writable and not isinstance(data, bytearray):
        data = bytearray(data)
    check(data)
    view = memoryview(data)
    (length,) = _LENGTH.unpack_from(view, 4)
    try:
        header = json.loads(bytes(view[8 : 8 + length]))
        sizes = [int(n) for n in header["$blobs"]]
    except (ValueError, KeyError, TypeError) as error:
        raise WireError(f"the header is not valid: {error}") from None
    offsets = [8 + length]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    if offsets[-1] != len(view):
        raise WireError(f"the body has {len(view)} bytes; its header says {offsets[-1]}")
    return _fill(header.get("m"), view, offsets)


def _fill(value: Any, view: memoryview, offsets: list[int]) -> Any:
    if isinstance(value, dict):
        if "$a" in value and len(value) == 1:
            return _array(value["$a"], view, offsets)
        if "$j" in value and len(value) == 1:
            return _jpeg_frame(value["$j"], view, offsets)
        return {k: _fill(v, view, offsets) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, view, offsets) for v in value]
    return value


def _blob(index: Any, view: memoryview, offsets: list[int]) -> memoryview:
    if not isinstance(index, int) or not 0 <= index < len(offsets) - 1:
        raise WireError(f"the header names blob {index!r}, which the body does not have")
    return view[offsets[index] : offsets[index + 1]]


def _array(spec: Any, view: memoryview, offsets: list[int]) -> np.ndarray:
    try:
        index, dtype_text, shape = spec
        dtype = np.dtype(dtype_text)
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError) as error:
        raise WireError(f"an array's description {spec!r} is not valid: {error}") from None
    if dtype.hasobject:
        raise WireError(f"arrays of {dtype} are not accepted")
    blob = _blob(index, view, offsets)
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize != len(blob):
        raise WireError(
            f"an array of {dtype} {shape} needs {count * dtype.itemsize} bytes; it has {len(blob)}"
        )
    return np.frombuffer(blob, dtype=dtype, count=count).reshape(shape)


def _jpeg_frame(index: Any, view: memoryview, offsets: list[int]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    blob = _blob(index, view, offsets)
    try:
        with Image.open(io.BytesIO(blob)) as image:
            return np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as error:
        raise WireError(f"a JPEG frame could not be read: {error}") from None
