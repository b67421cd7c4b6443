"""A Dense layer of which only the kernel entries in a mask are trainable.

:class:`PartialDense` is the Keras 3 layer form of
:class:`refimpl.PartialVariable`: a frozen base (a non-trainable weight) and
the free values (the only trainable kernel weight), joined in the forward pass
by :func:`refimpl.variables.compose`. It is importable from
:mod:`refimpl.layers` with the structured layers.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from refimpl._layer_base import StructuredDense, array_shape, input_dim, listed
from refimpl.masks import mask_to_indices, to_mask
from refimpl.variables import choose_mode, compose

__all__ = ["PartialDense"]


@keras.saving.register_keras_serializable(package="refimpl")
class PartialDense(StructuredDense):
    """A Dense layer of which only the kernel entries in a mask are trainable.

    The kernel is a frozen ``base`` (a non-trainable weight of the kernel's
    shape) with the free values written over it by
    :func:`refimpl.variables.compose`. With ``mode="delta"`` (the default)
    ``free`` holds exactly the ``k`` free values, in the row-major order of
    the mask, and is the only trainable kernel weight. With ``mode="select"``
    ``free`` is kernel-sized (faster when most entries are free, but
    ``summary()`` then counts every entry); ``"auto"`` lets
    :func:`refimpl.variables.choose_mode` pick by density.

    Args:
        units: the output size, a positive int.
        trainable_mask: the trainable kernel entries: a boolean mask of shape
            ``[input_dim, units]`` or an index list of shape ``[k, 2]``.
        activation: as for ``keras.layers.Dense``.
        use_bias: add a (fully trainable) bias (default ``True``).
        kernel_initializer: draws the whole starting kernel: the frozen
            entries and the free values' starting point.
        bias_initializer: for the bias.
        mode: ``"delta"``, ``"select"`` or ``"auto"``.
        **kwargs: base ``Layer`` arguments.

    Raises:
        ValueError, TypeError: for ``units`` that is not a positive int, an
            unknown ``mode``, or (when built) a mask that does not fit.

    >>> layer = PartialDense(2, [[0, 0], [2, 1]], use_bias=False)
    >>> layer.build((None, 3))
    >>> [(w.name, tuple(w.shape), w.trainable) for w in layer.weights]
    [('free', (2,), True), ('base', (3, 2), False)]
    """

    def __init__(
        self,
        units: int,
        trainable_mask,
        *,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        mode: str = "delta",
        **kwargs,
    ):
        super().__init__(
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            **kwargs,
        )
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)):
            raise TypeError(
                f"`units` must be a positive int. Received: units={units!r}"
            )
        if units <= 0:
            raise ValueError(f"`units` must be a positive int. Received: units={units}")
        if mode not in ("auto", "delta", "select"):
            raise ValueError(
                f"`mode` must be 'auto', 'delta' or 'select'. Received: mode={mode!r}"
            )
        self.units = int(units)
        self._given_mask = trainable_mask
        self.mode = mode
        mask_shape = array_shape(trainable_mask)
        if mask_shape is not None and mask_shape[1:] != (self.units,):
            raise ValueError(
                f"`trainable_mask` must have shape [input_dim, {self.units}]. "
                f"Received a mask of shape {mask_shape}"
            )

    def build(self, input_shape):
        n = input_dim(input_shape)
        self._mask = to_mask(self._given_mask, (n, self.units), name="trainable_mask")
        self._indices = mask_to_indices(self._mask)
        self.resolved_mode = (
            choose_mode(self._mask) if self.mode == "auto" else self.mode
        )
        initial = self.kernel_initializer((n, self.units), dtype=self.variable_dtype)
        start = (
            initial
            if self.resolved_mode == "select"
            else tf.gather_nd(initial, self._indices)
        )
        self.base = self.add_weight(
            name="base",
            shape=(n, self.units),
            initializer=lambda *_, **__: initial,
            trainable=False,
        )
        self.free = self.add_weight(
            name="free", shape=tuple(start.shape), initializer=lambda *_, **__: start
        )
        self._build_bias(n, self.units)

    @classmethod
    def from_dense(
        cls, dense, trainable_mask, *, mode: str = "delta", name: str | None = None
    ) -> PartialDense:
        """Copy a built ``keras.layers.Dense``, leaving only ``trainable_mask`` free.

        The new layer's kernel and bias equal the Dense layer's, bit for bit.

        >>> dense = keras.layers.Dense(2)
        >>> dense.build((None, 3))
        >>> layer = PartialDense.from_dense(dense, np.eye(3, 2, dtype=bool))
        >>> bool(np.array_equal(layer.kernel, dense.kernel))
        True
        """
        if not isinstance(dense, keras.layers.Dense) or not dense.built:
            raise TypeError(
                f"`dense` must be a built keras.layers.Dense. Received: dense={dense!r}"
            )
        kernel = tf.convert_to_tensor(dense.kernel)
        layer = cls(
            dense.units,
            trainable_mask,
            activation=dense.activation,
            use_bias=dense.use_bias,
            mode=mode,
            name=name,
            dtype=dense.dtype_policy,
        )
        layer.build((None, kernel.shape[0]))
        layer.base.assign(kernel)
        start = (
            kernel
            if layer.resolved_mode == "select"
            else tf.gather_nd(kernel, layer._indices)
        )
        layer.free.assign(start)
        if dense.use_bias:
            layer.bias.assign(dense.bias)
        return layer

    def _units_for(self, n):
        return self.units

    def _product(self, x, dtype):
        return keras.ops.matmul(x, self._kernel(dtype))

    def _kernel(self, dtype):
        return compose(
            tf.cast(self.base, dtype),
            self._indices,
            tf.cast(self.free, dtype),
            mode=self.resolved_mode,
            mask=self._mask,
        )

    def _trainable_mask(self):
        return self._mask.copy()

    def get_config(self) -> dict:
        config = {
            "units": self.units,
            "trainable_mask": listed(self._given_mask),
            "mode": self.mode,
        }
        return {**super().get_config(), **config}
