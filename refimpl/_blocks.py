"""Block matrices built from their blocks, and their product that skips zero blocks.

Re-exported by :mod:`refimpl.structured` (``block``, ``block_matmul``); the
grid checks are shared with
:class:`refimpl.BlockDense <refimpl.layers.block.BlockDense>`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from refimpl._checks import describe
from refimpl._tensors import _batch, _dtype, _is_array, _tensor, split_last


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
    pieces = split_last(x, heights)
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
    check_rectangular(rows, "rows")
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
    heights, widths = block_sizes(shapes, "rows")
    return grid, heights, widths, dtype


def check_rectangular(rows, name: str) -> None:
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
            f"Received: {name}={describe(rows)}"
        )
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError(
            f"`{name}` must be a non-empty list of non-empty lists of blocks. "
            f"Received: {name}={describe(rows)}"
        )
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError(
            f"`{name}` must be a rectangular grid; every block row needs the same "
            f"number of blocks. Received row lengths {[len(r) for r in rows]}"
        )


def block_sizes(shapes, name: str, heights=None, widths=None, *, size_names=None):
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
