"""A Dense layer of which only the kernel entries in a mask are trainable.

:class:`PartialDense` is the layer form of :class:`refimpl.PartialVariable`:
its kernel *is* one (a sub-layer named ``kernel``), so the frozen base, the
free positions and the free values are weights, saved in the weights file and
never in the config. It is importable from :mod:`refimpl.layers` with the
structured layers.
"""

from __future__ import annotations

import keras
import numpy as np

from refimpl._layer_base import StructuredDense, copy_bias, dense_arguments, input_dim
from refimpl.masks import mask_shape, to_mask
from refimpl.variables import PartialVariable, _mode_for

__all__ = ["PartialDense"]


@keras.saving.register_keras_serializable(package="refimpl")
class PartialDense(StructuredDense):
    """A Dense layer of which only the kernel entries in a mask are trainable.

    The kernel is a :class:`refimpl.PartialVariable` (``layer.partial_kernel``):
    a frozen base with the free values written over it. With ``mode="delta"``
    (the default, exact under every optimizer) the only trainable kernel
    weight holds exactly the ``k`` free values, in the row-major order of the
    mask. ``mode="sparse"`` has the same weights and computes the product
    without composing the kernel (``x @ base`` plus a sparse product of the
    free values, :meth:`refimpl.PartialVariable.matmul`): the fastest form
    when a few percent or fewer of the entries are free.
    ``mode="select"`` keeps a kernel-sized trainable weight with a
    filtered update (``summary()`` then counts every entry); ``"auto"`` picks
    one of the three by density (:func:`refimpl.choose_mode`).

    Args:
        units: the output size, a positive int.
        trainable_mask: the trainable kernel entries: a boolean mask of shape
            ``[input_dim, units]`` or an index list of shape ``[k, 2]``.
        activation: as for ``keras.layers.Dense``.
        use_bias: add a (fully trainable) bias (default ``True``).
        kernel_initializer: draws the whole starting kernel: the frozen
            entries and the free values' starting point.
        bias_initializer, bias_regularizer, bias_constraint: for the bias.
        mode: ``"delta"``, ``"sparse"``, ``"select"`` or ``"auto"``.
        num_free: only with ``trainable_mask=None``: the number of free
            entries of a layer whose mask comes with its saved weights (what
            ``from_config`` builds; the config holds no arrays).
        **kwargs: base ``Layer`` arguments.

    Raises:
        TypeError, ValueError: for ``units`` that is not a positive int, an
            unknown ``mode``, or a mask that does not fit.

    >>> layer = PartialDense(2, [[0, 0], [2, 1]], use_bias=False)
    >>> layer.build((None, 3))
    >>> [(w.name, tuple(w.shape), w.trainable) for w in layer.weights]
    [('free', (2,), True), ('base', (3, 2), False), ('positions', (2,), False)]
    """

    def __init__(
        self,
        units: int,
        trainable_mask=None,
        *,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        bias_regularizer=None,
        bias_constraint=None,
        mode: str = "delta",
        num_free: int | None = None,
        auto: bool = False,
        **kwargs,
    ):
        super().__init__(
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            bias_regularizer=bias_regularizer,
            bias_constraint=bias_constraint,
            **kwargs,
        )
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)):
            raise TypeError(
                f"`units` must be a positive int. Received: units={units!r}"
            )
        if units <= 0:
            raise ValueError(f"`units` must be a positive int. Received: units={units}")
        if mode not in ("auto", "delta", "select", "sparse"):
            raise ValueError(
                "`mode` must be 'auto', 'delta', 'sparse' or 'select'. "
                f"Received: mode={mode!r}"
            )
        if trainable_mask is None and num_free is None:
            raise ValueError(
                "`trainable_mask` is required: a boolean mask of shape "
                f"[input_dim, {int(units)}] or an index list of shape [k, 2]. "
                "Received: trainable_mask=None"
            )
        if trainable_mask is not None and num_free is not None:
            raise ValueError(
                "`num_free` is only for a layer rebuilt from a config, which has "
                "no `trainable_mask`: give one or the other. "
                f"Received: num_free={num_free!r} with a trainable_mask"
            )
        self.units = int(units)
        self.mode = mode
        self.num_free = num_free
        self._auto = auto
        self._given_mask = trainable_mask
        shape = None if trainable_mask is None else mask_shape(trainable_mask)
        if shape is not None and shape[1:] != (self.units,):
            raise ValueError(
                f"`trainable_mask` must have shape [input_dim, {self.units}]. "
                f"Received a mask of shape {shape}"
            )

    def build(self, input_shape):
        n = input_dim(input_shape)
        if self._given_mask is None:
            mode, auto = self.mode, self._auto
            if mode == "auto":  # by density, as the mask's own choice was
                mode = _mode_for(self.num_free, (n, self.units), jit_compile=False)
                auto = mode != "select"
            self.partial_kernel = PartialVariable(
                shape=(n, self.units),
                num_free=self.num_free,
                mode=mode,
                auto=auto,
                name="kernel",
                dtype=self.variable_dtype,
            )
        else:
            mask = to_mask(self._given_mask, (n, self.units), name="trainable_mask")
            initial = self.kernel_initializer(
                (n, self.units), dtype=self.variable_dtype
            )
            self.partial_kernel = PartialVariable(
                keras.ops.convert_to_numpy(initial),
                mask,
                mode=self.mode,
                name="kernel",
                dtype=self.variable_dtype,
            )
        self._build_bias(n, self.units)

    @classmethod
    def from_dense(cls, dense, trainable_mask, *, mode: str = "delta") -> PartialDense:
        """Copy a built ``keras.layers.Dense``, leaving only ``trainable_mask`` free.

        The new layer's kernel, bias and outputs equal the Dense layer's, bit
        for bit; it keeps the Dense layer's name, dtype policy, activation and
        bias/activity regularizers and constraints.

        Raises:
            TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
            ValueError: if it has a kernel regularizer or constraint, or the
                mask does not fit its kernel.

        >>> dense = keras.layers.Dense(2)
        >>> dense.build((None, 3))
        >>> layer = PartialDense.from_dense(dense, np.eye(3, 2, dtype=bool))
        >>> kernel = keras.ops.convert_to_numpy(layer.kernel)
        >>> bool(np.array_equal(kernel, keras.ops.convert_to_numpy(dense.kernel)))
        True
        """
        kernel, kwargs = dense_arguments(dense)
        shape = mask_shape(trainable_mask, name="trainable_mask")
        if shape is not None and shape != kernel.shape:
            raise ValueError(
                f"`trainable_mask` must have the kernel's shape {kernel.shape}. "
                f"Received a mask of shape {shape}"
            )
        layer = cls(
            kernel.shape[1],
            trainable_mask,
            mode=mode,
            kernel_initializer=keras.initializers.Constant(kernel),
            **kwargs,
        )
        layer.build((None, kernel.shape[0]))
        layer.kernel_initializer = keras.initializers.get("glorot_uniform")
        copy_bias(layer, dense)
        return layer

    @property
    def free(self):
        """The trainable weight of the kernel (the free values)."""
        return self.partial_kernel.free

    @property
    def base(self):
        """The frozen base of the kernel (a non-trainable weight)."""
        return self.partial_kernel.base

    @property
    def resolved_mode(self) -> str:
        """``"delta"``, ``"sparse"`` or ``"select"``: what ``"auto"`` resolved to."""
        return self.partial_kernel.mode

    def _units_for(self, n):
        return self.units

    def _product(self, x, dtype):
        return keras.ops.cast(
            self.partial_kernel.matmul(keras.ops.cast(x, dtype)), dtype
        )

    def _kernel(self, dtype):
        return keras.ops.cast(self.partial_kernel.value(), dtype)

    def _trainable_mask(self):
        return self.partial_kernel.mask

    def get_config(self) -> dict:
        num_free = self.num_free
        mode, auto = self.mode, self._auto
        if self.built:
            num_free, mode = self.partial_kernel.num_free, self.partial_kernel.mode
            auto = self.partial_kernel.auto
        elif self._given_mask is not None:
            num_free = _count(self._given_mask)
        config = {
            "units": self.units,
            "trainable_mask": None,
            "mode": mode,
            "num_free": num_free,
            "auto": bool(auto),
        }
        return {**super().get_config(), **config}


def _count(mask) -> int:
    """The number of free entries of a mask or index list, before any shape."""
    array = np.asarray(keras.ops.convert_to_numpy(mask))
    if array.dtype == bool or np.issubdtype(array.dtype, np.floating):
        return int((array != 0).sum())
    return int(array.shape[0]) if array.size else 0
