"""Keras layers with a partially trainable weight.

A *partial class* is the subclass of a Keras layer class whose weight is
trainable only at some entries (``PartialConv2D`` of ``Conv2D``;
:class:`PartialDense <refimpl.layers.partial.PartialDense>` of ``Dense``). The
layers:

* :class:`PartialDense <refimpl.layers.partial.PartialDense>` and the partial classes
  of :mod:`refimpl.layers.partial`: a Keras layer's own weight as the frozen
  base, with ``k`` free values
  (what :func:`refimpl.partialize <refimpl.convert.partialize>` and
  :func:`refimpl.enable_partial <refimpl.layers.partial.enable_partial>` make);
* :class:`DiagonalDense <refimpl.layers.structured_dense.DiagonalDense>`,
  :class:`BandedDense <refimpl.layers.structured_dense.BandedDense>` and
  :class:`BlockDense <refimpl.layers.structured_dense.BlockDense>`
  (:mod:`refimpl.layers.structured_dense`): a Dense kernel built from only
  the values of its structure, multiplied without building it.
"""

from refimpl.layers.partial import PartialDense, enable_partial
from refimpl.layers.structured_dense import BandedDense, BlockDense, DiagonalDense

__all__ = [
    "BandedDense",
    "BlockDense",
    "DiagonalDense",
    "PartialDense",
    "enable_partial",
]
