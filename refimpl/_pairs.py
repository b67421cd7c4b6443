"""Lists of ``(variable, mask)`` pairs, the one shape of every ``masks=`` argument.

Variables are unhashable, so masks come as a list of pairs;
:func:`pair_masks` matches them to the variables being trained, and
:func:`to_update_scale` reads a mask that may also scale updates.
"""

from __future__ import annotations

import numpy as np

from refimpl import backend
from refimpl._checks import describe, normalize_shape, variable_path
from refimpl.masks import _as_numpy, _check_shape, to_mask


def to_update_scale(mask, shape, *, name: str = "mask") -> np.ndarray:
    """Validate a mask that may also scale updates; return it as float32.

    Booleans, index lists and 0.0/1.0 arrays are read as by :func:`to_mask`
    (1.0 = trainable). A floating-point array may also hold values strictly
    between 0 and 1: each is the fraction of the optimizer's update that the
    entry receives (0.0 frozen, 1.0 the full update).

    Raises:
        ValueError: for a wrong shape, or a value outside [0, 1] (NaN included).

    >>> to_update_scale([1.0, 0.5, 0.0], (3,))
    array([1. , 0.5, 0. ], dtype=float32)
    """
    shape = normalize_shape(shape)
    array = _as_numpy(mask, name)
    if not np.issubdtype(array.dtype, np.floating):
        return to_mask(array, shape, name=name).astype(np.float32)
    _check_shape(array, shape, name)
    bad = ~((array >= 0.0) & (array <= 1.0))
    if bad.any():
        raise ValueError(
            f"`{name}` is a floating-point mask, so every value must lie in "
            f"[0, 1] (the fraction of each entry's update). Received the value "
            f"{array[bad].ravel()[0]!r} in {name}={describe(array)}"
        )
    return array.astype(np.float32)


def pair_masks(masks, variables, *, name: str = "masks", scales: bool = False):
    """Match a list of ``(variable, mask)`` pairs to ``variables``.

    This is the one structure every ``masks=`` argument of the package takes:
    a list (or tuple) of ``(variable, mask)`` pairs. A variable that no pair
    names trains in full.

    Args:
        masks: the pairs. Each variable must be one of ``variables`` and may
            appear once; each mask must fit its variable.
        variables: the variables, in the order the result follows.
        name: the argument's name, used in error messages.
        scales: accept floating-point masks with values in [0, 1]
            (:func:`to_update_scale`); the results are then float32 arrays.

    Returns:
        A list as long as ``variables``: for each, its validated mask (a
        boolean array, or float32 with ``scales=True``) or ``None``.

    Raises:
        TypeError: if ``masks`` is not a list of pairs, or a pair does not
            hold a variable.
        ValueError: for a variable that is not among ``variables``, a variable
            named twice, or a mask that does not fit.
    """
    pairs = check_pairs(masks, name=name)
    position = {id(v): i for i, v in enumerate(variables)}
    out: list = [None] * len(variables)
    for i, (variable, mask) in enumerate(pairs):
        index = position.get(id(variable))
        if index is None:
            raise ValueError(
                f"`{name}[{i}]` names a variable that is not among the "
                f"variables being trained. Received: {variable_path(variable)!r}; "
                f"expected one of {[variable_path(v) for v in variables][:8]}"
            )
        if out[index] is not None:
            raise ValueError(
                f"`{name}[{i}]` gives a second mask for {variable_path(variable)!r}; "
                "give each variable one mask"
            )
        shape = normalize_shape(tuple(variable.shape), name=f"{name}[{i}] shape")
        convert = to_update_scale if scales else to_mask
        out[index] = convert(mask, shape, name=f"{name}[{i}]")
    return out


def check_pairs(masks, *, name: str = "masks") -> list[tuple]:
    """Check that ``masks`` is a list of ``(variable, mask)`` pairs; return it."""
    return variable_pairs(masks, name=name, slot=0, kind="(variable, mask)")


def variable_pairs(items, *, name: str, slot: int, kind: str) -> list[tuple]:
    """Check a list of pairs holding a variable at index ``slot``; return it.

    The one check of ``masks`` (``(variable, mask)``) and ``grads_and_vars``
    (``(gradient, variable)``) arguments.
    """
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {kind} pairs. Received: "
            f"{name}={describe(items)}"
        )
    pairs = []
    for i, pair in enumerate(items):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(
                f"`{name}[{i}]` must be a {kind} pair. Received: "
                f"{name}[{i}]={describe(pair)}"
            )
        if not backend.is_variable(pair[slot]):
            where = "start" if slot == 0 else "end"
            raise TypeError(
                f"`{name}[{i}]` must {where} with a variable (a keras.Variable "
                f"or tf.Variable); a slice such as w[0] is a new tensor, not a "
                f"view. Received an object of type {type(pair[slot]).__name__}"
            )
        pairs.append((pair[0], pair[1]))
    return pairs
