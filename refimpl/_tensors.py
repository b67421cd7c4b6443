"""The tensor checks the structured builders share (private)."""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from refimpl import backend
from refimpl._checks import describe


def split_last(x, sizes: Sequence[int]) -> list:
    """Split ``x`` along its last axis into pieces of the given sizes."""
    if len(sizes) == 1:
        return [x]
    return ops.split(x, list(np.cumsum(sizes)[:-1]), axis=-1)


def _dtype(tensor) -> str:
    return keras.backend.standardize_dtype(tensor.dtype)


def _tensor(value):
    """``value`` as a backend tensor; a variable is read (and so differentiated)."""
    if isinstance(value, keras.Variable):
        return value.value
    if ops.is_tensor(value) or backend.is_variable(value):
        return value
    return ops.convert_to_tensor(value)


def _vector(value, name: str):
    try:
        tensor = _tensor(value)
        dtype = _dtype(tensor)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`{name}` must be a 1-D numeric tensor. Received: {name}={describe(value)}"
        ) from err
    if not (dtype.startswith(("float", "complex")) or dtype == "bfloat16"):
        raise TypeError(
            f"`{name}` must hold floating-point numbers. Received dtype "
            f"{dtype}: {name}={describe(value)}"
        )
    shape = tuple(tensor.shape)
    if len(shape) != 1 or shape[0] is None:
        raise ValueError(
            f"`{name}` must be a 1-D tensor of known length. "
            f"Received: {name}.shape={shape}"
        )
    return tensor


def _batch(x, n: int, dtype):
    x = _tensor(x)
    shape = tuple(x.shape)
    if len(shape) < 1 or shape[-1] != n:
        raise ValueError(
            f"`x` must have shape [..., {n}] to be multiplied by an {n}x{n} "
            f"matrix from the right. Received: x.shape={shape}"
        )
    dtype = keras.backend.standardize_dtype(dtype)
    if _dtype(x) != dtype:
        raise TypeError(
            f"`x` must have the matrix's dtype {dtype}. Received: x.dtype={_dtype(x)}"
        )
    return x


def _is_array(value) -> bool:
    """A tensor, variable or NumPy array (not a list of them)."""
    return (
        isinstance(value, np.ndarray)
        or ops.is_tensor(value)
        or backend.is_variable(value)
    )
