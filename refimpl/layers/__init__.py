"""Keras layers with a partially trainable weight.

* :class:`PartialDense` and the partial classes of :mod:`refimpl.layers.partial`:
  a Keras layer's own weight as the frozen base, with ``k`` free values
  (what :func:`refimpl.partialize` and :func:`refimpl.enable_partial` make);
* :class:`DiagonalDense`, :class:`BandedDense` and :class:`BlockDense`
  (:mod:`refimpl.layers.structured`): a Dense kernel built from only the
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
