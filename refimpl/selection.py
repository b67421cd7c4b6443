"""Choosing which entries to train: seeded, deterministic masks.

Each mask function returns a boolean NumPy mask (``True`` = trainable) of the
weight's shape. The ones that pick a number of entries (:func:`random_mask` at
random, and the three that keep the highest scores: magnitude, Fisher, top-k)
take exactly one of ``k``, an int from 0 to the weight's size, and
``fraction``, a number from 0 to 1. Their mask has exactly ``k`` trainable
entries, or ``round(fraction * size)`` of them (Python's rounding, half to
even: ``round(2.5)`` is 2).
:func:`fisher_scores` returns the scores themselves:

* :func:`random_mask`: uniformly at random, from a seed;
* :func:`magnitude_mask`: the largest absolute values;
* :func:`fisher_mask` from :func:`fisher_scores`: the largest accumulated
  squared gradient over a few batches (the empirical Fisher information used
  by sparse fine-tuning methods such as the FISH mask of Sung, Nair and
  Raffel, "Training Neural Networks with Fixed Sparse Masks", NeurIPS 2021);
* :func:`top_k_mask`: the largest of any scores (what the previous two apply);
* structured: :func:`rows_mask`, :func:`columns_mask`, :func:`diagonal_mask`,
  :func:`band_mask`, :func:`block_mask`.

Ties (equal magnitudes or scores) go to the lower flat index, so every
function is deterministic. :func:`magnitude_mask` takes the weight itself, so
a policy of :func:`refimpl.partialize <refimpl.convert.partialize>` calls it
directly: ``{"dense": lambda w: magnitude_mask(w, fraction=0.01)}``. The ones
that take a shape (:func:`random_mask` and the structured ones) work as a
policy through the weight's shape:
``lambda w: random_mask(w.shape, fraction=0.01)``.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl import backend
from refimpl.masks import (
    _as_array,
    _check_int,
    _describe,
    _input_arrays,
    _normalize_shape,
)

# In the order of the API page: the scored masks, then the structured ones.
__all__ = [
    "random_mask",
    "magnitude_mask",
    "fisher_scores",
    "fisher_mask",
    "top_k_mask",
    "rows_mask",
    "columns_mask",
    "diagonal_mask",
    "band_mask",
    "block_mask",
]


def random_mask(shape, *, k=None, fraction=None, seed: int = 0) -> np.ndarray:
    """``k`` entries (or a ``fraction`` of them), chosen uniformly at random.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import random_mask
    >>> random_mask((2, 3), k=2, seed=0).astype(int)  # the same for the same seed
    array([[0, 0, 0],
           [1, 1, 0]])
    """
    shape = _normalize_shape(shape)
    size = int(np.prod(shape))
    k = _count(k, fraction, size)
    seed = _check_int(seed, "seed")
    chosen = np.random.default_rng(seed).choice(size, size=k, replace=False)
    mask = np.zeros(size, bool)
    mask[chosen] = True
    return mask.reshape(shape)


def top_k_mask(scores, *, k=None, fraction=None) -> np.ndarray:
    """The ``k`` entries of ``scores`` with the largest values (ties: lower index).

    Returns:
        A boolean NumPy array of ``scores``'s shape.

    >>> from refimpl.selection import top_k_mask
    >>> top_k_mask([[0.1, 3.0], [2.0, 2.0]], k=2).astype(int)
    array([[0, 1],
           [1, 0]])
    """
    array = _float(scores, "scores")
    if np.isnan(array).any():
        raise ValueError("`scores` must not hold NaN. Received NaN in scores")
    k = _count(k, fraction, array.size)
    order = np.argsort(-array.reshape(-1), kind="stable")[:k]
    mask = np.zeros(array.size, bool)
    mask[order] = True
    return mask.reshape(array.shape)


def magnitude_mask(weight, *, k=None, fraction=None) -> np.ndarray:
    """The ``k`` entries of ``weight`` with the largest absolute values.

    Returns:
        A boolean NumPy array of ``weight``'s shape.

    >>> from refimpl.selection import magnitude_mask
    >>> magnitude_mask([[0.5, -3.0], [1.0, 0.0]], k=2).astype(int)
    array([[0, 1],
           [1, 0]])
    """
    return top_k_mask(np.abs(_float(weight, "weight")), k=k, fraction=fraction)


def fisher_scores(model, x, y, *, loss, batch_size: int = 32, batches: int = 4):
    """Accumulated squared gradients of the loss, per trainable weight.

    Each batch's gradient of the mean loss, squared entry by entry and summed
    over the first ``batches`` batches of ``(x, y)``: the batched estimate of
    the diagonal of the empirical Fisher information.

    Args:
        model: a built Keras model.
        x: the inputs: an array or, for a model with several inputs, a dict or
            list of arrays.
        y: the targets, an array with as many rows.
        loss: a Keras loss (an object or a name such as ``"mse"``).
        batch_size: the rows per batch.
        batches: how many batches to accumulate.

    Returns:
        A dict from each trainable weight's path to a NumPy array of its shape.

    >>> from refimpl.selection import fisher_scores
    >>> dense = keras.layers.Dense(1, kernel_initializer="ones", name="d")
    >>> model = keras.Sequential([keras.Input((2,)), dense], name="net")
    >>> x, y = np.ones((4, 2)), np.zeros((4, 1))
    >>> scores = fisher_scores(model, x, y, loss="mse", batch_size=2, batches=2)
    >>> {path: score.tolist() for path, score in scores.items()}
    {'net/d/kernel': [[32.0], [32.0]], 'net/d/bias': [32.0]}
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`model` must be a Keras model. Received: model={_describe(model)}"
        )
    batch_size = _check_int(batch_size, "batch_size", minimum=1)
    batches = _check_int(batches, "batches", minimum=1)
    loss_fn = keras.losses.get(loss)
    x, y = _input_arrays(
        x, y, "x", "`x` and `y` must hold the same number of rows, at least one."
    )
    variables = model.trainable_variables
    totals = [np.zeros(tuple(v.shape), np.float64) for v in variables]
    for start in range(0, min(len(y), batches * batch_size), batch_size):
        xb = keras.tree.map_structure(lambda a, s=start: a[s : s + batch_size], x)
        yb = y[start : start + batch_size]

        def batch_loss(outputs, yb=yb):
            # The batch mean, whether ``loss`` reduces or not.
            return keras.ops.mean(loss_fn(yb, outputs))

        grads = backend.batch_gradients(model, batch_loss, xb)
        for total, grad in zip(totals, grads, strict=True):
            if grad is not None:
                total += np.square(grad, dtype=np.float64)
    return {v.path: total for v, total in zip(variables, totals, strict=True)}


def fisher_mask(scores, *, k=None, fraction=None) -> np.ndarray:
    """The ``k`` entries with the largest Fisher score (see :func:`fisher_scores`).

    Returns:
        A boolean NumPy array of ``scores``'s shape.

    >>> from refimpl.selection import fisher_mask
    >>> fisher_mask([[4.0, 0.5], [0.1, 9.0]], k=2).astype(int)
    array([[1, 0],
           [0, 1]])

    From a model's scores to the converted model: score on a few batches, keep
    the top entries of one kernel, and hand that mask to ``partialize``.

    >>> from refimpl import partialize
    >>> from refimpl.selection import fisher_mask, fisher_scores
    >>> layers = [keras.Input((4,)), keras.layers.Dense(3, name="d")]
    >>> model = keras.Sequential(layers, name="net")
    >>> x = np.random.default_rng(0).normal(size=(8, 4))
    >>> scores = fisher_scores(model, x, np.zeros((8, 3)), loss="mse")
    >>> mask = fisher_mask(scores["net/d/kernel"], k=2)
    >>> tuned = partialize(model, {"d": mask})
    >>> [tuple(w.shape) for w in tuned.trainable_weights]
    [(2,)]
    """
    return top_k_mask(scores, k=k, fraction=fraction)


def rows_mask(shape, rows) -> np.ndarray:
    """Whole rows (first axis) trainable: a new token's row of an embedding.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import rows_mask
    >>> rows_mask((3, 2), [2]).astype(int)
    array([[0, 0],
           [0, 0],
           [1, 1]])
    """
    shape = _normalize_shape(shape)
    mask = np.zeros(shape, bool)
    mask[_axis_indices(rows, shape[0], "rows")] = True
    return mask


def columns_mask(shape, columns) -> np.ndarray:
    """Whole columns (last axis) trainable: some output units of a kernel.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import columns_mask
    >>> columns_mask((2, 3), [0]).astype(int)
    array([[1, 0, 0],
           [1, 0, 0]])
    """
    shape = _normalize_shape(shape)
    mask = np.zeros(shape, bool)
    mask[..., _axis_indices(columns, shape[-1], "columns")] = True
    return mask


def diagonal_mask(shape) -> np.ndarray:
    """The main diagonal of a matrix.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import diagonal_mask
    >>> diagonal_mask((2, 3)).astype(int)
    array([[1, 0, 0],
           [0, 1, 0]])
    """
    return band_mask(shape, 0, 0)


def band_mask(shape, lower: int, upper: int) -> np.ndarray:
    """The band of ``lower`` sub- and ``upper`` super-diagonals of a matrix.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import band_mask
    >>> band_mask((3, 3), 1, 0).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [0, 1, 1]])
    """
    shape = _normalize_shape(shape)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D. Received: shape={shape}")
    lower, upper = _check_int(lower, "lower"), _check_int(upper, "upper")
    offset = np.subtract.outer(np.arange(shape[0]), np.arange(shape[1]))
    return (offset <= lower) & (-offset <= upper)


def block_mask(shape, row_sizes, col_sizes, blocks) -> np.ndarray:
    """Whole blocks of a block matrix trainable.

    Args:
        shape: the matrix shape.
        row_sizes: the block heights (summing to the number of rows).
        col_sizes: the block widths (summing to the number of columns).
        blocks: the ``(i, j)`` block coordinates to train.

    Returns:
        A boolean NumPy array of ``shape``.

    >>> from refimpl.selection import block_mask
    >>> block_mask((3, 3), [1, 2], [2, 1], [(1, 0)]).astype(int)
    array([[0, 0, 0],
           [1, 1, 0],
           [1, 1, 0]])
    """
    shape = _normalize_shape(shape)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D. Received: shape={shape}")
    edges = []
    for name, sizes, total in (
        ("row_sizes", row_sizes, shape[0]),
        ("col_sizes", col_sizes, shape[1]),
    ):
        sizes = [_check_int(size, name, minimum=1) for size in sizes]
        if sum(sizes) != total:
            raise ValueError(
                f"`{name}` must sum to {total}. Received: {name}={_describe(sizes)}"
            )
        edges.append(np.concatenate([[0], np.cumsum(sizes)]))
    mask = np.zeros(shape, bool)
    for n, block in enumerate(blocks):
        if not (
            isinstance(block, (tuple, list))
            and len(block) == 2
            and all(isinstance(v, (int, np.integer)) for v in block)
        ):
            raise TypeError(
                f"`blocks[{n}]` must be an (i, j) pair of ints, the block's row "
                f"and column in the grid. Received: blocks[{n}]={_describe(block)}"
            )
        i, j = block
        if not (0 <= i < len(edges[0]) - 1 and 0 <= j < len(edges[1]) - 1):
            raise ValueError(
                f"`blocks[{n}]` is outside the grid. Received: "
                f"blocks[{n}]={_describe(block)}"
            )
        mask[edges[0][i] : edges[0][i + 1], edges[1][j] : edges[1][j + 1]] = True
    return mask


def _count(k, fraction, size: int) -> int:
    if (k is None) == (fraction is None):
        raise ValueError(
            f"Give exactly one of `k` and `fraction`. Received: k={_describe(k)}, "
            f"fraction={_describe(fraction)}"
        )
    if k is not None:
        return _check_int(k, "k", maximum=size)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(
            f"`fraction` must be a number. Received: fraction={_describe(fraction)}"
        )
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(
            "`fraction` must be between 0 and 1. Received: "
            f"fraction={_describe(fraction)}"
        )
    return int(round(fraction * size))


def _float(value, name: str) -> np.ndarray:
    return _as_array(value, name, kind="numeric", what="a numeric array").astype(
        np.float64
    )


def _axis_indices(indices, size: int, name: str) -> np.ndarray:
    array = np.asarray(indices)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(
            f"`{name}` must be a list of ints. Received: {name}={_describe(indices)}"
        )
    if array.size and (array.min() < 0 or array.max() >= size):
        raise ValueError(
            f"`{name}` must lie in [0, {size}). Received: {name}={_describe(indices)}"
        )
    return array.astype(np.int64)
