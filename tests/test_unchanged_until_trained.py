"""Every layer type partialize converts: outputs unchanged until it trains.

For each class of :func:`refimpl.layers.partial.supported_classes`, and each of
its weights that can be partial, a small model is converted with the rest
frozen (partialize's default), and its outputs, from a direct call and from
``predict``, equal the plain model's bit for bit, on the backend of the run.

Under PyTorch, ``torch.matmul`` multiplies a 3-D tensor by a weight in one
product when the weight requires a gradient, and in a batched product when it
does not, and the two round differently. Keras' LSTM and GRU multiply the whole
sequence by the cell's input kernel so: a partial recurrent kernel froze that
kernel, and 26 of 48 outputs of an LSTM were one float32 ulp off.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.layers.partial import partial_class, supported_classes

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
# Batch and time above one (the sequence an RNN multiplies is strided), and
# sizes at which PyTorch's two products of a 3-D tensor by a weight round
# differently on the CPU.
SEQUENCE = RNG.normal(size=(4, 5, 5)).astype("float32")
IMAGES = RNG.normal(size=(4, 6, 6, 3)).astype("float32")
VOLUMES = RNG.normal(size=(2, 4, 4, 4, 3)).astype("float32")
TOKENS = RNG.integers(0, 10, size=(4, 5)).astype("int32")


def _sequential(layer, x):
    return keras.Sequential([keras.Input(x.shape[1:], dtype=x.dtype), layer]), x


def _reversible(x):
    tokens = keras.Input(x.shape[1:], dtype="int32")
    table = keras.layers.ReversibleEmbedding(10, 4, name="target")
    return keras.Model(tokens, table(table(tokens), reverse=True)), x


L = keras.layers
# One model per class, its converted layer named "target" (an RNN layer
# around a cell).
BUILDERS = {
    L.Dense: lambda: _sequential(L.Dense(6, name="target"), SEQUENCE),
    L.EinsumDense: lambda: _sequential(
        L.EinsumDense("abc,cd->abd", (5, 6), bias_axes="d", name="target"), SEQUENCE
    ),
    L.Conv1D: lambda: _sequential(L.Conv1D(4, 3, name="target"), SEQUENCE),
    L.Conv2D: lambda: _sequential(L.Conv2D(4, 3, name="target"), IMAGES),
    L.Conv3D: lambda: _sequential(L.Conv3D(2, 2, name="target"), VOLUMES),
    L.Conv1DTranspose: lambda: _sequential(
        L.Conv1DTranspose(4, 3, name="target"), SEQUENCE
    ),
    L.Conv2DTranspose: lambda: _sequential(
        L.Conv2DTranspose(4, 3, name="target"), IMAGES
    ),
    L.Conv3DTranspose: lambda: _sequential(
        L.Conv3DTranspose(2, 2, name="target"), VOLUMES
    ),
    L.DepthwiseConv1D: lambda: _sequential(
        L.DepthwiseConv1D(3, depth_multiplier=2, name="target"), SEQUENCE
    ),
    L.DepthwiseConv2D: lambda: _sequential(
        L.DepthwiseConv2D(3, depth_multiplier=2, name="target"), IMAGES
    ),
    L.SeparableConv1D: lambda: _sequential(
        L.SeparableConv1D(4, 3, depth_multiplier=2, name="target"), SEQUENCE
    ),
    L.SeparableConv2D: lambda: _sequential(
        L.SeparableConv2D(4, 3, depth_multiplier=2, name="target"), IMAGES
    ),
    L.Embedding: lambda: _sequential(L.Embedding(10, 4, name="target"), TOKENS),
    L.ReversibleEmbedding: lambda: _reversible(TOKENS),
    L.SimpleRNNCell: lambda: _sequential(
        L.SimpleRNN(4, return_sequences=True, name="target"), SEQUENCE
    ),
    L.LSTMCell: lambda: _sequential(
        L.LSTM(4, return_sequences=True, name="target"), SEQUENCE
    ),
    L.GRUCell: lambda: _sequential(
        L.GRU(4, return_sequences=True, name="target"), SEQUENCE
    ),
}

CASES = [
    pytest.param(cls, weight, id=f"{cls.__name__}-{weight}")
    for cls in BUILDERS
    for weight in partial_class(cls)._partial_attributes
]


def test_every_class_partialize_converts_has_a_case_here():
    made_at_import = {
        cls for cls in supported_classes() if not partial_class(cls)._partial_on_demand
    }
    assert made_at_import == set(BUILDERS)


def _outputs(model, x):
    return (
        keras.ops.convert_to_numpy(model(x)),
        model.predict(x, verbose=0, batch_size=len(x)),
    )


@pytest.mark.parametrize(("cls", "weight"), CASES)
def test_the_converted_model_gives_the_plain_outputs_bit_for_bit(cls, weight):
    keras.utils.set_random_seed(0)
    model, x = BUILDERS[cls]()
    key = f"target/{weight}"
    converted = refimpl.partialize(
        model, {key: lambda w: selection.random_mask(w.shape, fraction=0.3, seed=1)}
    )
    (pw,) = refimpl.partial.partial_weights(converted)
    assert pw.path.endswith(f"/{weight}")
    for got, expected in zip(_outputs(converted, x), _outputs(model, x), strict=True):
        np.testing.assert_array_equal(got, expected)
