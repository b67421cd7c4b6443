"""A Dense layer whose kernel is a grid of fixed, zero and trainable blocks."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from refimpl import selection
from refimpl.layers._arguments import (
    check_outside,
    copy_bias,
    dense_arguments,
    input_dim,
    parse_grid,
)
from refimpl.layers._base import StructuredDense
from refimpl.ops import initializer as _constant
from refimpl.structured import block, block_matmul

__all__ = ["BlockDense"]


@keras.saving.register_keras_serializable(package="refimpl")
class BlockDense(StructuredDense):
    """A Dense layer whose kernel is a grid of fixed, zero and trainable blocks.

    The kernel ``W`` (``y = x @ W``) is assembled like ``np.block(blocks)``;
    the product runs as split matmuls that skip the zero blocks, and only the
    trainable blocks are trainable weights (``block_i_j``).

    Args:
        blocks: a rectangular list of block rows. Each entry is ``None`` (a
            zero block), ``"trainable"`` (a trainable block drawn by
            ``kernel_initializer``), or a 2-D array of fixed values, kept in a
            non-trainable weight ``fixed_i_j``. (``"fixed"`` is a fixed block
            whose values come with saved weights: what ``from_config``
            builds; the layer refuses to run until they are loaded.)
        row_sizes: the height of each block row (input features); needed only
            for a row without a fixed block, checked against the others.
        col_sizes: the width of each block column (output units); likewise.
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias (default ``False``).
        kernel_initializer: for the trainable blocks, called once per block.
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments.

    Raises:
        TypeError: for a grid that is not a list of lists, a fixed block whose
            values are not numbers, or ``row_sizes`` or ``col_sizes`` that are
            not lists of ints.
        ValueError: for an empty or ragged grid, an unknown entry, a fixed
            block that is not 2-D, blocks whose heights or widths disagree,
            sizes that cannot be inferred, ``row_sizes`` or ``col_sizes`` of
            another length than the block rows or columns or holding an int
            below 1, or (when built) an input size other than the sum of the
            heights.

    Its ``kernel``, ``trainable_mask`` and ``to_dense()`` are as for
    :class:`~refimpl.layers.structured.DiagonalDense`.

    >>> from refimpl import BlockDense
    >>> eye = np.eye(2)
    >>> layer = BlockDense([[None, -0.2 * eye], [0.35 * eye, "trainable"]])
    >>> layer.build((None, 4))
    >>> [(w.name, tuple(w.shape)) for w in layer.trainable_weights]
    [('block_1_1', (2, 2))]
    """

    def __init__(
        self,
        blocks,
        *,
        row_sizes=None,
        col_sizes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._grid, self._heights, self._widths = parse_grid(
            blocks, row_sizes, col_sizes
        )

    def build(self, input_shape):
        n = input_dim(input_shape)
        if n != sum(self._heights):
            raise ValueError(
                f"`input_shape` must end in the sum of the block-row heights "
                f"{self._heights}, {sum(self._heights)}. Received: "
                f"input_shape={tuple(input_shape)}"
            )
        for i, row in enumerate(self._grid):
            for j, entry in enumerate(row):
                shape = (self._heights[i], self._widths[j])
                if isinstance(entry, str) and entry == "trainable":
                    weight = self.add_weight(
                        name=f"block_{i}_{j}",
                        shape=shape,
                        initializer=self.kernel_initializer,
                    )
                    setattr(self, f"block_{i}_{j}", weight)  # tracked by name
                elif entry is not None:
                    shell = isinstance(entry, str)  # "fixed": it comes with the weights
                    start = np.full(shape, np.nan) if shell else entry
                    weight = self.add_weight(
                        name=f"fixed_{i}_{j}",
                        shape=shape,
                        initializer=_constant(start),
                        trainable=False,
                    )
                    setattr(self, f"fixed_{i}_{j}", weight)
                    if shell:
                        self._from_weights.append(f"fixed_{i}_{j}")
        self._build_bias(n, sum(self._widths))

    @classmethod
    def from_dense(
        cls, dense, layout, *, row_sizes, col_sizes, project: bool = False
    ) -> BlockDense:
        """Copy a built ``keras.layers.Dense`` into a grid of blocks.

        Args:
            dense: the layer to copy.
            layout: a rectangular list of block rows; each entry ``None``
                (the block must be zero), ``"trainable"`` or ``"fixed"``
                (copied from the kernel).
            row_sizes: the height of each block row; they sum to the input size.
            col_sizes: the width of each block column; they sum to the units.
            project: drop non-zero entries of ``None`` blocks instead of
                refusing them.

        Returns:
            A built ``BlockDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
            ValueError: for a layout that does not fit the kernel, non-zero
                entries in a ``None`` block (unless ``project``), or a kernel
                regularizer or constraint.

        >>> from refimpl import BlockDense
        >>> dense = keras.layers.Dense(4)
        >>> dense.build((None, 4))
        >>> layout = [["fixed", None], [None, "trainable"]]
        >>> layer = BlockDense.from_dense(
        ...     dense, layout, row_sizes=[2, 2], col_sizes=[2, 2], project=True
        ... )  # project: drop the random kernel's entries outside the blocks
        >>> [w.name for w in layer.trainable_weights]
        ['block_1_1', 'bias']
        """
        kernel, kwargs = dense_arguments(dense)
        layer = cls(layout, row_sizes=row_sizes, col_sizes=col_sizes, **kwargs)
        if (sum(layer._heights), sum(layer._widths)) != kernel.shape:
            raise ValueError(
                f"`row_sizes` and `col_sizes` must sum to the kernel's shape "
                f"{kernel.shape}. Received: row_sizes={row_sizes}, "
                f"col_sizes={col_sizes}"
            )
        layer.build((None, kernel.shape[0]))
        rows = np.cumsum([0, *layer._heights])
        cols = np.cumsum([0, *layer._widths])
        keep = np.zeros(kernel.shape, bool)
        for i, row in enumerate(layer._grid):
            for j, b in enumerate(row):
                part = kernel[rows[i] : rows[i + 1], cols[j] : cols[j + 1]]
                if b is not None:
                    keep[rows[i] : rows[i + 1], cols[j] : cols[j + 1]] = True
                    getattr(layer, f"{_kind(b)}_{i}_{j}").assign(part)
        check_outside(kernel, keep, project, "non-zero blocks")
        copy_bias(layer, dense)
        return layer

    def _units_for(self, n):
        return sum(self._widths)

    def _rows(self, dtype):
        """The grid as tensors, ``None`` for zero blocks, for :mod:`structured`."""
        return [
            [
                None
                if b is None
                else ops.cast(getattr(self, f"{_kind(b)}_{i}_{j}"), dtype)
                for j, b in enumerate(row)
            ]
            for i, row in enumerate(self._grid)
        ]

    def _product(self, x, dtype):
        return block_matmul(x, self._rows(dtype))

    def _kernel(self, dtype):
        return block(self._rows(dtype))

    def _trainable_mask(self):
        trainable = [
            (i, j)
            for i, row in enumerate(self._grid)
            for j, b in enumerate(row)
            if _kind(b) == "block" and b is not None
        ]
        shape = (sum(self._heights), sum(self._widths))
        return selection.block_mask(shape, self._heights, self._widths, trainable)

    def get_config(self) -> dict:
        layout = [
            [None if b is None else "trainable" if _kind(b) == "block" else "fixed"]
            for row in self._grid
            for b in row
        ]
        width = len(self._widths)
        config = {
            "blocks": [
                sum(layout[r : r + width], []) for r in range(0, len(layout), width)
            ],
            "row_sizes": list(self._heights),
            "col_sizes": list(self._widths),
        }
        return {**super().get_config(), **config}


def _kind(block) -> str:
    """``"block"`` for a trainable block's weight name, ``"fixed"`` otherwise."""
    return "block" if isinstance(block, str) and block == "trainable" else "fixed"
