"""The argument checks of the structured layers, and copying a built Dense."""

from __future__ import annotations

import keras
import numpy as np

from refimpl._blocks import block_sizes, check_rectangular
from refimpl._checks import describe
from refimpl.masks import as_array


def dense_arguments(dense, name: str = "dense") -> tuple[np.ndarray, dict]:
    """Check a built ``keras.layers.Dense``; return its kernel and layer arguments.

    Raises:
        TypeError: if ``dense`` is not a built ``keras.layers.Dense``.
        ValueError: if it has a kernel regularizer or kernel constraint, which
            a layer built from free values cannot carry over unchanged.
    """
    if not isinstance(dense, keras.layers.Dense) or not dense.built:
        raise TypeError(
            f"`{name}` must be a built keras.layers.Dense. Received: "
            f"{name}={describe(dense)}"
        )
    for option in ("kernel_regularizer", "kernel_constraint"):
        if getattr(dense, option) is not None:
            raise ValueError(
                f"`{name}` has a {option}, which refimpl's layers do not "
                "carry over: their kernel is built from free values. Remove it "
                f"(or use a bias/activity regularizer). Received: "
                f"{option}={describe(getattr(dense, option))}"
            )
    kwargs = {
        "activation": dense.activation,
        "use_bias": dense.use_bias,
        "bias_regularizer": dense.bias_regularizer,
        "bias_constraint": dense.bias_constraint,
        "activity_regularizer": dense.activity_regularizer,
        "dtype": dense.dtype_policy,
        "name": dense.name,
    }
    return keras.ops.convert_to_numpy(dense.kernel), kwargs


def check_outside(kernel: np.ndarray, keep: np.ndarray, project: bool, what: str):
    """Refuse a kernel with non-zero entries outside ``keep``, unless ``project``."""
    outside = kernel[~keep]
    if not project and outside.size and (outside != 0).any():
        raise ValueError(
            f"`dense` has {int((outside != 0).sum())} non-zero kernel entries "
            f"outside the {what} (largest magnitude "
            f"{float(np.abs(outside).max()):.3g}); the new layer cannot hold "
            "them. Pass `project=True` to drop them."
        )


def copy_bias(layer, dense) -> None:
    if dense.use_bias:
        layer.bias.assign(_copy(dense.bias))


def _copy(value) -> np.ndarray:
    # A copy, never the other variable's buffer: JAX's trainer donates a
    # model's buffers to its jitted step, which would free the shared one.
    return np.array(keras.ops.convert_to_numpy(value))


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
        raise TypeError(
            f"`{name}` must be an int >= 0. Received: {name}={describe(value)}"
        )
    if value < 0:
        raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value}")
    return int(value)


def float_array(value, name: str, *, max_ndim: int) -> np.ndarray:
    array = as_array(value, name, kind="numeric", what="numeric").astype(np.float64)
    if array.ndim > max_ndim:
        raise ValueError(
            f"`{name}` must have at most {max_ndim} dimension(s). "
            f"Received shape {array.shape}"
        )
    return array


def given_sizes(sizes, count: int, name: str):
    if sizes is None:
        return [None] * count
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of {count} positive ints, one per "
            f"block {name[:3]}. Received: {name}={describe(sizes)}"
        )
    if len(sizes) != count:
        raise ValueError(
            f"`{name}` must be a list of {count} positive ints, one per "
            f"block {name[:3]}. Received: {name}={describe(sizes)}"
        )
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(
                f"`{name}` must hold positive ints. Received: {name}={describe(sizes)}"
            )
        if s <= 0:
            raise ValueError(
                f"`{name}` must hold positive ints. Received: {name}={describe(sizes)}"
            )
    return [int(s) for s in sizes]


def parse_grid(blocks, row_sizes, col_sizes):
    """Validate a block grid; return it (arrays, None, strings) and sizes.

    A string entry is ``"trainable"`` or ``"fixed"`` (a fixed block whose
    values come with the saved weights); both need their sizes from the
    other blocks or from ``row_sizes``/``col_sizes``.
    """
    check_rectangular(blocks, "blocks")
    grid = []
    for i, row in enumerate(blocks):
        grid.append([])
        for j, b in enumerate(row):
            if isinstance(b, str) and b not in ("trainable", "fixed"):
                raise ValueError(
                    f"`blocks[{i}][{j}]` must be None, 'trainable', 'fixed' or "
                    f"a 2-D array. Received: blocks[{i}][{j}]={describe(b)}"
                )
            if b is not None and not isinstance(b, str):
                b = float_array(b, f"blocks[{i}][{j}]", max_ndim=2)
                if b.ndim != 2 or 0 in b.shape:
                    raise ValueError(
                        f"`blocks[{i}][{j}]` must be a non-empty 2-D array. "
                        f"Received: blocks[{i}][{j}].shape={b.shape}"
                    )
            grid[-1].append(b)
    shapes = [[b.shape if isinstance(b, np.ndarray) else None for b in r] for r in grid]
    heights, widths = block_sizes(
        shapes,
        "blocks",
        given_sizes(row_sizes, len(grid), "row_sizes"),
        given_sizes(col_sizes, len(grid[0]), "col_sizes"),
        size_names=("row_sizes", "col_sizes"),
    )
    return grid, heights, widths
