"""``PartialDense``: the partial class of ``keras.layers.Dense``.

What :func:`refimpl.partialize <refimpl.convert.partialize>` and
:func:`refimpl.enable_partial <refimpl.layers.enable.enable_partial>` make of a
Dense layer, and the layer to build from a mask; with ``mode="sparse"`` it
multiplies without composing the kernel (:func:`refimpl.ops.sparse_matmul`).
The mechanism is :mod:`refimpl.layers.partial`.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl._checks import describe
from refimpl.layers import _products
from refimpl.layers._pieces import (
    _check_constraint,
    _composing,
    _splittable_regularizer,
)
from refimpl.layers.partial import _PLAIN_TO_PARTIAL, PartialWeightMixin
from refimpl.masks import mask_shape, to_mask
from refimpl.ops import LAYER_MODES, check_mode, sparse_matmul

__all__ = ["PartialDense"]


@keras.saving.register_keras_serializable(package="refimpl")
class PartialDense(PartialWeightMixin, keras.layers.Dense):
    """A ``keras.layers.Dense`` whose kernel is trainable only in a mask.

    The partial class of
    `Dense <https://keras.io/api/layers/core_layers/dense/>`__: what
    :func:`refimpl.partialize <refimpl.convert.partialize>` and
    :func:`~refimpl.layers.enable.enable_partial` make of a Dense layer, and the
    layer to build from a mask. The ``Dense`` arguments work as for Dense, with
    two limits: a ``kernel_regularizer`` must be elementwise (L1, L2 or L1L2),
    and a ``kernel_constraint`` must act on each entry alone (``NonNeg``);
    others raise ``ValueError``. The kernel initializer draws the whole
    starting kernel (the frozen entries and the free values' start).

    Args:
        units: the output size, as for Dense.
        trainable_mask: the trainable kernel entries: a boolean mask of shape
            ``[input_dim, units]`` or an index list of shape ``[k, 2]``.
        mode: the form (see :ref:`the forms <api-forms>`); ``"slices"`` for
            whole rows, columns or a block of the kernel.
        rest_trainable: whether the bias trains (``False`` is what
            :func:`refimpl.partialize <refimpl.convert.partialize>` gives a converted
            layer).
        **kwargs: every other ``keras.layers.Dense`` argument.

    Loading a saved layer also passes ``num_free`` and ``auto``; you never pass
    them. (They rebuild a :term:`shell`, an empty layer with ``num_free`` free
    values whose positions and values come with the saved weights, and
    ``auto`` says whether its mode was ``"auto"``.)

    Attributes:
        partial_free: the trainable weight: the ``k`` free values in the order
            of ``partial_positions`` (kernel-sized in the ``"select"`` form).
        partial_positions: the non-trainable weight of the free entries' flat
            row-major positions in the kernel (int32; int64 above 2**31
            entries).

    The classes that :func:`refimpl.partialize <refimpl.convert.partialize>`
    makes for other layers (``PartialConv2D``, ...) hold the same two weights;
    they are made from a built layer, by ``partialize`` or
    :func:`~refimpl.layers.enable.enable_partial`, not constructed directly.
    Besides :meth:`from_dense` and ``kernel``, every member (``trainable_mask``,
    ``num_free``, ``partial_mode``, ``base_weight``, ``product_mode``,
    ``freeze_rest``, ``fold``, ``to_dense``) is that of every partial layer:
    see :class:`~refimpl.layers.partial.PartialWeightMixin`.

    >>> from refimpl import PartialDense
    >>> layer = PartialDense(2, [[0, 0], [2, 1]], use_bias=False)
    >>> layer.build((None, 3))
    >>> [(w.name, tuple(w.shape), w.trainable) for w in layer.weights]
    [('kernel', (3, 2), False), ('partial_free', (2,), True), \
('partial_positions', (2,), False)]
    """

    kernel = _composing(keras.layers.Dense, "kernel")
    _partial_sparse_product = True

    def __init__(
        self,
        units,
        trainable_mask=None,
        *,
        mode: str = "delta",
        num_free: int | None = None,
        auto: bool = False,
        rest_trainable: bool = True,
        **kwargs,
    ):
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)):
            raise TypeError(
                f"`units` must be a positive int. Received: units={describe(units)}"
            )
        super().__init__(int(units), **kwargs)
        check_mode(mode, allowed=LAYER_MODES)
        shape = None if trainable_mask is None else mask_shape(trainable_mask)
        if shape is not None and shape[1:] != (self.units,):
            raise ValueError(
                f"`trainable_mask` must have shape [input_dim, {self.units}]. "
                f"Received a mask of shape {shape}"
            )
        if trainable_mask is None and num_free is None:
            raise ValueError(
                "`trainable_mask` is required: a boolean mask of shape "
                f"[input_dim, {self.units}] or an index list of shape [k, 2]. "
                "Received: trainable_mask=None"
            )
        if trainable_mask is not None and num_free is not None:
            raise ValueError(
                "`num_free` is only for a shell rebuilt from a config, which has "
                "no `trainable_mask`: give one or the other. "
                f"Received: num_free={describe(num_free)} with a trainable_mask"
            )
        _check_constraint(self.kernel_constraint, self.name)
        regularizer = self.kernel_regularizer
        if not _splittable_regularizer(regularizer):
            raise ValueError(
                "`kernel_regularizer` must be elementwise (L1, L2 or L1L2) to be "
                "split between free and frozen entries. Received: "
                f"kernel_regularizer={type(regularizer).__name__}"
            )
        if not isinstance(rest_trainable, bool):
            raise TypeError(
                "`rest_trainable` must be True or False. "
                f"Received: rest_trainable={describe(rest_trainable)}"
            )
        self._partial_rest_frozen = not rest_trainable
        self._partial_given = (trainable_mask, mode)
        self._partial_shell = None
        if trainable_mask is None:
            self._partial_shell = (num_free, mode, bool(auto))

    def build(self, input_shape):
        keras.layers.Dense.build(self, input_shape)
        shell = getattr(self, "_partial_shell", None)
        given = getattr(self, "_partial_given", (None, None))
        if shell is not None:
            self._partial_add_weights(shell[0], None, shell[1], shell[2])
        elif given[0] is not None:
            shape = tuple(self._kernel.shape)
            mask = to_mask(given[0], shape, name="trainable_mask")
            positions = np.flatnonzero(mask)
            self._partial_add_weights(len(positions), positions, given[1], False)
        if self._partial_rest_frozen:
            self.freeze_rest()

    def call(self, inputs, training=None):
        if _products.takes_over(self):
            return _products.output(self, inputs)
        if (
            getattr(self, "partial_free", None) is None
            or self.product_mode() != "sparse"
        ):
            return super().call(inputs, training=training)
        self._partial_check_loaded()
        x = sparse_matmul(
            inputs,
            self._kernel.value,
            self.partial_positions.value,
            self.partial_free.value,
        )
        if self.bias is not None:
            x = keras.ops.add(x, self.bias)
        return self.activation(x) if self.activation is not None else x

    @classmethod
    def from_config(cls, config):
        """A shell of the saved layer; its values come with its weights.

        Returns:
            An unbuilt ``PartialDense``, usable once its weights load.
        """
        return cls(**config)

    @classmethod
    def from_dense(cls, dense, trainable_mask, *, mode: str = "delta") -> PartialDense:
        """A partial copy of a built ``keras.layers.Dense``; ``dense`` is unchanged.

        Returns:
            A built ``PartialDense`` whose kernel, bias and outputs equal the
            Dense layer's, bit for bit.

        >>> from refimpl import PartialDense
        >>> dense = keras.layers.Dense(2)
        >>> dense.build((None, 3))
        >>> layer = PartialDense.from_dense(dense, np.eye(3, 2, dtype=bool))
        >>> kernel = keras.ops.convert_to_numpy(layer.kernel)
        >>> bool(np.array_equal(kernel, keras.ops.convert_to_numpy(dense.kernel)))
        True
        """
        if type(dense) is not keras.layers.Dense or not dense.built:
            raise TypeError(
                "`dense` must be a built keras.layers.Dense. "
                f"Received: dense={describe(dense)}"
            )
        kernel_shape = tuple(dense.kernel.shape)
        to_mask(trainable_mask, kernel_shape, name="trainable_mask")  # names it
        copy = keras.layers.Dense.from_config(dense.get_config())
        copy.build_from_config(dense.get_build_config())
        copy.set_weights([np.array(w) for w in dense.get_weights()])
        from refimpl.layers.enable import enable_partial

        enable_partial(copy, trainable_mask, mode=mode)
        return copy


_PLAIN_TO_PARTIAL[keras.layers.Dense] = PartialDense
