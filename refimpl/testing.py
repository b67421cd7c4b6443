"""Checks that the book and the tests use to prove their claims.

"Frozen" in this project means *bit-exact*: the stored bits of a frozen entry
are the same before and after training. :func:`assert_frozen` compares bits,
not values within a tolerance, so it catches a weight decay of 1e-12 as surely
as a step of 1.0, and it treats a NaN that appeared as a change.
"""

from __future__ import annotations

import re

import keras
import numpy as np

from refimpl.masks import _as_array, _describe, to_mask

__all__ = ["moved", "assert_frozen", "count_free_parameters", "count_optimizer_state"]


def _numpy(value, name: str) -> np.ndarray:
    return _as_array(value, name, what="a numeric array or tensor")


def moved(before, after) -> np.ndarray:
    """Return a boolean array: ``True`` where the stored bits changed.

    Args:
        before: the tensor, variable or array before training.
        after: the same after training; same shape and dtype.

    Returns:
        A boolean NumPy array of the common shape.

    Raises:
        ValueError: if the shapes differ.
        TypeError: if the dtypes differ.

    >>> from refimpl.testing import moved
    >>> moved([1.0, 2.0, 3.0], [1.0, 2.5, 3.0])
    array([False,  True, False])
    """
    a = _numpy(before, "before")
    b = _numpy(after, "after")
    if a.shape != b.shape:
        raise ValueError(
            f"`before` and `after` must have the same shape. Received shapes "
            f"{a.shape} and {b.shape}"
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"`before` and `after` must have the same dtype. Received "
            f"{a.dtype} and {b.dtype}"
        )
    view = np.dtype(f"V{a.dtype.itemsize}")
    return np.ascontiguousarray(a).view(view) != np.ascontiguousarray(b).view(view)


def assert_frozen(before, after, mask) -> None:
    """Assert that every entry outside ``mask`` kept its exact bits.

    Args:
        before: the tensor, variable or array before training.
        after: the same after training.
        mask: the trainable positions (``True`` = may change), in any form
            :func:`refimpl.masks.to_mask` accepts. Every other entry is frozen
            and must be bit-for-bit identical in ``after``.

    Returns:
        ``None`` when no frozen entry moved.

    Raises:
        AssertionError: naming how many frozen entries moved, and the first few
            with their values before and after.

    >>> from refimpl.testing import assert_frozen
    >>> assert_frozen([1.0, 2.0], [1.5, 2.0], mask=[True, False])
    >>> assert_frozen([1.0, 2.0], [1.0, 2.1], mask=[True, False])
    Traceback (most recent call last):
    ...
    AssertionError: 1 of 1 frozen entries moved; first: [1] 2.0 -> 2.1
    """
    changed = moved(before, after)
    trainable = to_mask(mask, changed.shape)
    bad = changed & ~trainable
    if bad.any():
        a = _numpy(before, "before")
        b = _numpy(after, "after")
        where = np.argwhere(bad)[:3]
        shown = ", ".join(
            f"{idx.tolist()} {a[tuple(idx)]!r} -> {b[tuple(idx)]!r}" for idx in where
        )
        raise AssertionError(
            f"{int(bad.sum())} of {int((~trainable).sum())} frozen entries "
            f"moved; first: {_plain(shown)}"
        )


def _plain(text: str) -> str:
    # NumPy 2 prints scalars as np.float32(2.0); keep messages readable.
    return re.sub(r"np\.\w+\(([^()]*)\)", r"\1", text)


def count_free_parameters(model_or_variables) -> int:
    """Count the values an optimizer can change.

    For a Keras model or layer this is the total size of its trainable
    weights; for a list of variables, the total size of the trainable ones.
    A structured layer of this package keeps only its free values in
    trainable weights, so this is its true number of free parameters (a
    partial weight in the select form counts its full size).

    Returns:
        The count, an ``int``.

    >>> from refimpl.testing import count_free_parameters
    >>> import keras
    >>> layer = keras.layers.Dense(3)
    >>> layer.build((None, 4))
    >>> count_free_parameters(layer)  # a 4x3 kernel and 3 biases
    15
    >>> from refimpl import enable_partial
    >>> enable_partial(layer, np.eye(4, 3, dtype=bool))
    >>> count_free_parameters(layer)  # 3 free kernel entries and 3 biases
    6
    """
    weights = getattr(model_or_variables, "trainable_weights", None)
    if weights is None:
        if not isinstance(model_or_variables, (list, tuple)):
            raise TypeError(
                "`model_or_variables` must be a Keras model or layer, or a list "
                f"of variables. Received: {_describe(model_or_variables)}"
            )
        for v in model_or_variables:
            if not hasattr(v, "shape") or isinstance(v, (str, bytes)):
                raise TypeError(
                    "`model_or_variables` must hold variables. Received an "
                    f"element {_describe(v)} of type {type(v).__name__}"
                )
        weights = [v for v in model_or_variables if getattr(v, "trainable", True)]
    return int(sum(int(np.prod(w.shape)) for w in weights))


def count_optimizer_state(optimizer) -> int:
    """Count the values a Keras optimizer keeps for its variables.

    The total size of its per-weight slots (Adam's moments, momentum, EMA
    copies, masks of a
    :class:`refimpl.MaskedOptimizer <refimpl.optimizers.MaskedOptimizer>`, the
    slots of every group of a
    `MultiOptimizer <https://keras.io/api/optimizers/multi_optimizer/>`__);
    scalar bookkeeping such as the step count and the learning rate is left
    out, and with it the slots of a scalar weight (a learned scalar's two Adam
    moments are scalars too). Build the optimizer first (one step, or
    ``optimizer.build(variables)``).

    Returns:
        The count, an ``int``.

    >>> from refimpl.testing import count_optimizer_state
    >>> import keras
    >>> w = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
    >>> adam = keras.optimizers.Adam()
    >>> adam.build([w])
    >>> count_optimizer_state(adam)  # two moments of four values
    8
    """

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`optimizer` must be a Keras optimizer. Received: "
            f"optimizer={_describe(optimizer)}"
        )
    if not optimizer.built:
        raise ValueError(
            "`optimizer` must be built: take one step, or call "
            "`optimizer.build(variables)`. Received an unbuilt "
            f"{type(optimizer).__name__}"
        )
    seen = set()
    total = 0
    for variable in optimizer.variables:
        if id(variable) in seen or not len(variable.shape):
            continue
        seen.add(id(variable))
        total += int(np.prod(variable.shape))
    return total
