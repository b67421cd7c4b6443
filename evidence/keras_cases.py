"""The Keras-level builders of the registry's techniques, for ``model.fit``.

Everything here is ``keras`` and ``refimpl``'s Keras-level API, with no
TensorFlow import, so :mod:`evidence.backend_matrix` runs it on every Keras
backend. Each builder takes the initial kernel and an optimizer and returns
``(model, optimizer, trainable mask)``; the model's layer ``"dense"`` holds
the kernel the matrix checks.
"""

from __future__ import annotations

import keras
import numpy as np

import refimpl

N_IN, N_OUT = 6, 4
#: The trainable entries of the 6 x 4 kernel (and, for the structured
#: layers, their structure on a 6 x 6 kernel).
MASK = refimpl.selection.random_mask((N_IN, N_OUT), fraction=0.25, seed=3)


def _dense(init, **kwargs):
    layer = keras.layers.Dense(
        init.shape[1],
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(init),
        name="dense",
        **kwargs,
    )
    return keras.Sequential([keras.Input((init.shape[0],)), layer])


def partialize(init, optimizer):
    return refimpl.partialize(_dense(init), {"dense": MASK}), optimizer, MASK


def partial_dense(mode):
    def build(init, optimizer):
        start = keras.initializers.Constant(init)
        layer = refimpl.PartialDense(
            N_OUT,
            MASK,
            mode=mode,
            use_bias=False,
            kernel_initializer=start,
            name="dense",
        )
        return keras.Sequential([keras.Input((N_IN,)), layer]), optimizer, MASK

    return build


#: Whole rows of the 6 x 4 kernel (input features 1 and 4), for the slices form.
ROWS = np.repeat(np.isin(np.arange(N_IN), [1, 4])[:, None], N_OUT, axis=1)


def slices(init, optimizer):
    start = keras.initializers.Constant(init)
    layer = refimpl.PartialDense(
        N_OUT,
        ROWS,
        mode="slices",
        use_bias=False,
        kernel_initializer=start,
        name="dense",
    )
    return keras.Sequential([keras.Input((N_IN,)), layer]), optimizer, ROWS


def freeze_entries(init, optimizer):
    model = _dense(init, kernel_constraint=refimpl.FreezeEntries(init, MASK))
    return model, optimizer, MASK


def masked_optimizer(restore_frozen):
    def build(init, optimizer):
        model = _dense(init)
        kernel = model.get_layer("dense").kernel
        wrapped = refimpl.MaskedOptimizer(
            optimizer, [(kernel, MASK)], restore_frozen=restore_frozen
        )
        return model, wrapped, MASK

    return build


def structured(layer_class, structure):
    def build(init, optimizer):
        model = keras.Sequential([keras.Input((N_IN,)), layer_class(name="dense")])
        return model, optimizer, structure

    return build


def diagonal(init, optimizer):
    return structured(refimpl.DiagonalDense, np.eye(N_IN, dtype=bool))(init, optimizer)


def banded(init, optimizer):
    band = refimpl.selection.band_mask((N_IN, N_IN), 1, 1)
    make = lambda name: refimpl.BandedDense(1, 1, name=name)  # noqa: E731
    return structured(make, band)(init, optimizer)
