"""The shared base of the layers in :mod:`refimpl.layers`, and their argument checks."""

from __future__ import annotations

import keras
import numpy as np

from refimpl import _compat, backend
from refimpl._checks import describe
from refimpl.layers._arguments import _copy

# Dense arguments a kernel built from its structure cannot take.
_NOT_FOR_STRUCTURE = (
    "kernel_regularizer",
    "kernel_constraint",
    "lora_rank",
    "lora_alpha",
    "quantization_config",
)


class StructuredDense(keras.layers.Dense):
    """A ``keras.layers.Dense`` whose kernel is built from the values of its structure.

    It is Dense, ``activation(x @ kernel + bias)``, with what differs
    overridden: ``build`` creates only the structure's values (fixed ones as
    non-trainable weights, never ``get_config`` entries), ``kernel`` builds
    the dense kernel from them, and ``call`` multiplies by the structure
    without building it. The contract of a subclass: ``build`` (ending in
    ``_build_bias``), ``_product(x, dtype)``, ``_kernel(dtype)``,
    ``_trainable_mask()`` and ``_units_for(n)``; ``from_dense`` copies a
    built Dense and ``to_dense()`` (here) returns one.
    """

    def __init__(
        self,
        *,
        activation=None,
        use_bias=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        bias_regularizer=None,
        bias_constraint=None,
        units=None,
        **kwargs,
    ):
        if not isinstance(use_bias, bool):
            raise TypeError(
                f"`use_bias` must be a bool. Received: use_bias={describe(use_bias)}"
            )
        for name in _NOT_FOR_STRUCTURE:
            value = kwargs.pop(name, None)
            if value is not None:
                raise ValueError(
                    f"`{name}` does not apply to {type(self).__name__}, whose "
                    "kernel is built from the values of its structure. "
                    f"Received: {name}={describe(value)}"
                )
        # Dense wants its units now; a square layer knows them when built.
        super().__init__(
            units or 1,
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            bias_regularizer=bias_regularizer,
            bias_constraint=bias_constraint,
            **kwargs,
        )
        self.units = units
        # The names of fixed weights whose values come with the saved weights
        # (a shell's), checked once before the first use.
        self._from_weights: list = []

    def _check_loaded(self) -> None:
        if self._from_weights and all(
            np.all(np.isnan(backend.read_now(getattr(self, name))))
            for name in self._from_weights
        ):
            raise _compat.require_loaded(f"Layer '{self.name}'")
        self._from_weights = []

    def _build_bias(self, input_dim: int, units: int) -> None:
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias",
                shape=(units,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
            )
        self.units = units
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def call(self, inputs, training=None):
        self._check_loaded()
        y = self._product(inputs, self.compute_dtype)
        if self.bias is not None:
            y = y + keras.ops.cast(self.bias, self.compute_dtype)
        return self.activation(y) if self.activation is not None else y

    @property
    def kernel(self):
        """The dense kernel ``[input_dim, units]``, in the variable dtype.

        Raises:
            AttributeError: if the layer is not built (as ``keras.layers.Dense``).
        """
        if not self.built:
            raise AttributeError(
                f"Build the layer before reading `kernel`. Received: {self.name!r}, "
                "not built"
            )
        self._check_loaded()
        return self._kernel(self.variable_dtype)

    @property
    def trainable_mask(self) -> np.ndarray:
        """Boolean mask of the kernel's shape, ``True`` where an entry is free.

        Returns:
            A NumPy ``bool`` array of shape ``[input_dim, units]``.

        Raises:
            AttributeError: if the layer is not built.
        """
        if not self.built:
            raise AttributeError(
                "Build the layer before reading `trainable_mask`. "
                f"Received: {self.name!r}, not built"
            )
        return self._trainable_mask()

    def to_dense(self) -> keras.layers.Dense:
        """Return a plain ``keras.layers.Dense`` with this layer's kernel and bias.

        The Dense layer has the same name, dtype policy, activation, bias
        regularizer and constraint, and activity regularizer. Its kernel and
        bias equal this layer's bit for bit. A diagonal's output agrees bit for
        bit too (one non-zero term per output entry, as :func:`refimpl.merge
        <refimpl.convert.merge>` says); the band's and the blocks' products add
        in another order than a dense product, so their outputs agree to
        rounding.

        Returns:
            A new, built ``keras.layers.Dense``; this layer is unchanged.

        Raises:
            ValueError: if the layer is not built.

        >>> from refimpl import DiagonalDense
        >>> layer = DiagonalDense()  # the diagonal starts at ones
        >>> layer.build((None, 3))
        >>> dense = layer.to_dense()
        >>> type(dense).__name__, dense.get_weights()[0].astype(int)
        ('Dense', array([[1, 0, 0],
               [0, 1, 0],
               [0, 0, 1]]))
        """
        if not self.built:
            raise ValueError(
                f"Build the layer before calling `to_dense()`. Received: {self.name!r}"
            )
        kernel = keras.ops.convert_to_numpy(self.kernel)
        dense = keras.layers.Dense(
            kernel.shape[1],
            activation=self.activation,
            use_bias=self.use_bias,
            bias_regularizer=self.bias_regularizer,
            bias_constraint=self.bias_constraint,
            activity_regularizer=self.activity_regularizer,
            dtype=self.dtype_policy,
            name=self.name,
        )
        dense.build((None, kernel.shape[0]))
        dense.kernel.assign(_copy(kernel))
        if self.use_bias:
            dense.bias.assign(_copy(self.bias))
        return dense

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self._units_for(input_shape[-1]))

    # Dense saves and loads `_kernel` and the bias; these layers save their own
    # weights, as any Keras layer does.
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)

    def enable_lora(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} trains only the values of its structure; LoRA "
            "adds a dense update. Call `to_dense()` first for a LoRA Dense layer."
        )

    def quantize(self, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} has no dense kernel to quantize. Call "
            "`to_dense()` first."
        )

    def get_config(self) -> dict:
        config = super().get_config()  # Dense's, less what does not apply
        for name in ("units", *_NOT_FOR_STRUCTURE):
            config.pop(name, None)
        return config
