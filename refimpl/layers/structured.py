"""Keras 3 layers whose kernel is built from its free values in the forward pass.

Each layer keeps only its free values as trainable weights, so ``summary()``
and :func:`refimpl.testing.count_free_parameters` report the true number of free
parameters, and no optimizer (weight decay included) can move a fixed entry.
The math is :mod:`refimpl.structured`; these classes only hold the weights.
Like ``Dense``, each computes ``activation(x @ kernel + bias)``. Each has its
own ``from_dense`` (copy a built ``keras.layers.Dense``) and the same
``kernel`` (the dense kernel), ``trainable_mask`` (its free entries, for
:func:`refimpl.testing.assert_frozen`) and ``to_dense`` (return a Dense),
documented once, with :class:`DiagonalDense`; :func:`refimpl.merge
<refimpl.convert.merge>` folds a whole model back into plain Keras.
:class:`refimpl.PartialDense <refimpl.layers.dense.PartialDense>` (any mask
over a frozen base) lives in :mod:`refimpl.layers.dense`.

Fixed values (a fixed diagonal, fixed blocks) are non-trainable weights, so
they live in the weights file and never in ``get_config``.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from refimpl import selection
from refimpl._tensors import split_last
from refimpl.layers._arguments import (
    check_outside,
    copy_bias,
    dense_arguments,
    float_array,
    input_dim,
    non_negative_int,
)
from refimpl.layers._base import StructuredDense
from refimpl.ops import initializer as _constant
from refimpl.structured import (
    banded,
    banded_matmul,
    diagonal,
    diagonal_matmul,
)

__all__ = ["BandedDense", "DiagonalDense"]


@keras.saving.register_keras_serializable(package="refimpl")
class DiagonalDense(StructuredDense):
    """``y = x * w (+ b)``: a Dense layer whose kernel is ``diag(w)``, in O(n).

    The only kernel weight is ``diagonal`` (shape ``[n]``, ``n`` the input
    size); the output has the input's shape.

    Args:
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias of length ``n`` (default ``False``).
        kernel_initializer: for ``diagonal``; ``"ones"`` starts at the identity.
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments (``name``, ``dtype``, ...).

    >>> from refimpl import DiagonalDense
    >>> layer = DiagonalDense()
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32")))
    array([[1., 1., 1.]], dtype=float32)
    >>> layer.count_params()
    3
    """

    def __init__(self, *, kernel_initializer="ones", **kwargs):
        super().__init__(kernel_initializer=kernel_initializer, **kwargs)

    @classmethod
    def from_dense(cls, dense, *, project: bool = False) -> DiagonalDense:
        """Copy a built square ``keras.layers.Dense`` whose kernel is diagonal.

        Args:
            dense: the layer to copy (name, dtype policy, activation, bias and
                its regularizer and constraint, activity regularizer).
            project: drop non-zero entries off the diagonal instead of
                refusing them.

        Returns:
            A built ``DiagonalDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
            ValueError: for a kernel that is not square, non-zero entries off
                the diagonal (unless ``project``), or a kernel regularizer or
                constraint.

        >>> from refimpl import DiagonalDense
        >>> dense = keras.layers.Dense(3, kernel_initializer="identity")
        >>> dense.build((None, 3))
        >>> DiagonalDense.from_dense(dense).count_params()
        6
        """
        kernel, kwargs = dense_arguments(dense)
        n = _square(kernel)
        check_outside(kernel, np.eye(n, dtype=bool), project, "diagonal")
        layer = cls(**kwargs)
        layer.build((None, n))
        layer.diagonal.assign(np.diagonal(kernel))
        copy_bias(layer, dense)
        return layer

    def build(self, input_shape):
        n = input_dim(input_shape)
        self.diagonal = self.add_weight(
            name="diagonal", shape=(n,), initializer=self.kernel_initializer
        )
        self._build_bias(n, n)

    def _units_for(self, n):
        return n

    def _product(self, x, dtype):
        return diagonal_matmul(x, ops.cast(self.diagonal, dtype))

    def _kernel(self, dtype):
        return diagonal(ops.cast(self.diagonal, dtype))

    def _trainable_mask(self):
        n = self.diagonal.shape[0]
        return selection.diagonal_mask((n, n))


@keras.saving.register_keras_serializable(package="refimpl")
class BandedDense(StructuredDense):
    """A square Dense layer whose kernel is zero outside a band, in O(n*b).

    The kernel ``W`` (``y = x @ W``) keeps the diagonals at offsets ``-lower``
    to ``upper``, as ``tf.linalg.band_part(W, lower, upper)`` would: ``lower``
    diagonals below the main one, ``upper`` above. Trainable weights: the
    off-diagonals, concatenated from the lowest offset up (``off_diagonals``),
    and the main diagonal (``diagonal``) unless ``fixed_diagonal`` is given.
    Its ``kernel``, ``trainable_mask`` and ``to_dense()`` are as for
    :class:`DiagonalDense`.

    Args:
        lower: number of trainable diagonals below the main one, ``>= 0``.
        upper: number of trainable diagonals above the main one, ``>= 0``.
        fixed_diagonal: ``None`` for a trainable main diagonal, or its fixed
            value: a number, or a list of ``n`` numbers. It is kept in a
            non-trainable weight ``fixed_diagonal``. (``"from_weights"``
            builds that weight for values loaded with saved weights: what
            ``from_config`` does; the layer refuses to run until they are.)
        activation: as for ``keras.layers.Dense``.
        use_bias: add a trainable bias (default ``False``).
        kernel_initializer: for ``off_diagonals`` (default ``"zeros"``).
        diagonal_initializer: for a trainable main diagonal (default
            ``"ones"``, so that by default the layer starts as the identity).
        bias_initializer: for the bias.
        **kwargs: base ``Layer`` arguments.

    Raises:
        TypeError: for widths that are not ints (``BandedDense(1.5, 1)``), or
            a ``fixed_diagonal`` that is not numbers.
        ValueError: for negative widths (``BandedDense(-1, 1)``) or (when
            built) widths not below ``n``, and for a ``fixed_diagonal`` of more
            than one dimension or (when built) of a length other than ``n``.

    >>> from refimpl import BandedDense
    >>> layer = BandedDense(1, 1, fixed_diagonal=1.0)
    >>> layer.build((None, 4))
    >>> sum(int(np.prod(w.shape)) for w in layer.trainable_weights)  # 3 + 3
    6
    """

    def __init__(
        self,
        lower: int,
        upper: int,
        *,
        fixed_diagonal=None,
        kernel_initializer="zeros",
        diagonal_initializer="ones",
        **kwargs,
    ):
        super().__init__(kernel_initializer=kernel_initializer, **kwargs)
        self.lower = non_negative_int(lower, "lower")
        self.upper = non_negative_int(upper, "upper")
        self._fixed = (
            fixed_diagonal
            if fixed_diagonal is None
            or (isinstance(fixed_diagonal, str) and fixed_diagonal == "from_weights")
            else float_array(fixed_diagonal, "fixed_diagonal", max_ndim=1)
        )
        self.diagonal_initializer = keras.initializers.get(diagonal_initializer)

    def build(self, input_shape):
        n = input_dim(input_shape)
        for name, width in (("lower", self.lower), ("upper", self.upper)):
            if width >= n:
                raise ValueError(
                    f"`{name}` must be below the matrix size {n}: an {n}x{n} "
                    f"matrix has {n - 1} diagonals on each side. Received: "
                    f"{name}={width}"
                )
        fixed = isinstance(self._fixed, np.ndarray)
        if fixed and self._fixed.ndim == 1 and len(self._fixed) != n:
            raise ValueError(
                f"`fixed_diagonal` must be a number or {n} numbers, one per "
                f"input feature. Received {len(self._fixed)} numbers"
            )
        self._n = n
        self._off = [k for k in range(-self.lower, self.upper + 1) if k != 0]
        self.off_diagonals = None
        if self._off:
            self.off_diagonals = self.add_weight(
                name="off_diagonals",
                shape=(sum(n - abs(k) for k in self._off),),
                initializer=self.kernel_initializer,
            )
        self.diagonal = self.fixed_diagonal = None
        if self._fixed is not None:
            # Values that come with the weights start as NaN: the shell mark.
            start = (
                np.full(n, np.nan) if not fixed else np.broadcast_to(self._fixed, (n,))
            )
            self.fixed_diagonal = self.add_weight(
                name="fixed_diagonal",
                shape=(n,),
                initializer=_constant(start),
                trainable=False,
            )
            if not fixed:
                self._from_weights.append("fixed_diagonal")
        else:
            self.diagonal = self.add_weight(
                name="diagonal", shape=(n,), initializer=self.diagonal_initializer
            )
        self._build_bias(n, n)

    @classmethod
    def from_dense(
        cls, dense, lower: int, upper: int, *, project: bool = False
    ) -> BandedDense:
        """Copy a built square ``keras.layers.Dense`` whose kernel is a band.

        The main diagonal and the ``lower`` and ``upper`` diagonals around it
        become trainable weights; ``project`` is as for
        :meth:`DiagonalDense.from_dense`.

        Returns:
            A built ``BandedDense``; ``dense`` is unchanged.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``, or
                for widths that are not ints.
            ValueError: for a kernel that is not square, widths that are
                negative or not below ``n``, non-zero entries outside the band
                (unless ``project``), or a kernel regularizer or constraint.

        >>> from refimpl import BandedDense
        >>> dense = keras.layers.Dense(3, kernel_initializer="identity")
        >>> dense.build((None, 3))
        >>> BandedDense.from_dense(dense, 1, 0).count_params()  # 3 + 2 + 3 bias
        8
        """
        kernel, kwargs = dense_arguments(dense)
        n = _square(kernel)
        layer = cls(lower, upper, **kwargs)
        layer.build((None, n))
        check_outside(kernel, layer.trainable_mask, project, "band")
        layer.diagonal.assign(np.diagonal(kernel))
        if layer._off:
            layer.off_diagonals.assign(
                np.concatenate([np.diagonal(kernel, k) for k in layer._off])
            )
        copy_bias(layer, dense)
        return layer

    def _units_for(self, n):
        return n

    def _diagonals(self, dtype):
        """The band as (diagonals, offsets), for :mod:`refimpl.structured`."""
        main = self.diagonal if self._fixed is None else self.fixed_diagonal
        main = ops.cast(main, dtype)
        diagonals, offsets = [main], [0]
        if self._off:
            sizes = [self._n - abs(k) for k in self._off]
            pieces = split_last(ops.cast(self.off_diagonals, dtype), sizes)
            diagonals += pieces
            offsets += self._off
        return diagonals, offsets

    def _product(self, x, dtype):
        return banded_matmul(x, *self._diagonals(dtype))

    def _kernel(self, dtype):
        return banded(*self._diagonals(dtype))

    def _trainable_mask(self):
        shape = (self._n, self._n)
        band = selection.band_mask(shape, self.lower, self.upper)
        if self._fixed is not None:  # the main diagonal is fixed
            band &= ~selection.diagonal_mask(shape)
        return band

    def get_config(self) -> dict:
        config = {
            "lower": self.lower,
            "upper": self.upper,
            "fixed_diagonal": None if self._fixed is None else "from_weights",
            "diagonal_initializer": keras.initializers.serialize(
                self.diagonal_initializer
            ),
        }
        return {**super().get_config(), **config}


def _square(kernel: np.ndarray) -> int:
    if kernel.shape[0] != kernel.shape[1]:
        raise ValueError(
            "`dense` must be square (as many units as inputs) for this layer. "
            f"Received a kernel of shape {kernel.shape}"
        )
    return kernel.shape[0]
