"""Validate and convert masks and index lists.

Every public function of `refimpl` that takes a ``mask``, ``masks`` or
``trainable_mask`` argument accepts two spellings and sends them through
:func:`to_mask`:

* a **boolean mask** of exactly the tensor's shape (``True`` = trainable), given
  as a NumPy array, a nested list, or an eager ``tf.Tensor``; a floating-point
  array of 0.0/1.0 values is accepted too, as produced by ``tf.cast(mask, float)``;
* an **index list** of shape ``[k, rank]``, integers, one row per trainable
  position, as taken by ``tf.scatter_nd`` and ``tf.gather_nd``.

The exceptions, the only ones:

* :func:`refimpl.ops.choose_mode` takes a boolean or 0.0/1.0 mask alone, and
  :func:`mask_to_indices` a boolean mask alone;
* an index list does not say the tensor's shape, so
  :class:`refimpl.FreezeEntries <refimpl.constraints.FreezeEntries>` takes one
  only with a full array of ``values`` (with a scalar ``values``, a boolean
  mask), and :func:`refimpl.plotting.plot_mask` only with ``values``;
* the masks of
  :class:`refimpl.MaskedOptimizer <refimpl.optimizers.MaskedOptimizer>` and of
  :func:`~refimpl.optimizers.apply_masked_gradients` may also hold fractions
  in [0, 1] that scale the update.

The ``positions`` of :func:`refimpl.ops.compose` and
:func:`refimpl.ops.sparse_matmul` may also be flat positions.

Integer arrays are read as index lists, never as 0/1 masks. An integer array
with the tensor's own shape is ambiguous and raises ``TypeError``: pass a
boolean mask, or call :func:`indices_to_mask` to mean indices. The one
exception: if the tensor's shape is itself ``[k, rank]`` (say ``(3, 2)``) and
the array holds a value other than 0 and 1, it can only be an index list, and
is read as one. (The ``positions`` of :func:`refimpl.ops.compose` and
:func:`refimpl.ops.sparse_matmul` name positions only: they read any integer
array as an index list.)

Masks are static: they fix the *structure* of a model, so they are plain NumPy
values, known when the graph is traced.

This module also holds refimpl's own argument checks (private), one
validator each, so every error message about a user's argument reads alike:
how a received value is shown, an integer argument, a shape, and the
``(variable, mask)`` pairs of every ``masks=`` argument matched to the
variables being trained.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from refimpl import backend

__all__ = [
    "indices_to_mask",
    "mask_to_indices",
    "to_mask",
]


def _as_numpy(value, name: str) -> np.ndarray:
    what = "a rectangular boolean mask or an integer index list of shape [k, rank]"
    return _as_array(value, name, what=what)


def _as_array(
    value, name: str, *, kind: str = "any", what: str = "an array"
) -> np.ndarray:
    """The one conversion of an array-like argument to NumPy, with a clear error.

    Variables and tensors of any backend are read (a symbolic tensor is
    refused: it has no value yet); lists become arrays. ``kind`` checks the
    dtype: ``"any"``, ``"numeric"`` (numbers, bfloat16 included) or
    ``"floating"``. The error names ``name`` and says ``what`` was expected.

    Returns:
        A NumPy ``ndarray`` of ``value``'s values.

    >>> from refimpl.masks import _as_array
    >>> _as_array([1.0, 2.0], "x", kind="floating")
    array([1., 2.])
    """
    if isinstance(value, keras.Variable) or keras.ops.is_tensor(value):
        if backend.is_symbolic(value):
            raise TypeError(
                f"`{name}` must be static (a NumPy array, a list, or an eager "
                f"tensor). Received a symbolic tensor: {name}={_describe(value)}"
            )
        value = keras.ops.convert_to_numpy(value)  # any backend, any device
    elif backend.is_variable(value):
        value = backend.read_now(value)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`{name}` must be {what}. Received: {name}={_describe(value)}"
        ) from err
    bad = array.dtype == object or array.dtype.itemsize == 0
    if kind == "numeric":
        bad = bad or array.dtype.kind in "OSUmMb"  # bfloat16 (kind 'V') is numeric
    elif kind == "floating":
        floating = np.issubdtype(array.dtype, np.floating)
        bad = bad or not (floating or array.dtype.name == "bfloat16")
    if bad:
        raise TypeError(
            f"`{name}` must be {what}. Received dtype {array.dtype}: "
            f"{name}={_describe(value)}"
        )
    return array


def indices_to_mask(indices, shape, *, name: str = "indices") -> np.ndarray:
    """Turn an index list of shape ``[k, rank]`` into a boolean mask.

    Args:
        indices: integers, one row per position, ``rank`` columns. An empty
            list means "no position".
        shape: the shape of the tensor the indices point into.
        name: the argument's name, used in error messages.

    Returns:
        A boolean NumPy array of ``shape``, ``True`` at the given positions.

    Raises:
        TypeError: if ``indices`` are not integers.
        ValueError: if they have the wrong number of columns, are negative,
            out of range, or name a position twice.

    >>> from refimpl.masks import indices_to_mask
    >>> indices_to_mask([[0, 1], [2, 2]], (3, 3)).astype(int)
    array([[0, 1, 0],
           [0, 0, 0],
           [0, 0, 1]])
    """
    shape = _normalize_shape(shape)
    array = _as_numpy(indices, name)
    rank = len(shape)
    if array.size == 0:
        return np.zeros(shape, dtype=bool)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"`{name}` must hold integers. Received dtype {array.dtype}: "
            f"{name}={_describe(array)}"
        )
    if array.ndim != 2 or array.shape[1] != rank:
        raise ValueError(
            f"`{name}` must have shape [k, {rank}] (one row of {rank} "
            f"coordinate(s) per position, for a tensor of shape {shape}). "
            f"Received shape {tuple(array.shape)}: {name}={_describe(array)}"
        )
    if (array < 0).any():
        bad = array[(array < 0).any(axis=1)][0]
        raise ValueError(
            f"`{name}` must not be negative. Received the row {bad.tolist()} "
            f"for a tensor of shape {shape}"
        )
    too_big = (array >= np.asarray(shape)).any(axis=1)
    if too_big.any():
        bad = array[too_big][0]
        raise ValueError(
            f"`{name}` is out of range: the row {bad.tolist()} does not fit a "
            f"tensor of shape {shape}"
        )
    mask = np.zeros(shape, dtype=bool)
    flat = np.ravel_multi_index(tuple(array.T), shape) if shape else np.zeros(1, int)
    unique, counts = np.unique(flat, return_counts=True)
    if (counts > 1).any():
        dup = np.unravel_index(unique[counts > 1][0], shape)
        raise ValueError(
            f"`{name}` names the position {[int(i) for i in dup]} more than "
            f"once; duplicated indices would be summed by scatter operations. "
            f"Received: {name}={_describe(array)}"
        )
    mask.reshape(-1)[flat] = True
    return mask


def to_mask(
    mask, shape, *, name: str = "mask", indices_expected: bool = False
) -> np.ndarray:
    """Validate ``mask`` against ``shape`` and return it as a boolean array.

    Args:
        mask: a boolean mask of exactly ``shape``, a 0.0/1.0 floating-point
            mask of exactly ``shape``, or an integer index list of shape
            ``[k, len(shape)]`` (see the module docstring).
        shape: the shape of the tensor the mask applies to.
        name: the argument's name, used in error messages.
        indices_expected: ``True`` for an argument documented as an index
            list (``indices=``): an integer array is then read as indices even
            where it could also be a 0/1 mask.

    Returns:
        A new boolean NumPy array of ``shape`` (``True`` = trainable).

    Raises:
        TypeError: for a symbolic tensor, an integer array that is not an index
            list, or a non-numeric value.
        ValueError: for a wrong shape, values other than 0 and 1, or bad
            indices.

    >>> from refimpl.masks import to_mask
    >>> to_mask([True, False, True], (3,))
    array([ True, False,  True])
    >>> to_mask([[1]], (3,))  # an index list: position 1
    array([False,  True, False])
    """
    shape = _normalize_shape(shape)
    array = _as_numpy(mask, name)
    if array.dtype == bool:
        _check_shape(array, shape, name)
        return array.copy()
    if np.issubdtype(array.dtype, np.integer) or array.size == 0:
        # An integer array of the tensor's own shape is either a 0/1 mask or,
        # for a tensor of shape (k, rank), an index list. Read it as indices
        # only when it cannot be a 0/1 mask; otherwise ask which is meant.
        could_be_indices = array.ndim == 2 and array.shape[1] == len(shape)
        could_be_01_mask = array.shape == shape and np.isin(array, (0, 1)).all()
        ambiguous = could_be_01_mask and not indices_expected
        if array.shape == shape and (ambiguous or not could_be_indices):
            raise TypeError(
                f"`{name}` is an integer array of the tensor's own shape "
                f"{shape}. Integer arrays are read as index lists of shape "
                f"[k, {len(shape)}], so this one is ambiguous; pass a boolean "
                f"mask (for example `{name}.astype(bool)`), or call "
                f"`refimpl.masks.indices_to_mask` for indices. "
                f"Received: {name}={_describe(array)}"
            )
        return indices_to_mask(array, shape, name=name)
    if np.issubdtype(array.dtype, np.floating):
        _check_shape(array, shape, name)
        if not np.isin(array, (0.0, 1.0)).all():
            bad = array[~np.isin(array, (0.0, 1.0))].ravel()[0]
            raise ValueError(
                f"`{name}` is a floating-point mask, so it may only hold 0.0 "
                f"and 1.0. Received the value {bad!r} in {name}={_describe(array)}"
            )
        return array == 1.0
    raise TypeError(
        f"`{name}` must be a boolean mask or an integer index list. "
        f"Received dtype {array.dtype}: {name}={_describe(array)}"
    )


def mask_to_indices(mask) -> np.ndarray:
    """Return the ``[k, rank]`` int64 index list of the ``True`` entries.

    Returns:
        An int64 NumPy array of shape ``[k, rank]``, its rows in row-major (C)
        order, the order ``tf.boolean_mask`` uses.

    >>> from refimpl.masks import mask_to_indices
    >>> mask_to_indices([[True, False], [False, True]])
    array([[0, 0],
           [1, 1]])
    """
    array = _as_numpy(mask, "mask")
    if array.dtype != bool:
        raise TypeError(
            f"`mask` must be boolean. Received dtype {array.dtype}: "
            f"mask={_describe(array)}"
        )
    return np.argwhere(array).astype(np.int64)


def _mask_constant(mask):
    """Return a validated boolean NumPy mask as a boolean backend tensor, fast.

    (On TensorFlow, ``tf.constant`` of a large boolean array is slow: seconds
    for a 4096 x 4096 mask inside ``tf.function``; see
    ``refimpl.backend.bool_constant``, which this calls.)

    >>> from refimpl.masks import _mask_constant
    >>> keras.ops.convert_to_numpy(_mask_constant(np.array([True, False])))
    array([ True, False])
    """
    return backend.bool_constant(mask)


def _mask_shape(mask, *, name: str = "mask") -> tuple[int, ...] | None:
    """The shape of a boolean or floating-point mask; ``None`` for an index list.

    An index list does not say the shape of the tensor it points into, so a
    caller that needs the shape asks for it when this returns ``None``.

    >>> from refimpl.masks import _mask_shape
    >>> _mask_shape([[True, False]]), _mask_shape([[0, 1]])
    ((1, 2), None)
    """
    array = _as_numpy(mask, name)
    if array.size == 0 and array.dtype != bool:
        return None  # an empty index list, as to_mask reads it
    if array.dtype == bool or np.issubdtype(array.dtype, np.floating):
        return tuple(array.shape)
    return None


def _check_shape(array: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    if array.shape != shape:
        raise ValueError(
            f"`{name}` must have the tensor's shape {shape}. Received a mask "
            f"of shape {tuple(array.shape)}: {name}={_describe(array)}"
        )


# -- argument checks ---------------------------------------------------------
def _check_int(
    value, name: str, *, minimum: int | None = 0, maximum: int | None = None
) -> int:
    """Return ``value`` as a Python int in ``[minimum, maximum]``, or raise.

    The one check of an integer argument: a ``bool`` is not an int.

    Raises:
        TypeError: if ``value`` is not an integer.
        ValueError: if it is out of range.

    >>> from refimpl.masks import _check_int
    >>> _check_int(3, "every", minimum=1)
    3
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int. Received: {name}={_describe(value)}")
    value = int(value)
    low = minimum is not None and value < minimum
    if low or (maximum is not None and value > maximum):
        bounds = [f"at least {minimum}"] if minimum is not None else []
        bounds += [f"at most {maximum}"] if maximum is not None else []
        raise ValueError(
            f"`{name}` must be {' and '.join(bounds)}. Received: {name}={value}"
        )
    return value


def _normalize_shape(shape, *, name: str = "shape") -> tuple[int, ...]:
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

    >>> _normalize_shape([2, np.int64(3)])
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
            f"`{name}` must be a tuple of ints. Received: {name}={_describe(shape)}"
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
                f"`{name}` must be a tuple of ints. Received: {name}={_describe(shape)}"
            )
        if d < 0:
            raise ValueError(
                f"`{name}` must have non-negative dimensions. "
                f"Received: {name}={tuple(shape)}"
            )
        dims.append(int(d))
    return tuple(dims)


def _matching_paths(path: str, paths) -> list[int]:
    """The indices of ``paths`` equal to ``path``; where none is, those that end
    in it or that it ends in (a model's name in front, or not)."""
    found = [i for i, own in enumerate(paths) if own == path]
    return found or [
        i
        for i, own in enumerate(paths)
        if own.endswith("/" + path) or path.endswith("/" + own)
    ]


def _variable_path(variable) -> str:
    """A variable's path (``"dense/kernel"``), the one name refimpl shows for it."""
    return str(getattr(variable, "path", None) or variable.name).removesuffix(":0")


def _describe(value) -> str:
    """What an error message shows of a received value: never a whole array.

    A scalar, a string or a container of at most six scalars is shown as its
    ``repr`` (cut at 80 characters); anything larger as its type, shape and
    dtype, such as ``ndarray of shape (64, 64) and dtype float64``.

    >>> _describe(3), _describe([1, 2]), _describe(np.zeros((64, 64)))
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


def _input_arrays(x, y, name: str, rows_error: str):
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
                f"Received: {name}={_describe(x)}"
            ) from e
    y = np.asarray(y)
    rows = {len(part) for part in keras.tree.flatten(x)}
    if rows != {len(y)} or len(y) == 0:
        raise ValueError(
            f"{rows_error} Received: {', '.join(map(str, sorted(rows)))} and {len(y)}"
        )
    return x, y


# -- (variable, mask) pairs -------------------------------------------------
def _to_update_scale(mask, shape, *, name: str = "mask") -> np.ndarray:
    """Validate a mask that may also scale updates; return it as float32.

    Booleans, index lists and 0.0/1.0 arrays are read as by :func:`to_mask`
    (1.0 = trainable). A floating-point array may also hold values strictly
    between 0 and 1: each is the fraction of the optimizer's update that the
    entry receives (0.0 frozen, 1.0 the full update).

    Raises:
        ValueError: for a wrong shape, or a value outside [0, 1] (NaN included).

    >>> _to_update_scale([1.0, 0.5, 0.0], (3,))
    array([1. , 0.5, 0. ], dtype=float32)
    """
    shape = _normalize_shape(shape)
    array = _as_numpy(mask, name)
    if not np.issubdtype(array.dtype, np.floating):
        return to_mask(array, shape, name=name).astype(np.float32)
    _check_shape(array, shape, name)
    bad = ~((array >= 0.0) & (array <= 1.0))
    if bad.any():
        raise ValueError(
            f"`{name}` is a floating-point mask, so every value must lie in "
            f"[0, 1] (the fraction of each entry's update). Received the value "
            f"{array[bad].ravel()[0]!r} in {name}={_describe(array)}"
        )
    return array.astype(np.float32)


def _pair_masks(masks, variables, *, name: str = "masks", scales: bool = False):
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
            (:func:`_to_update_scale`); the results are then float32 arrays.

    Returns:
        A list as long as ``variables``: for each, its validated mask (a
        boolean array, or float32 with ``scales=True``) or ``None``.

    Raises:
        TypeError: if ``masks`` is not a list of pairs, or a pair does not
            hold a variable.
        ValueError: for a variable that is not among ``variables``, a variable
            named twice, or a mask that does not fit.
    """
    pairs = _check_pairs(masks, name=name)
    position = {id(v): i for i, v in enumerate(variables)}
    out: list = [None] * len(variables)
    for i, (variable, mask) in enumerate(pairs):
        index = position.get(id(variable))
        if index is None:
            raise ValueError(
                f"`{name}[{i}]` names a variable that is not among the "
                f"variables being trained. Received: {_variable_path(variable)!r}; "
                f"expected one of {[_variable_path(v) for v in variables][:8]}"
            )
        if out[index] is not None:
            raise ValueError(
                f"`{name}[{i}]` gives a second mask for {_variable_path(variable)!r}; "
                "give each variable one mask"
            )
        shape = _normalize_shape(tuple(variable.shape), name=f"{name}[{i}] shape")
        convert = _to_update_scale if scales else to_mask
        out[index] = convert(mask, shape, name=f"{name}[{i}]")
    return out


def _check_pairs(masks, *, name: str = "masks") -> list[tuple]:
    """Check that ``masks`` is a list of ``(variable, mask)`` pairs; return it."""
    return _variable_pairs(masks, name=name, slot=0, kind="(variable, mask)")


def _variable_pairs(items, *, name: str, slot: int, kind: str) -> list[tuple]:
    """Check a list of pairs holding a variable at index ``slot``; return it.

    The one check of ``masks`` (``(variable, mask)``) and ``grads_and_vars``
    (``(gradient, variable)``) arguments.
    """
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {kind} pairs. Received: "
            f"{name}={_describe(items)}"
        )
    pairs = []
    for i, pair in enumerate(items):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(
                f"`{name}[{i}]` must be a {kind} pair. Received: "
                f"{name}[{i}]={_describe(pair)}"
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
