"""openpi's wire format: msgpack with numpy arrays, as `openpi_client.msgpack_numpy` reads and writes it.

An array travels as a map {b"__ndarray__": True, b"data": <raw bytes, C order>, b"dtype": <numpy
dtype string, "<f4">, b"shape": [...]}, a numpy scalar as {b"__npgeneric__": True, b"data":
<value>, b"dtype": ...}; the keys are msgpack binary. Object, void and complex dtypes are refused
both ways (openpi refuses them too: an object array would need pickle). Unlike openpi's reader,
`unpack` checks that the bytes fit the dtype and shape before making the array, and says what is
wrong in a `WireError` instead of raising numpy's.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_ARRAY = b"__ndarray__"
_SCALAR = b"__npgeneric__"
_REFUSED_KINDS = ("V", "O", "c")


class WireError(ValueError):
    """A message that is not openpi's msgpack-numpy."""


def pack(value: Any) -> bytes:
    """`value` (dicts, lists, numbers, strings, numpy arrays and scalars) as one msgpack message."""
    packed = msgpack.packb(value, default=_encode)
    assert isinstance(packed, bytes)
    return packed


def unpack(message: bytes) -> Any:
    """One msgpack message, its arrays as (read-only) numpy arrays."""
    try:
        return msgpack.unpackb(message, object_hook=_decode, strict_map_key=False)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as error:
        # (OverflowError: a numpy scalar's value past its dtype; ValueError covers msgpack's
        # StackError, a message nested too deeply.)
        raise WireError(f"not a msgpack message: {error or type(error).__name__}") from None


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _REFUSED_KINDS:
        raise TypeError(f"arrays of dtype {value.dtype} are not sent")
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {_ARRAY: True, b"data": array.tobytes(), b"dtype": array.dtype.str, b"shape": array.shape}
    if isinstance(value, np.generic):
        return {_SCALAR: True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"cannot send a {type(value).__name__}")


def _decode(value: dict[Any, Any]) -> Any:
    if _ARRAY in value:
        dtype = _dtype(value.get(b"dtype"))
        shape, data = value.get(b"shape"), value.get(b"data")
        if not isinstance(shape, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise WireError(f"an array's shape must be a list of sizes, got {shape!r}")
        if not isinstance(data, bytes):
            raise WireError("an array's data must be msgpack binary")
        if len(data) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise WireError(
                f"an array of shape {list(shape)} and dtype {dtype.str} needs "
                f"{int(np.prod(shape, dtype=np.int64)) * dtype.itemsize} bytes, got {len(data)}"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if _SCALAR in value:
        return _dtype(value.get(b"dtype")).type(value.get(b"data"))
    return value


def _dtype(name: Any) -> np.dtype[Any]:
    if not isinstance(name, str | bytes):  # np.dtype(None) would be float64
        raise WireError(f"an array's dtype must be a string, got {name!r}")
    try:
        dtype = np.dtype(name.decode() if isinstance(name, bytes) else name)
    except (TypeError, ValueError):
        raise WireError(f"unknown array dtype {name!r}") from None
    if dtype.kind in _REFUSED_KINDS:
        raise WireError(f"arrays of dtype {dtype} are refused")
    return dtype
