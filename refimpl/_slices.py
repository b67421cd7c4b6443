"""The ``"slices"`` form: a mask of whole slices, trained through dense sub-products.

A mask is a *rectangle* when its free entries are every combination of a set
of indices per axis: whole rows, whole columns, a block of rows × columns
(for a ``Dense`` kernel ``[in, out]``, rows are input features and columns
are units; for a query kernel ``[in, heads, head_size]``, whole heads are a
rectangle too). Then, with ``Δ`` the free values' differences from the base
(a small dense array of the rectangle's shape),

    x @ W = x @ base + expand(take(x, rows) @ Δ, columns)

so the product never composes ``W`` nor keeps it for the backward pass, and
the free values' gradient is a dense product of the rectangle's size:
``take(x, rows)ᵀ g[..., columns]``, about ``rows / in`` of the full one. The
frozen base is only read; before training ``Δ`` is exactly zero and the
output is the plain layer's bit for bit.

The same holds for a convolution (``groups=1``): whole filters (output
channels) or whole input channels, each over the full kernel window, train
through a convolution of the chosen channels. An ``Embedding`` table free in
whole rows (new or chosen tokens) looks its rows up in the free values
themselves, exactly the composed table's lookup, and never composes the
``vocabulary x dim`` table.

The free values are stored as in ``"delta"`` (the same weights and files):
sorted flat positions, so ``free.reshape(rectangle shape)`` is
``W[np.ix_(*sets)]``.
"""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["rectangle", "slice_product", "row_lookup", "kernel_axes", "layer_axes"]


def rectangle(positions, shape):
    """The index set of each axis if ``positions`` fill a rectangle, else ``None``.

    An axis the rectangle covers whole gets ``None``. ``positions`` are flat
    and sorted (as every partial weight stores them).

    >>> rectangle([1, 3, 5], (3, 2))  # column 1 of a 3 x 2 kernel
    (None, array([1]))
    >>> rectangle([0, 3], (2, 2)) is None  # a diagonal is not one
    True
    """
    positions = np.asarray(positions, dtype=np.int64)
    shape = tuple(int(d) for d in shape)
    if positions.size == 0 or np.any(np.diff(positions) <= 0):
        return None
    mask = np.zeros(int(np.prod(shape)), bool)
    mask[positions] = True
    mask = mask.reshape(shape)
    sets = []
    for axis in range(len(shape)):
        others = tuple(a for a in range(len(shape)) if a != axis)
        sets.append(np.flatnonzero(mask.any(axis=others)))
    if positions.size != int(np.prod([len(s) for s in sets])):
        return None
    if not mask[np.ix_(*sets)].all():
        return None
    return tuple(None if len(s) == d else s for s, d in zip(sets, shape))


def kernel_axes(equation: str):
    """For an ``EinsumDense`` equation, where each kernel axis goes, or ``None``.

    ``("in", axis)``: the axis of the input it contracts with; ``("out",
    axis)``: the axis of the output it becomes. ``None`` for an equation this
    form does not take (a kernel axis that is also a batch axis, or one
    before an ellipsis).

    >>> kernel_axes("abc,cde->abde")
    (('in', -1), ('out', -2), ('out', -1))
    """
    inputs, _, output = equation.replace(" ", "").partition("->")
    x_spec, _, kernel_spec = inputs.partition(",")
    axes = []
    for letter in kernel_spec:
        in_x, in_y = letter in x_spec, letter in output
        if in_x == in_y:
            return None
        spec = x_spec if in_x else output
        tail = spec.split("...")[-1]
        if letter not in tail:
            return None
        axes.append(("in" if in_x else "out", tail.index(letter) - len(tail)))
    return tuple(axes)


def layer_axes(layer, target: str = "kernel"):
    """Where each kernel axis of ``layer`` goes, or ``None``: no slices form.

    ``("in", axis)`` and ``("out", axis)`` as in :func:`kernel_axes`;
    ``("whole", None)``: an axis the mask must cover whole (a convolution's
    window, an embedding's features); ``("ids", None)``: an embedding table's
    rows, looked up by the input. A ``Dense`` kernel contracts its first axis
    with the input's last and gives the output's last; an ``EinsumDense``
    kernel follows its equation; a convolution's ``[*window, in, out]``
    contracts and gives the channel axis.
    """
    plain = getattr(layer, "_partial_plain_class", lambda: type(layer))()
    # A subclass with a call of its own computes in its own way.
    if target == "embeddings":
        if plain.call is keras.layers.Embedding.call:
            return (("ids", None), ("whole", None))
        return None
    if target != "kernel":
        return None
    if plain.call is keras.layers.EinsumDense.call:
        return kernel_axes(layer.equation)
    if plain.call is keras.layers.Dense.call:
        return (("in", -1), ("out", -1))
    convolutions = (keras.layers.Conv1D.call, keras.layers.Conv2D.call)
    if plain.call in convolutions and getattr(layer, "groups", 1) == 1:
        channel = -1 if layer.data_format == "channels_last" else 1
        return (("whole", None),) * layer.rank + (("in", channel), ("out", channel))
    return None


def is_product(axes) -> bool:
    """Whether ``axes`` (:func:`layer_axes`) describe a product linear in the kernel."""
    return axes is not None and all(side != "ids" for side, _ in axes)


def is_matrix_product(axes) -> bool:
    """Whether every kernel axis is contracted or kept (``Dense``, ``EinsumDense``)."""
    return axes is not None and all(side in ("in", "out") for side, _ in axes)


def check(layer, positions, shape, target: str = "kernel") -> None:
    """Refuse the slices form for ``layer`` or for ``positions``, clearly.

    Raises:
        ValueError: for a layer without the product, or positions that are
            not whole slices of it.
    """
    axes = layer_axes(layer, target)
    if axes is None:
        equation = getattr(layer, "equation", None)
        raise ValueError(
            "`mode` 'slices' multiplies by whole slices of a Dense, "
            "EinsumDense or convolution (groups=1) kernel, or looks up whole "
            "rows of an Embedding table. Received: mode='slices' for layer "
            f"{layer.name!r} of type {type(layer).__name__}"
            + (f" with equation {equation!r}" if equation else "")
            + (
                f" and groups={layer.groups}"
                if getattr(layer, "groups", 1) != 1
                else ""
            )
            + ("" if target in ("kernel", "embeddings") else f", weight {target!r}")
        )
    if positions is None:
        return
    sets = rectangle(positions, shape)
    if sets is None:
        raise ValueError(
            "`mode` 'slices' needs a mask of whole slices: every combination "
            "of a set of indices per axis (whole rows, whole columns, a "
            f"block). Received: {len(positions)} free entries of layer "
            f"{layer.name!r} ({shape}) that are not one"
        )
    partial = [
        a
        for a, ((side, _), s) in enumerate(zip(axes, sets))
        if side == "whole" and s is not None
    ]
    if partial:
        what = (
            "whole rows of the embedding table (every feature of a token)"
            if target == "embeddings"
            else "slices over the whole kernel window (every spatial tap)"
        )
        raise ValueError(
            f"`mode` 'slices' needs {what}. Received: free entries of layer "
            f"{layer.name!r} ({shape}) that cover only some indices of kernel "
            f"axis {partial[0]}"
        )


def _gather(tensor, sets, axes=None):
    for axis, chosen in enumerate(sets):
        if chosen is None:
            continue
        if axes is not None:
            side, where = axes[axis]
            if side != "in":
                continue
            axis = where
        tensor = keras.ops.take(tensor, keras.ops.convert_to_tensor(chosen), axis=axis)
    return tensor


def _expand(tensor, chosen, size, axis):
    """``tensor`` (``axis`` of ``len(chosen)``) written at ``chosen`` of ``size``."""
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    spread = np.zeros((len(chosen), size), dtype)
    spread[np.arange(len(chosen)), chosen] = 1
    moved = keras.ops.moveaxis(tensor, axis, -1)
    return keras.ops.moveaxis(keras.ops.matmul(moved, spread), -1, axis)


def slice_product(x, base, free, sets, axes, product):
    """``product(x, W)`` for ``W`` = ``base`` with ``free`` in the rectangle ``sets``.

    Args:
        x: the input.
        base: the frozen kernel.
        free: the free values, flat, in the rectangle's row-major order.
        sets: :func:`rectangle` of the positions.
        axes: where each kernel axis goes (:func:`kernel_axes`).
        product: ``(x, kernel) -> y``, linear in the kernel.
    """
    shape = [d if s is None else len(s) for s, d in zip(sets, base.shape)]
    delta = keras.ops.reshape(free, shape) - _gather(base, sets)
    partial = product(_gather(x, sets, axes), delta)
    for axis, chosen in enumerate(sets):
        side, where = axes[axis]
        if chosen is not None and side == "out":
            partial = _expand(partial, chosen, int(base.shape[axis]), where)
    return product(x, base) + partial


def row_lookup(ids, base, free, rows):
    """``take(W, ids)`` for ``W`` = ``base`` with ``free`` in whole ``rows``.

    The rows of ``free`` are looked up themselves, so the output is the
    composed table's lookup bit for bit, and the table is never composed.
    ``rows`` is :func:`rectangle`'s first set (``None``: every row).
    """
    dim = int(base.shape[-1])
    if rows is None:
        return keras.ops.take(keras.ops.reshape(free, base.shape), ids, axis=0)
    slot = np.full(int(base.shape[0]), -1, "int32")
    slot[rows] = np.arange(len(rows), dtype="int32")
    slots = keras.ops.take(keras.ops.convert_to_tensor(slot), ids, axis=0)
    chosen = keras.ops.take(
        keras.ops.reshape(free, (len(rows), dim)), keras.ops.maximum(slots, 0), axis=0
    )
    plain = keras.ops.take(base, ids, axis=0)
    return keras.ops.where(keras.ops.expand_dims(slots >= 0, -1), chosen, plain)
