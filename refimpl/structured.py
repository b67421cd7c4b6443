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

import numpy as np
from keras import ops

from refimpl._blocks import block, block_matmul
from refimpl._checks import describe
from refimpl._tensors import _batch, _dtype, _is_array, _vector

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
            f"`offsets` must be a list of ints. Received: {describe(offsets)}"
        )
    offsets = list(offsets)
    if _is_array(diagonals) or not isinstance(diagonals, Sequence):
        raise TypeError(
            "`diagonals` must be a list of 1-D tensors, one per offset. "
            f"Received: diagonals={describe(diagonals)}"
        )
    if not offsets or len(offsets) != len(diagonals):
        raise ValueError(
            "`diagonals` and `offsets` must be non-empty lists of the same "
            f"length. Received {len(diagonals)} diagonals and offsets={offsets}"
        )
    for k in offsets:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"`offsets` must be ints. Received: offsets={offsets}")
    offsets = [int(k) for k in offsets]
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
