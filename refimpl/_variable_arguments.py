"""The arguments of :class:`refimpl.PartialVariable <refimpl.variable.PartialVariable>`,
checked.

A value and a mask make a partial tensor; a ``shape`` and ``num_free`` make
a shell that the weights of a saved model fill. Each mistake gets a
``TypeError`` or ``ValueError`` that names the argument.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl._checks import describe, normalize_shape
from refimpl.masks import as_array
from refimpl.ops import check_mode


def read_arguments(initial_value, mask, mode, shape, num_free, auto):
    """Check :class:`PartialVariable`'s arguments: a value and a mask, or a shell.

    Returns ``(value, shape, num_free)``: the dense value as a floating
    NumPy array (``None`` for a shell), its shape, and the shell's count.
    """
    check_mode(mode)
    if not isinstance(auto, (bool, np.bool_)):
        raise TypeError(f"`auto` must be a bool. Received: auto={describe(auto)}")
    if auto and mode not in ("sparse", "delta"):
        raise ValueError(
            "`auto` goes with a resolved mode 'sparse' or 'delta' (what "
            f"mode='auto' resolves to). Received: auto=True, mode={describe(mode)}"
        )
    shell = initial_value is None and mask is None
    if shell:
        if shape is None or num_free is None:
            raise ValueError(
                "`initial_value` and `mask` are required. (Only a shell "
                "rebuilt from a saved config gives `shape` and `num_free` "
                "instead.) Received: initial_value=None, mask=None"
            )
        if mode == "auto":
            raise ValueError("A shell needs its resolved `mode`. Received: 'auto'")
        shape = normalize_shape(shape, name="shape")
        num_free = _count(num_free, int(np.prod(shape)))
        value = None
        check_sparse_rank(mode, shape)
    else:
        if initial_value is None or mask is None:
            missing, given = (
                ("initial_value", "mask")
                if initial_value is None
                else ("mask", "initial_value")
            )
            raise ValueError(
                f"`{missing}` is required with `{given}`. Received: {missing}=None"
            )
        if shape is not None or num_free is not None:
            extra = "shape" if shape is not None else "num_free"
            raise ValueError(
                f"`{extra}` is only for a shell rebuilt from a config, "
                "which has no `initial_value` or `mask`: give one or the "
                f"other. Received: shape={describe(shape)}, "
                f"num_free={describe(num_free)}"
            )
        value = float_array(initial_value)
        shape = tuple(value.shape)
    return value, shape, num_free


def check_sparse_rank(mode: str, shape) -> None:
    if mode == "sparse" and len(shape) != 2:
        raise ValueError(
            "mode='sparse' is a matrix product: it needs a 2-D tensor. "
            f"Received a tensor of shape {tuple(shape)}"
        )


def check_exact(value: np.ndarray, dtype: str) -> None:
    # The promise is bit-for-bit frozen entries: a dtype that rounds them
    # would break it before the first step, so the rounding must be asked for.
    cast = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(value, dtype)))
    if not np.array_equal(cast.astype(value.dtype), value, equal_nan=True):
        raise ValueError(
            f"`dtype` {dtype!r} cannot hold the values of `initial_value` "
            f"({value.dtype.name}) exactly, so the frozen entries would be "
            "rounded. Cast the values yourself to accept that, for example "
            f"`initial_value.astype({dtype!r})`. Received: dtype={dtype!r}"
        )


def float_array(value, name: str = "initial_value") -> np.ndarray:
    return as_array(value, name, kind="floating", what="a floating-point tensor")


def _count(value, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"`num_free` must be an int. Received: num_free={describe(value)}"
        )
    if not 0 <= value <= size:
        raise ValueError(
            f"`num_free` must be between 0 and the tensor's size {size}. "
            f"Received: num_free={value}"
        )
    return int(value)
