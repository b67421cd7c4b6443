"""Build structured matrices from their free values, and multiply by them cheaply.

Every builder here takes only the values that define the matrix (a diagonal, a
few diagonals, a grid of blocks) and returns the dense tensor,
built in the forward pass. Make the defining values variables and the
optimizer sees nothing else: fixed values are constants, never optimizer
state, so no optimizer can move them. Everything here is ``keras.ops``, so it
runs on every Keras backend and returns that backend's tensors.

Matrices act on a batch from the right, like a Dense kernel: ``y = x @ W``
with ``x`` of shape ``[batch, n]``. Each builder has a product that gives the
same ``y`` without building ``W``: ``x * w`` for a diagonal (O(n) per row
instead of O(n^2)), shifted elementwise products for a band (O(n*b)), and
split matmuls that skip zero blocks for a block matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from refimpl import backend
from refimpl.masks import _check_int, _describe

__all__ = [
    "banded",
    "banded_matmul",
    "block",
    "block_matmul",
    "diagonal",
    "diagonal_matmul",
]


def diagonal(w):
    """Return the ``[n, n]`` matrix with ``w`` on its diagonal and zeros elsewhere.

    Args:
        w: a 1-D tensor or variable of length ``n``.

    Returns:
        ``keras.ops.diag(w)``.

    Raises:
        ValueError: if ``w`` is not 1-D.

    >>> import keras
    >>> from refimpl.structured import diagonal
    >>> keras.ops.convert_to_numpy(diagonal([1.0, 2.0]))
    array([[1., 0.],
           [0., 2.]], dtype=float32)
    """
    w = _vector(w, "w")
    return ops.diag(w)


def diagonal_matmul(x, w):
    """Return ``x @ diagonal(w)``, computed as ``x * w`` in O(n) per row.

    Args:
        x: a tensor of shape ``[..., n]``.
        w: a 1-D tensor or variable of length ``n``.

    Returns:
        A tensor of the shape of ``x``.

    Raises:
        ValueError: if ``w`` is not 1-D or ``x`` does not end in ``n``.
        TypeError: if the dtypes differ.

    >>> import keras
    >>> from refimpl.structured import diagonal_matmul
    >>> keras.ops.convert_to_numpy(diagonal_matmul([[1.0, 1.0]], [2.0, 3.0]))
    array([[2., 3.]], dtype=float32)
    """
    w = _vector(w, "w")
    x = _batch(x, w.shape[0], w.dtype)
    return x * w


def banded(diagonals: Sequence, offsets: Sequence[int]):
    """Return the square matrix with the given diagonals and zeros elsewhere.

    The diagonal at offset ``k`` (0 main, ``k > 0`` above, ``k < 0`` below)
    has length ``n - |k|`` and is read from the top-left, as ``np.diag(A, k)``
    returns it. A fixed diagonal is simply a constant entry of ``diagonals``.

    Args:
        diagonals: a list of 1-D tensors, variables or arrays, one per offset.
        offsets: a list of distinct ints, as long as ``diagonals``.

    Returns:
        The ``[n, n]`` dense matrix.

    Raises:
        ValueError: for empty lists or lists of different lengths, offsets
            that repeat, a diagonal that is not 1-D, or lengths that do not
            fit one ``n``.
        TypeError: for ``offsets`` that are not a list of ints, ``diagonals``
            that are not a list of floating-point vectors, or diagonals of
            different dtypes.

    >>> import keras
    >>> from refimpl.structured import banded
    >>> keras.ops.convert_to_numpy(banded([np.ones(3, "float32"), [2.0, 3.0]], [0, 1]))
    array([[1., 2., 0.],
           [0., 1., 3.],
           [0., 0., 1.]], dtype=float32)
    """
    diagonals, offsets, n = _band(diagonals, offsets)
    # One scatter of every diagonal's values to its positions: entry i of the
    # diagonal at offset k sits at (i, i + k) above the main diagonal and at
    # (i - k, i) below it.
    rows, cols = [], []
    for k in offsets:
        i = np.arange(n - abs(k))
        rows.append(i if k >= 0 else i - k)
        cols.append(i + k if k >= 0 else i)
    indices = np.stack([np.concatenate(rows), np.concatenate(cols)], axis=-1)
    values = ops.concatenate(diagonals, axis=0) if len(diagonals) > 1 else diagonals[0]
    # An update, not an add into zeros: a fixed -0.0 keeps its sign bit.
    zeros = ops.zeros((n, n), _dtype(values))
    return ops.scatter_update(zeros, indices.astype("int32"), values)


def banded_matmul(x, diagonals: Sequence, offsets: Sequence[int]):
    """Return ``x @ banded(diagonals, offsets)`` by shifted elementwise products.

    Column ``j`` of the result collects ``x[..., j - k] * A[j - k, j]`` over
    the offsets ``k``, so each diagonal costs one elementwise product of
    length ``n - |k|``: O(n*b) per row for ``b`` diagonals, never O(n^2).

    Args:
        x: a tensor of shape ``[..., n]``.
        diagonals: as for :func:`banded`.
        offsets: as for :func:`banded`.

    Returns:
        A tensor of the shape of ``x``.

    Raises:
        TypeError: as for :func:`banded`, or for an ``x`` of another dtype
            than the diagonals.
        ValueError: as for :func:`banded`, or for an ``x`` whose last axis is
            not ``n``.

    >>> import keras
    >>> from refimpl.structured import banded_matmul
    >>> x = [[1.0, 10.0, 100.0]]
    >>> diagonals = [np.ones(3, "float32"), [2.0, 3.0]]
    >>> keras.ops.convert_to_numpy(banded_matmul(x, diagonals, [0, 1]))
    array([[  1.,  12., 130.]], dtype=float32)
    """
    diagonals, offsets, n = _band(diagonals, offsets)
    x = _batch(x, n, diagonals[0].dtype)
    rank = len(x.shape)
    terms = []
    for d, k in zip(diagonals, offsets, strict=True):
        m = abs(k)
        if k >= 0:  # y[..., k:] += x[..., :n-k] * d
            part, pad = x[..., : n - m] * d, [m, 0]
        else:  # y[..., :n-m] += x[..., m:] * d
            part, pad = x[..., m:] * d, [0, m]
        terms.append(ops.pad(part, [[0, 0]] * (rank - 1) + [pad]) if m else part)
    return functools.reduce(ops.add, terms)


def _band(diagonals, offsets):
    if isinstance(offsets, (int, np.integer)) or not isinstance(
        offsets, (Sequence, np.ndarray)
    ):
        raise TypeError(
            f"`offsets` must be a list of ints. Received: {_describe(offsets)}"
        )
    offsets = list(offsets)
    if _is_array(diagonals) or not isinstance(diagonals, Sequence):
        raise TypeError(
            "`diagonals` must be a list of 1-D tensors, one per offset. "
            f"Received: diagonals={_describe(diagonals)}"
        )
    if not offsets or len(offsets) != len(diagonals):
        raise ValueError(
            "`diagonals` and `offsets` must be non-empty lists of the same "
            f"length. Received {len(diagonals)} diagonals and offsets={offsets}"
        )
    offsets = [_check_int(k, "offsets", minimum=None) for k in offsets]
    if len(set(offsets)) != len(offsets):
        raise ValueError(f"`offsets` must be distinct. Received: offsets={offsets}")
    tensors = [_vector(d, f"diagonals[{i}]") for i, d in enumerate(diagonals)]
    sizes = {t.shape[0] + abs(k) for t, k in zip(tensors, offsets, strict=True)}
    lengths = [int(t.shape[0]) for t in tensors]
    if len(sizes) != 1 or min(lengths) < 1:
        raise ValueError(
            "The lengths of `diagonals` fit no single n: the diagonal at offset "
            "k of an n x n matrix has length n - |k|, and every offset must "
            "satisfy |k| < n. "
            f"Received: offsets={offsets}, lengths={lengths}"
        )
    dtypes = {_dtype(t) for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(
            "`diagonals` must share one dtype. "
            f"Received: {[_dtype(t) for t in tensors]}"
        )
    return tensors, offsets, sizes.pop()


# -- block matrices -------------------------------------------------------------
def block(rows: Sequence[Sequence]):
    """Assemble a matrix from a grid of 2-D blocks, like ``np.block``.

    ``None`` stands for a zero block; its shape follows from the other blocks
    of its block row (height) and block column (width). Tensors and variables
    must share one dtype; NumPy arrays and lists are converted to it.

    Args:
        rows: a list of block rows, each a list of 2-D blocks or ``None``, all
            rows of the same length.

    Returns:
        The dense matrix, the concatenation of the rows of blocks.

    Raises:
        ValueError: for an empty or ragged grid, a block that is not 2-D,
            blocks whose heights or widths disagree, or a ``None`` block whose
            whole block row or block column is ``None``.
        TypeError: for a grid that is not a list of lists, or blocks of
            different dtypes.

    >>> import keras
    >>> from refimpl.structured import block
    >>> eye = np.eye(1, dtype="float32")
    >>> keras.ops.convert_to_numpy(block([[None, -0.2 * eye], [0.35 * eye, eye]]))
    array([[ 0.  , -0.2 ],
           [ 0.35,  1.  ]], dtype=float32)
    """
    grid, heights, widths, dtype = _grid(rows)
    out = []
    for i, row in enumerate(grid):
        parts = [
            ops.zeros((heights[i], widths[j]), dtype) if b is None else b
            for j, b in enumerate(row)
        ]
        out.append(ops.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
    return ops.concatenate(out, axis=0) if len(out) > 1 else out[0]


def block_matmul(x, rows: Sequence[Sequence]):
    """Return ``x @ block(rows)`` by split matmuls that skip the zero blocks.

    ``x`` is split along its last axis into pieces of the block-row heights;
    block column ``j`` of the result is the sum of ``x_i @ rows[i][j]`` over
    the blocks that are not ``None``. The concatenated matrix is never built.

    Args:
        x: a tensor of shape ``[batch, N]``, ``N`` the sum of the heights.
        rows: as for :func:`block`.

    Returns:
        A tensor of shape ``[batch, M]``, ``M`` the sum of the widths.

    Raises:
        TypeError: as for :func:`block`, or for an ``x`` of another dtype than
            the blocks.
        ValueError: as for :func:`block`, or for an ``x`` whose last axis is
            not the sum of the heights.

    >>> import keras
    >>> from refimpl.structured import block_matmul
    >>> eye = np.eye(1, dtype="float32")
    >>> rows = [[None, 2.0 * eye], [eye, None]]
    >>> keras.ops.convert_to_numpy(block_matmul([[1.0, 10.0]], rows))
    array([[10.,  2.]], dtype=float32)
    """
    grid, heights, widths, dtype = _grid(rows)
    x = _batch(x, sum(heights), dtype)
    pieces = _split_last(x, heights)
    columns = []
    for j, width in enumerate(widths):
        terms = [
            ops.matmul(pieces[i], grid[i][j])
            for i in range(len(heights))
            if grid[i][j] is not None
        ]
        if terms:
            columns.append(functools.reduce(ops.add, terms))
        else:  # a block column of zeros, as wide as the blocks say
            columns.append(ops.repeat(ops.zeros_like(x[..., :1]), width, axis=-1))
    return ops.concatenate(columns, axis=-1) if len(columns) > 1 else columns[0]


def _grid(rows):
    _check_rectangular(rows, "rows")
    tensor_dtypes = {
        keras.backend.standardize_dtype(b.dtype)
        for r in rows
        for b in r
        if hasattr(b, "dtype") and not isinstance(b, (np.ndarray, np.generic))
    }
    if len(tensor_dtypes) > 1:
        raise TypeError(
            "The blocks of `rows` must share one dtype. "
            f"Received: {sorted(tensor_dtypes)}"
        )
    dtype = tensor_dtypes.pop() if tensor_dtypes else None
    grid = []
    for i, r in enumerate(rows):
        grid.append([])
        for j, b in enumerate(r):
            if b is not None:
                b = _tensor(b) if hasattr(b, "dtype") else b
                if not hasattr(b, "dtype") or isinstance(b, (np.ndarray, np.generic)):
                    b = ops.convert_to_tensor(b, dtype=dtype)
                dtype = dtype or _dtype(b)
                shape = tuple(b.shape)
                if len(shape) != 2 or None in shape:
                    raise ValueError(
                        f"Every block of `rows` must be a 2-D tensor of known "
                        f"shape. Received: rows[{i}][{j}].shape={shape}"
                    )
            grid[-1].append(b)
    shapes = [[None if b is None else tuple(b.shape) for b in r] for r in grid]
    heights, widths = _block_sizes(shapes, "rows")
    return grid, heights, widths, dtype


def _check_rectangular(rows, name: str) -> None:
    """Check that ``rows`` is a non-empty, rectangular list of non-empty lists.

    Raises ``TypeError`` for something that is not a list of lists (an array,
    a string, a number) and ``ValueError`` for an empty or ragged grid.
    """
    if (
        _is_array(rows)
        or isinstance(rows, str)
        or not isinstance(rows, Sequence)
        or not all(isinstance(r, Sequence) and not isinstance(r, str) for r in rows)
    ):
        raise TypeError(
            f"`{name}` must be a list of lists of blocks (block rows). "
            f"Received: {name}={_describe(rows)}"
        )
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError(
            f"`{name}` must be a non-empty list of non-empty lists of blocks. "
            f"Received: {name}={_describe(rows)}"
        )
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(
            f"`{name}` must be a rectangular grid; every block row needs the same "
            f"number of blocks. Received row lengths {[len(r) for r in rows]}"
        )


def _block_sizes(shapes, name: str, heights=None, widths=None, *, size_names=None):
    """Infer and check the block-row heights and block-column widths of a grid.

    The one size check of every block grid in the package (:func:`block`,
    :func:`block_matmul` and ``BlockDense``).

    Args:
        shapes: the grid of block shapes, ``None`` where a block has no shape
            of its own (a zero block, or a block sized by the caller).
        name: the grid argument's name, used in error messages.
        heights, widths: sizes given by the caller (lists with ``None`` for
            unknown entries), checked against the blocks.
        size_names: the names of the arguments that give ``heights`` and
            ``widths``, if the caller has them: a size that no block tells is
            then asked of that argument.

    Returns:
        ``(heights, widths)``, lists of ints.
    """
    heights = list(heights or [None] * len(shapes))
    widths = list(widths or [None] * len(shapes[0]))
    for i, row in enumerate(shapes):
        for j, shape in enumerate(row):
            if shape is None:
                continue
            for sizes, k, axis, kind in (
                (heights, i, 0, "row"),
                (widths, j, 1, "column"),
            ):
                what = "height" if axis == 0 else "width"
                if sizes[k] is None:
                    sizes[k] = int(shape[axis])
                elif sizes[k] != shape[axis]:
                    raise ValueError(
                        f"The blocks of block {kind} {k} of `{name}` must share "
                        f"one {what}, {sizes[k]}. Received: "
                        f"{name}[{i}][{j}].shape={tuple(shape)}"
                    )
    for axis, (sizes, kind) in enumerate(((heights, "row"), (widths, "column"))):
        if None in sizes:
            what = "height" if kind == "row" else "width"
            if size_names is not None:
                given = size_names[axis]
                raise ValueError(
                    f"`{given}` must give the {what} of block {kind} "
                    f"{sizes.index(None)}: no block of `{name}` in it has a "
                    f"shape of its own. The {what}s known: {sizes}"
                )
            raise ValueError(
                f"Block {kind} {sizes.index(None)} of `{name}` has no block of a "
                f"known shape, so its {what} cannot be inferred; give one block of "
                "that shape (for example np.zeros(...)) or its size"
            )
    return heights, widths


# -- the tensor checks the builders share --------------------------------------
def _split_last(x, sizes: Sequence[int]) -> list:
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
            f"`{name}` must be a 1-D numeric tensor. "
            f"Received: {name}={_describe(value)}"
        ) from err
    if not (dtype.startswith(("float", "complex")) or dtype == "bfloat16"):
        raise TypeError(
            f"`{name}` must hold floating-point numbers. Received dtype "
            f"{dtype}: {name}={_describe(value)}"
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
