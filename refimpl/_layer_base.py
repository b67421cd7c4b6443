"""The shared base of the layers in :mod:`refimpl.layers`, and their argument checks."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


class StructuredDense(keras.layers.Layer):
    """``activation(x @ kernel + bias)``; subclasses say how ``x @ kernel`` runs."""

    def __init__(
        self, *, activation, use_bias, kernel_initializer, bias_initializer, **kwargs
    ):
        super().__init__(**kwargs)
        if not isinstance(use_bias, bool):
            raise TypeError(
                f"`use_bias` must be a bool. Received: use_bias={use_bias!r}"
            )
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.input_spec = keras.layers.InputSpec(min_ndim=2)

    def _build_bias(self, input_dim: int, units: int) -> None:
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(units,), initializer=self.bias_initializer
            )
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})

    def call(self, inputs):
        y = self._product(inputs, self.compute_dtype)
        if self.bias is not None:
            y = y + tf.cast(self.bias, self.compute_dtype)
        return self.activation(y) if self.activation is not None else y

    @property
    def kernel(self) -> tf.Tensor:
        """The dense kernel ``[input_dim, units]``, in the variable dtype."""
        if not self.built:
            raise AttributeError("Build the layer before reading its `kernel`.")
        return self._kernel(self.variable_dtype)

    @property
    def trainable_mask(self) -> np.ndarray:
        """Boolean mask of the kernel's shape, ``True`` where an entry is free."""
        if not self.built:
            raise AttributeError("Build the layer before reading `trainable_mask`.")
        return self._trainable_mask()

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self._units_for(input_shape[-1]))

    def get_config(self) -> dict:
        config = {
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
        }
        return {**super().get_config(), **config}


def input_dim(input_shape) -> int:
    n = input_shape[-1] if len(input_shape) else None
    if n is None:
        raise ValueError(
            "The last dimension of the input must be known. Received an input "
            f"of shape {tuple(input_shape)}"
        )
    return int(n)


def non_negative_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
    if value < 0:
        raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value}")
    return int(value)


def float_array(value, name: str, *, max_ndim: int) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"`{name}` must be numeric. Received: {name}={value!r}"
        ) from err
    if array.ndim > max_ndim:
        raise ValueError(
            f"`{name}` must have at most {max_ndim} dimension(s). "
            f"Received shape {array.shape}"
        )
    return array


def block_sizes(sizes, count: int, name: str):
    if sizes is None:
        return [None] * count
    if not isinstance(sizes, (list, tuple)) or len(sizes) != count:
        raise ValueError(
            f"`{name}` must be a list of {count} positive ints, one per "
            f"block {name[:3]}. Received: {name}={sizes!r}"
        )
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0:
            raise ValueError(
                f"`{name}` must hold positive ints. Received: {name}={sizes!r}"
            )
    return [int(s) for s in sizes]


def parse_grid(blocks, row_sizes, col_sizes):
    """Validate a block grid; return it (arrays, None, "trainable") and sizes."""
    if not (
        isinstance(blocks, (list, tuple))
        and blocks
        and all(isinstance(r, (list, tuple)) and r for r in blocks)
        and len({len(r) for r in blocks}) == 1
    ):
        raise ValueError(
            "`blocks` must be a rectangular, non-empty list of "
            f"non-empty lists of blocks. Received: blocks={blocks!r}"
        )
    grid = []
    for i, row in enumerate(blocks):
        grid.append([])
        for j, b in enumerate(row):
            if isinstance(b, str) and b != "trainable":
                raise ValueError(
                    f"A block is None, 'trainable' or a 2-D array. "
                    f"Received: blocks[{i}][{j}]={b!r}"
                )
            if b is not None and not isinstance(b, str):
                b = float_array(b, f"blocks[{i}][{j}]", max_ndim=2)
                if b.ndim != 2 or 0 in b.shape:
                    raise ValueError(
                        f"A fixed block must be a non-empty 2-D array. "
                        f"Received: blocks[{i}][{j}].shape={b.shape}"
                    )
            grid[-1].append(b)
    heights = block_sizes(row_sizes, len(grid), "row_sizes")
    widths = block_sizes(col_sizes, len(grid[0]), "col_sizes")
    for i, row in enumerate(grid):
        for j, b in enumerate(row):
            if isinstance(b, np.ndarray):
                for sizes, k, axis, what in (
                    (heights, i, 0, "row"),
                    (widths, j, 1, "column"),
                ):
                    if sizes[k] is None:
                        sizes[k] = b.shape[axis]
                    elif sizes[k] != b.shape[axis]:
                        raise ValueError(
                            f"The blocks of block {what} {k} must share one "
                            f"{'height' if axis == 0 else 'width'}, {sizes[k]}. "
                            f"Received: blocks[{i}][{j}].shape={b.shape}"
                        )
    for sizes, what, arg in (
        (heights, "row", "row_sizes"),
        (widths, "column", "col_sizes"),
    ):
        if None in sizes:
            raise ValueError(
                f"Block {what} {sizes.index(None)} has no fixed block, so its size "
                f"is unknown; give it in `{arg}`. Received: {arg}=None"
            )
    return grid, heights, widths


def array_shape(mask) -> tuple[int, ...] | None:
    """The shape of a boolean or 0/1 float mask; ``None`` for index lists."""
    try:
        array = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
    except (TypeError, ValueError):
        return None  # to_mask reports it, with the tensor's shape, when built
    if array.size and (array.dtype == bool or np.issubdtype(array.dtype, np.floating)):
        return array.shape
    return None


def listed(value):
    if hasattr(value, "numpy"):
        value = value.numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [listed(v) for v in value]
    return value
