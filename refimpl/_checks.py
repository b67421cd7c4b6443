"""What every refimpl error message shares: how it shows a received value.

:func:`describe` shows a value without printing an array, :func:`variable_path`
names a variable, and :func:`normalize_shape` checks a shape argument. Every
module that raises a ``TypeError`` or ``ValueError`` about a user's argument
goes through them, so the messages read alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

__all__ = ["describe", "input_arrays", "normalize_shape", "variable_path"]


def normalize_shape(shape, *, name: str = "shape") -> tuple[int, ...]:
    """Return ``shape`` as a tuple of non-negative Python ints.

    Args:
        shape: a tuple, list, ``tf.TensorShape`` or NumPy shape. Every
            dimension must be known.
        name: the argument's name, used in error messages.

    Returns:
        The shape as a tuple of ints.

    Raises:
        TypeError: if ``shape`` is not a sequence of integers.
        ValueError: if a dimension is unknown or negative.

    >>> normalize_shape([2, np.int64(3)])
    (2, 3)
    """
    if type(shape).__name__ == "TensorShape":  # tf.TensorShape, without tf
        if shape.rank is None or not shape.is_fully_defined():
            raise ValueError(
                f"`{name}` must be fully known, with a static size in every "
                f"dimension. Received: {name}={shape}"
            )
        shape = shape.as_list()
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, Sequence) and not isinstance(shape, np.ndarray):
        raise TypeError(
            f"`{name}` must be a tuple of ints. Received: {name}={describe(shape)}"
        )
    dims = []
    for d in shape:
        if d is None:
            raise ValueError(
                f"`{name}` must be fully known, with a static size in every "
                f"dimension. Received: {name}={tuple(shape)}"
            )
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(
                f"`{name}` must be a tuple of ints. Received: {name}={describe(shape)}"
            )
        if d < 0:
            raise ValueError(
                f"`{name}` must have non-negative dimensions. "
                f"Received: {name}={tuple(shape)}"
            )
        dims.append(int(d))
    return tuple(dims)


def variable_path(variable) -> str:
    """A variable's path (``"dense/kernel"``), the one name refimpl shows for it."""
    return str(getattr(variable, "path", None) or variable.name).removesuffix(":0")


def describe(value) -> str:
    """What an error message shows of a received value: never a whole array.

    A scalar, a string or a container of at most six scalars is shown as its
    ``repr`` (cut at 80 characters); anything larger as its type, shape and
    dtype, such as ``ndarray of shape (64, 64) and dtype float64``.

    >>> describe(3), describe([1, 2]), describe(np.zeros((64, 64)))
    ('3', '[1, 2]', 'ndarray of shape (64, 64) and dtype float64')
    """
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None and isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            array = None
        if array is not None and array.dtype != object and array.size <= 6:
            text = repr(value)
            if len(text) <= 80:
                return text
        if array is not None and array.dtype != object:
            shape, dtype = array.shape, None
        else:
            return f"{kind} of length {len(value)}"
    if shape is None:
        text = repr(value)
        return text if len(text) <= 80 else f"an object of type {kind}"
    text = f"{kind} of shape {tuple(shape)}"
    if dtype is not None:
        try:
            text += f" and dtype {keras.backend.standardize_dtype(dtype)}"
        except (TypeError, ValueError):
            text += f" and dtype {dtype}"
    return text


def input_arrays(x, y, name: str, rows_error: str):
    """A model's inputs and targets as NumPy arrays, with as many rows each.

    ``x`` is an array, or a dict or list of arrays (a model with several
    inputs, such as a keras-hub model); its structure is kept. ``name`` is
    the argument named when ``x`` is not arrays, ``rows_error`` the message
    (before the counts) when the rows differ.
    """
    several = isinstance(x, (list, tuple)) and len(x) > 0
    if isinstance(x, dict) or (several and all(hasattr(a, "shape") for a in x)):
        x = keras.tree.map_structure(np.asarray, x)
    else:
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"`{name}` must hold an array, or a dict or list of arrays. "
                f"Received: {name}={describe(x)}"
            ) from e
    y = np.asarray(y)
    rows = {len(part) for part in keras.tree.flatten(x)}
    if rows != {len(y)} or len(y) == 0:
        raise ValueError(
            f"{rows_error} Received: {', '.join(map(str, sorted(rows)))} and {len(y)}"
        )
    return x, y
