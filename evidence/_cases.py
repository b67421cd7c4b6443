"""Set up each technique of the exactness matrix on one square weight.

Private to :mod:`refimpl.exactness`. Each setup takes the starting weight,
the boolean mask and the compute dtype, and returns ``(variables, output,
weight, apply)``: the variables the optimizer gets, the forward pass
``x -> y``, a function returning the dense weight, and a custom update (or
``None`` for ``optimizer.apply_gradients``).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from refimpl.constraints import FreezeEntries
from refimpl.masked_optimizer import apply_masked_gradients
from refimpl.layers import BandedDense, PartialDense
from refimpl.stop_gradient import one_hot_trainable, partially_trainable
from refimpl.variables import PartialVariable


def band_widths(mask: np.ndarray) -> tuple[int, int]:
    offsets = np.subtract(*np.nonzero(mask)[::-1])  # column - row
    lower = int(max(0, -offsets.min())) if offsets.size else 0
    upper = int(max(0, offsets.max())) if offsets.size else 0
    n = mask.shape[0]
    band = np.tril(np.triu(np.ones((n, n), bool), -lower), upper)
    if not np.array_equal(mask, band):
        raise ValueError(
            "For the BandedDense layer, `mask` must be a full band around the "
            f"main diagonal. Received a mask with {int(mask.sum())} entries "
            f"that is not the band of widths lower={lower}, upper={upper}"
        )
    return lower, upper


def _matmul(weight, compute):
    def output(x):
        return tf.matmul(tf.cast(x, compute), tf.cast(weight(), compute))

    return output


def _full(wrap, masked_apply=None):
    """A full tf.Variable: the gradient blocked, or masked when it is applied."""

    def build(init, mask, compute):
        w = tf.Variable(init)
        if masked_apply is None:
            return [w], _matmul(lambda: wrap(w, mask), compute), w.read_value, None

        def apply(opt, grads):
            apply_masked_gradients(opt, [(grads[0], w)], [mask], **masked_apply)

        return [w], _matmul(w.read_value, compute), w.read_value, apply

    return build


def _separate(init, mask, compute):
    # The free values in one variable (the optimizer's var_list), the frozen
    # ones in another that no optimizer gets; dynamic_stitch copies values.
    flat, at = init.reshape(-1), [np.flatnonzero(mask), np.flatnonzero(~mask)]
    free = tf.Variable(flat[at[0]], name="free")
    frozen = tf.Variable(flat[at[1]], trainable=False, name="frozen")

    def weight():
        return tf.reshape(tf.dynamic_stitch(at, [free, frozen]), init.shape)

    return [free], _matmul(weight, compute), weight, None


def _partial_variable(init, mask, compute):
    v = PartialVariable(init, mask, mode="delta")
    return [v.free], _matmul(v.value, compute), v.value, None


def _layer(make):
    def build(init, mask, compute):
        layer = make(
            init, mask, "float32" if compute == "float32" else f"mixed_{compute}"
        )
        if not layer.built:
            layer.build((None, init.shape[0]))
        return layer.trainable_weights, layer, lambda: layer.kernel, None

    return build


def _constraint(init, mask, policy):
    # The Keras way: a constraint on the kernel, applied after every update.
    return keras.layers.Dense(
        init.shape[1],
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(init),
        kernel_constraint=FreezeEntries(mask, init),
        dtype=policy,
    )


def _partial_dense(init, mask, policy):
    constant = keras.initializers.Constant(init)
    return PartialDense(
        init.shape[1], mask, use_bias=False, kernel_initializer=constant, dtype=policy
    )


def _banded_dense(init, mask, policy):
    lower, upper = band_widths(mask)
    layer = BandedDense(lower, upper, dtype=policy)
    layer.build((None, init.shape[0]))
    offsets = [k for k in range(-lower, upper + 1) if k != 0]
    if offsets:  # start from the band of `init`, lowest offset first
        layer.off_diagonals.assign(
            np.concatenate([np.diagonal(init, k) for k in offsets])
        )
    layer.diagonal.assign(np.diagonal(init))
    return layer


CASES = {
    "mask stop_gradient": _full(partially_trainable),
    "one-hot stop_gradient": _full(one_hot_trainable),
    "gradient masking": _full(None, {"restore_frozen": False}),
    "gradient masking + restore_frozen": _full(None, {"restore_frozen": True}),
    "FreezeEntries constraint": _layer(_constraint),
    "separate variables": _separate,
    "PartialVariable (delta)": _partial_variable,
    "PartialDense layer": _layer(_partial_dense),
    "BandedDense layer": _layer(_banded_dense),
}
