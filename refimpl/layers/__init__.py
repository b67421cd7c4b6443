"""Keras layers with a partially trainable weight.

A *partial class* is the subclass of a Keras layer class whose weight is
trainable only at some entries (``PartialConv2D`` of ``Conv2D``;
:class:`PartialDense <refimpl.layers.dense.PartialDense>` of ``Dense``). The
layers:

* :class:`PartialDense <refimpl.layers.dense.PartialDense>` and the partial classes
  made in :mod:`refimpl.layers.classes` (their shared mechanism:
  :mod:`refimpl.layers.partial`):
  a Keras layer's own weight as the frozen base, with ``k`` free values
  (what :func:`refimpl.partialize <refimpl.convert.partialize>` and
  :func:`refimpl.enable_partial <refimpl.layers.enable.enable_partial>` make);
* :class:`DiagonalDense <refimpl.layers.structured.DiagonalDense>`,
  :class:`BandedDense <refimpl.layers.structured.BandedDense>` and
  :class:`BlockDense <refimpl.layers.block.BlockDense>`
  (:mod:`refimpl.layers.structured`, :mod:`refimpl.layers.block`): a Dense kernel built
  from only the
  values of its structure, multiplied without building it.
"""

from refimpl.layers.block import BlockDense
from refimpl.layers.dense import PartialDense
from refimpl.layers.enable import enable_partial, partial_class
from refimpl.layers.structured import BandedDense, DiagonalDense

__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
    "PartialDense",
    "enable_partial",
    "partial_class",
]
