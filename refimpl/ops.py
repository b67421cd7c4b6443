"""The tensor operations of a partial weight: compose it, multiply by it, pick a form.

A partial weight is a frozen ``base`` with ``k`` free values at flat
``positions``. Everything that holds one
(:class:`refimpl.PartialVariable <refimpl.variable.PartialVariable>`,
the partial layers of :mod:`refimpl.layers`) builds it with the one
:func:`compose`, multiplies by it with :func:`sparse_matmul` in the
``"sparse"`` form, and picks its form with :func:`choose_mode`
(see :ref:`the forms <api-forms>`).

Everything is ``keras.ops``, so it runs on every Keras backend.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import backend
from refimpl.masks import _describe, _normalize_shape, to_mask

__all__ = [
    "SELECT_ABOVE_DENSITY",
    "SPARSE_BELOW_DENSITY",
    "SPARSE_BELOW_DENSITY_XLA",
    "choose_mode",
    "compose",
    "sparse_matmul",
    "xla_enabled",
]

#: Density (fraction of free entries) from which ``"select"`` is chosen.
#: Measured without XLA for one training step (forward, gradient, Adam update),
#: batch 64, n = 4096, on a 2-core CPU: the delta step grows with the number of
#: free values, and was behind the select step at 15% free but not at 10% (the
#: book's benchmark chapter). Under XLA the delta stayed ahead at every density
#: measured, but the switch is the same: see :func:`choose_mode`.
SELECT_ABOVE_DENSITY = 0.125

#: Density below which the sparse product is chosen for a matrix, without
#: XLA: its three ``[k, batch]`` temporaries (64·k values each) together reach
#: one n x n matrix at about 0.5% with a batch of 64 (the book's benchmark
#: chapter).
SPARSE_BELOW_DENSITY = 0.005

#: The same threshold when XLA compiles the step (``jit_compile=True``, and
#: always under JAX): XLA's scatter-add on the CPU is slower, and the sparse
#: and delta steps cross near 0.3%.
SPARSE_BELOW_DENSITY_XLA = 0.003

#: The forms of a partial weight, and ``"auto"``, which picks one.
_MODES = ("delta", "sparse", "select", "auto")

#: The forms of a partial layer's weight, those of :data:`_MODES` and
#: ``"slices"`` (see :ref:`the forms <api-forms>`).
_LAYER_MODES = ("delta", "sparse", "select", "slices", "auto")


def _check_mode(mode, *, allowed=_MODES, name: str = "mode") -> str:
    """Return ``mode`` if it is one of ``allowed``; raise a clear error otherwise."""
    if not isinstance(mode, str):
        raise TypeError(
            f"`{name}` must be one of {allowed}. Received: {name}={_describe(mode)}"
        )
    if mode not in allowed:
        raise ValueError(
            f"`{name}` must be one of {allowed}. Received: {name}={_describe(mode)}"
        )
    return mode


def compose(base, positions, free, *, mode: str = "delta", mask=None):
    """Return ``base`` with the free values written in: the one composition.

    Args:
        base: the dense tensor of fixed values.
        positions: where the free values go. Static (NumPy, a list): a 1-D
            list of flat row-major positions, an index list of shape
            ``[k, rank]``, or a boolean mask (row-major order); checked. A
            backend tensor or variable: flat positions, used as they are
            (what layers pass inside a step).
        free: for ``"delta"``, the ``k`` free values in the order of
            ``positions``, of ``base``'s dtype (cast only when ``positions`` is a
            backend tensor); for ``"select"``, a
            tensor of ``base``'s shape whose entries at ``positions`` are used.
        mode: ``"delta"`` (a scatter) or ``"select"`` (``where``).
        mask: for ``"select"``, the boolean mask of ``positions``, so that it
            is not scattered again from them: a tensor inside a step, used as
            it is, or a static mask or index list, checked.

    Returns:
        A tensor of ``base``'s shape and dtype, with the free values at their
        positions and ``base``'s values everywhere else, bit for bit.

    Raises:
        ValueError: for an unknown mode, bad positions, or a ``free`` of the
            wrong shape.
        TypeError: for static positions and a ``free`` of another dtype.

    >>> from refimpl.ops import compose
    >>> base = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    >>> keras.ops.convert_to_numpy(compose(base, [[0, 1]], np.float32([9.0])))
    array([[1., 9.],
           [3., 4.]], dtype=float32)
    >>> keras.ops.convert_to_numpy(compose(base, [3], np.float32([0.0])))
    array([[1., 2.],
           [3., 0.]], dtype=float32)
    """
    _check_mode(mode, allowed=("delta", "select"))
    base = keras.ops.convert_to_tensor(base)
    shape = tuple(base.shape)
    if not (keras.ops.is_tensor(positions) or backend.is_variable(positions)):
        # The dtype it came with: JAX without x64 would turn float64 into float32.
        given = getattr(free, "dtype", None)
        free = keras.ops.convert_to_tensor(free)
        positions = _flat_positions(positions, shape, name="positions")
        expected = (len(positions),) if mode == "delta" else shape
        if tuple(keras.ops.shape(free)) != expected:
            raise ValueError(
                f'With mode="{mode}", `free` must have shape {expected}. '
                f"Received: free.shape={tuple(keras.ops.shape(free))}"
            )
        positions = keras.ops.convert_to_tensor(positions, _index_dtype(shape))
        free = keras.ops.convert_to_tensor(free)
        dtypes = [keras.backend.standardize_dtype(t.dtype) for t in (base, free)]
        if given is not None:
            dtypes[1] = keras.backend.standardize_dtype(given)
        if dtypes[0] != dtypes[1]:
            raise TypeError(
                f"`free` must have the base's dtype {dtypes[0]}. "
                f"Received: free.dtype={dtypes[1]}"
            )
    free = keras.ops.cast(free, base.dtype)
    if mode == "select":
        if mask is None:
            mask = _scattered_mask(positions, shape)
        elif not (keras.ops.is_tensor(mask) or backend.is_variable(mask)):
            mask = to_mask(mask, shape, name="mask")
        return keras.ops.where(mask, free, base)
    flat = keras.ops.reshape(base, (-1,))
    index = keras.ops.expand_dims(positions, -1)
    return keras.ops.reshape(keras.ops.scatter_update(flat, index, free), shape)


def _flat_positions(positions, shape, *, name: str = "positions") -> np.ndarray:
    """Validate static positions (flat, index list or mask); return flat ones."""
    shape = _normalize_shape(shape, name=f"{name} shape")
    array = np.asarray(keras.ops.convert_to_numpy(positions))
    if array.ndim == 1 and array.size and np.issubdtype(array.dtype, np.integer):
        size = int(np.prod(shape))
        if len(shape) != 1:
            if array.min() < 0 or array.max() >= size:
                raise ValueError(
                    f"`{name}` holds flat positions, which must lie in [0, "
                    f"{size}) for a tensor of shape {shape}. Received: "
                    f"{name}={_describe(array)}"
                )
            if len(np.unique(array)) != len(array):
                raise ValueError(f"`{name}` names a position twice: {_describe(array)}")
            return array.astype(np.int64)
        array = array.reshape(-1, 1)
    mask = to_mask(array, shape, name=name, indices_expected=True)
    if array.size and np.issubdtype(array.dtype, np.integer):
        return np.ravel_multi_index(tuple(array.T), shape).astype(np.int64)
    return np.flatnonzero(mask)


def _initializer(array, fill=0):
    """A Keras initializer that gives ``array`` (``fill`` everywhere for ``None``)."""
    if array is None:
        return keras.initializers.Constant(fill)
    return lambda shape, dtype=None: keras.ops.cast(np.asarray(array), dtype)


def _index_dtype(shape) -> str:
    """``int32`` positions where they fit, ``int64`` above 2**31 entries."""
    return "int32" if int(np.prod(shape)) < 2**31 else "int64"


def _scattered_mask(positions, shape):
    """The boolean mask of flat ``positions``, built in the graph."""
    size = int(np.prod(shape))
    ones = keras.ops.ones(tuple(positions.shape), "int32")
    flat = keras.ops.scatter(keras.ops.expand_dims(positions, -1), ones, (size,))
    return keras.ops.reshape(keras.ops.greater(flat, 0), shape)


def sparse_matmul(x, base, positions, free):
    """``x @ W`` for ``W`` = ``base`` with ``free[i]`` at flat ``positions[i]``.

    ``x @ S`` is a gather of the ``k`` needed rows of ``xᵀ``, a product by
    the differences ``free - base[positions]`` and a scatter-add into the
    output columns: O(batch·k), with no n² temporary. The free values' gradient
    is exact, computed only at the ``k`` free positions (no dense n×n gradient).

    Args:
        x: the input, of any rank, its last axis the matrix's rows.
        base: the dense ``[rows, columns]`` matrix of fixed values.
        positions: where the free values go. Static (NumPy, a list): flat
            row-major positions, an index list of shape ``[k, 2]`` or a
            boolean mask, checked as :func:`compose` checks them. A backend
            tensor or variable: flat positions, used as they are (what layers
            pass inside a step).
        free: the ``k`` free values, in the order of ``positions``.

    Returns:
        A tensor of the shape of ``x @ W`` (for any rank of ``x``, a 1-D ``x``
        included), in ``x``'s dtype.

    Raises:
        ValueError: for a ``base`` that is not a matrix, an ``x`` whose last
            axis does not match it, bad static positions, or a ``free`` whose
            length is not their number.

    >>> from refimpl.ops import sparse_matmul
    >>> base = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    >>> x = np.array([[1.0, 1.0]], "float32")
    >>> y = sparse_matmul(x, base, np.array([1], "int32"), np.float32([9.0]))
    >>> keras.ops.convert_to_numpy(y)  # x @ [[1, 9], [3, 4]]
    array([[ 4., 13.]], dtype=float32)
    """
    base, free = keras.ops.convert_to_tensor(base), keras.ops.convert_to_tensor(free)
    if len(base.shape) != 2:
        raise ValueError(
            f"`base` must be a matrix. Received: base.shape={tuple(base.shape)}"
        )
    n_in, n_out = (int(d) for d in base.shape)
    if not (keras.ops.is_tensor(positions) or backend.is_variable(positions)):
        positions = _flat_positions(positions, (n_in, n_out), name="positions")
        if len(keras.ops.shape(free)) != 1 or keras.ops.shape(free)[0] != len(
            positions
        ):
            raise ValueError(
                f"`free` must hold one value per position, shape "
                f"({len(positions)},). Received: free.shape="
                f"{tuple(keras.ops.shape(free))}"
            )
        positions = keras.ops.convert_to_tensor(positions, _index_dtype(base.shape))
    x = keras.ops.convert_to_tensor(x)
    if not x.shape or x.shape[-1] not in (None, n_in):
        raise ValueError(
            f"`x` must end in an axis of size {n_in} (the matrix's rows). "
            f"Received: x.shape={tuple(x.shape)}"
        )
    lead = tuple(x.shape[:-1])
    flat_x = keras.ops.reshape(x, (-1, n_in))
    dtype = flat_x.dtype
    base = keras.ops.cast(base, dtype)
    free = keras.ops.cast(free, dtype)
    positions = keras.ops.convert_to_tensor(positions)
    delta = free - keras.ops.take(keras.ops.reshape(base, (-1,)), positions)
    rows = keras.ops.floor_divide(positions, n_out)
    cols = positions - rows * n_out
    picked = keras.ops.take(keras.ops.transpose(flat_x), rows, axis=0)
    added = keras.ops.segment_sum(
        picked * keras.ops.expand_dims(delta, -1), cols, num_segments=n_out
    )
    y = keras.ops.matmul(flat_x, base) + keras.ops.transpose(added)
    if len(lead) == 1:
        return y
    if not lead:  # a single input vector: a single output vector
        return keras.ops.reshape(y, (n_out,))
    return keras.ops.reshape(y, (-1, *lead[1:], n_out))


def xla_enabled() -> bool:
    """Whether the code being traced is compiled by XLA.

    Always under JAX, never under PyTorch; under TensorFlow, inside a function
    with ``jit_compile=True``. Keras traces a layer's ``call`` inside the
    compiled step, so a layer of your own can pick its product there:

    >>> from refimpl.ops import compose, sparse_matmul, xla_enabled
    >>> class Product(keras.layers.Layer):  # x @ W: W[0, 0], W[2, 1] trainable
    ...     def build(self, input_shape):
    ...         self.free = self.add_weight(shape=(2,), initializer="ones")
    ...
    ...     def call(self, x):
    ...         base, at = np.zeros((3, 2), "float32"), keras.ops.array([0, 5])
    ...         if xla_enabled():  # XLA: compose the kernel, one matmul
    ...             return x @ compose(base, at, self.free)
    ...         return sparse_matmul(x, base, at, self.free)
    >>> model = keras.Sequential([keras.Input((3,)), Product()])
    >>> model.predict(np.array([[1.0, 2.0, 3.0]]), verbose=0)
    array([[1., 3.]], dtype=float32)

    Returns:
        A Python ``bool``.
    """
    return backend.in_xla_context()


def choose_mode(mask, *, jit_compile: bool = False) -> str:
    """Return the exact form for ``mask`` by its density: sparse, delta or select.

    By the fraction of free entries (the density): ``"sparse"`` below
    :data:`SPARSE_BELOW_DENSITY` (:data:`SPARSE_BELOW_DENSITY_XLA` with
    ``jit_compile=True``) for a matrix; ``"select"`` from
    :data:`SELECT_ABOVE_DENSITY` on; ``"delta"`` in between. Under XLA the
    delta measured faster than the select at every density, so with
    ``jit_compile=True`` and that many free entries, build with
    ``mode="delta"`` (the book's benchmark chapter).

    Args:
        mask: a boolean or 0.0/1.0 mask (``True`` = free); not an index list,
            whose density depends on a shape it does not give.
        jit_compile: whether the step is compiled by XLA.

    Returns:
        The form, a ``str`` (``"sparse"``, ``"delta"`` or ``"select"``).

    >>> from refimpl.ops import choose_mode
    >>> choose_mode(np.eye(10, dtype=bool))  # 10% free
    'delta'
    >>> choose_mode(np.eye(1000, dtype=bool))  # 0.1% free
    'sparse'
    >>> choose_mode(np.ones((4, 4), dtype=bool))
    'select'
    """
    if not isinstance(jit_compile, (bool, np.bool_)):
        raise TypeError(
            "`jit_compile` must be a bool. Received: "
            f"jit_compile={_describe(jit_compile)}"
        )
    array = np.asarray(keras.ops.convert_to_numpy(mask))
    if array.dtype != bool and not np.issubdtype(array.dtype, np.floating):
        raise TypeError(
            "`mask` must be a boolean (or 0.0/1.0) mask, so that its density is "
            f"known. Received: mask={_describe(array)}"
        )
    array = to_mask(array, array.shape)
    return _mode_for(int(array.sum()), array.shape, jit_compile=bool(jit_compile))


def _mode_for(num_free: int, shape, *, jit_compile: bool) -> str:
    """:func:`choose_mode` from a count and a shape."""
    size = int(np.prod(shape))
    density = num_free / size if size else 0.0
    if density >= SELECT_ABOVE_DENSITY:
        return "select"
    below = SPARSE_BELOW_DENSITY_XLA if jit_compile else SPARSE_BELOW_DENSITY
    return "sparse" if len(shape) == 2 and density < below else "delta"


class _SelectMask:
    """The select form's mask, from a positions variable, cheap inside a step.

    The mask of the positions the variable holds when the step is traced is a
    constant, with an O(k) check in every step that they still hold them;
    only if they do not (weights reloaded into a traced step) is it scattered
    again from the positions, in the graph. (A scatter of k entries into n²
    costs more than the rest of the select form.)
    """

    def __init__(self, shape):
        self._shape = tuple(shape)
        self._cache = None

    def __call__(self, positions_variable):
        positions = positions_variable.value
        known = backend.try_read_now(positions_variable)
        if known is None:  # JAX inside `fit`: the positions are traced state
            if self._cache is None:
                return _scattered_mask(positions, self._shape)
            known = self._cache[0]  # still checked against them below
        if self._cache is None or not np.array_equal(self._cache[0], known):
            mask = np.zeros(int(np.prod(self._shape)), bool)
            mask[known] = True
            self._cache = (known, mask.reshape(self._shape))
        known, mask = self._cache
        same = keras.ops.all(
            keras.ops.equal(positions, keras.ops.convert_to_tensor(known))
        )
        return keras.ops.cond(
            same,
            lambda: backend.bool_constant(mask),
            lambda: _scattered_mask(positions, self._shape),
        )


# -- the "slices" form ---------------------------------------------------------
# The ``"slices"`` form: a mask of whole slices, trained through dense sub-products.
#
# A mask is a *rectangle* when its free entries are every combination of a set
# of indices per axis: whole rows, whole columns, a block of rows × columns
# (for a ``Dense`` kernel ``[in, out]``, rows are input features and columns
# are units; for a query kernel ``[in, heads, head_size]``, whole heads are a
# rectangle too). Then, with ``Δ`` the free values' differences from the base
# (a small dense array of the rectangle's shape),
#
#     x @ W = x @ base + expand(take(x, rows) @ Δ, columns)
#
# so the product never composes ``W`` nor keeps it for the backward pass, and
# the free values' gradient is a dense product of the rectangle's size:
# ``take(x, rows)ᵀ g[..., columns]``, about ``rows / in`` of the full one. The
# frozen base is only read; before training ``Δ`` is exactly zero and the
# output is the plain layer's bit for bit.
#
# The same holds for a convolution (``groups=1``): whole filters (output
# channels) or whole input channels, each over the full kernel window, train
# through a convolution of the chosen channels. An ``Embedding`` table free in
# whole rows (new or chosen tokens) looks its rows up in the free values
# themselves, exactly the composed table's lookup, and never composes the
# ``vocabulary x dim`` table.
#
# The free values are stored as in ``"delta"`` (the same weights and files):
# sorted flat positions, so ``free.reshape(rectangle shape)`` is
# ``W[np.ix_(*sets)]``.


def _rectangle(positions, shape):
    """The index set of each axis if ``positions`` fill a rectangle, else ``None``.

    An axis the rectangle covers whole gets ``None``. ``positions`` are flat
    and sorted (as every partial weight stores them).

    >>> _rectangle([1, 3, 5], (3, 2))  # column 1 of a 3 x 2 kernel
    (None, array([1]))
    >>> _rectangle([0, 3], (2, 2)) is None  # a diagonal is not one
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


def _kernel_axes(equation: str):
    """For an ``EinsumDense`` equation, where each kernel axis goes, or ``None``.

    ``("in", axis)``: the axis of the input it contracts with; ``("out",
    axis)``: the axis of the output it becomes. ``None`` for an equation this
    form does not take (a kernel axis that is also a batch axis, or one
    before an ellipsis).

    >>> _kernel_axes("abc,cde->abde")
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


def _layer_axes(layer, target: str = "kernel"):
    """Where each kernel axis of ``layer`` goes, or ``None``: no slices form.

    ``("in", axis)`` and ``("out", axis)`` as in :func:`_kernel_axes`;
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
        return _kernel_axes(layer.equation)
    if plain.call is keras.layers.Dense.call:
        return (("in", -1), ("out", -1))
    convolutions = (keras.layers.Conv1D.call, keras.layers.Conv2D.call)
    if plain.call in convolutions and getattr(layer, "groups", 1) == 1:
        channel = -1 if layer.data_format == "channels_last" else 1
        return (("whole", None),) * layer.rank + (("in", channel), ("out", channel))
    return None


def _is_product(axes) -> bool:
    """Whether ``axes`` (:func:`_layer_axes`) describe a product linear in W."""
    return axes is not None and all(side != "ids" for side, _ in axes)


def _is_matrix_product(axes) -> bool:
    """Whether every kernel axis is contracted or kept (``Dense``, ``EinsumDense``)."""
    return axes is not None and all(side in ("in", "out") for side, _ in axes)


def _check_slices(layer, positions, shape, target: str = "kernel") -> None:
    """Refuse the slices form for ``layer`` or for ``positions``, clearly.

    Raises:
        ValueError: for a layer without the product, or positions that are
            not whole slices of it.
    """
    axes = _layer_axes(layer, target)
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
    sets = _rectangle(positions, shape)
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


def _slice_product(x, base, free, sets, axes, product):
    """``product(x, W)`` for ``W`` = ``base`` with ``free`` in the rectangle ``sets``.

    Args:
        x: the input.
        base: the frozen kernel.
        free: the free values, flat, in the rectangle's row-major order.
        sets: :func:`rectangle` of the positions.
        axes: where each kernel axis goes (:func:`_kernel_axes`).
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


def _row_lookup(ids, base, free, rows):
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
