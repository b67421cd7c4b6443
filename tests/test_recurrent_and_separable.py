"""Layers with two weights that can be partial: RNN cells and separable convolutions.

A key names the RNN layer (its cell's kernel), a weight through the RNN layer
(``"lstm/recurrent_kernel"``) or a ``Bidirectional`` wrapper (both
directions); a ``SeparableConv``'s depthwise or pointwise kernel by its path.
Training is exact under AdamW with weight decay, and the model reloads and
merges back into Keras' own classes.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.layers.partial import PartialWeightMixin

pytestmark = pytest.mark.every_backend

X = np.random.default_rng(0).normal(size=(4, 3, 5)).astype("float32")
TARGETS = [np.ones((4, 4), "float32"), np.ones((4, 6), "float32")]


def _random(seed):
    return lambda w: selection.random_mask(w.shape, fraction=0.3, seed=seed)


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3, 5))
    h = keras.layers.LSTM(4, name="lstm", return_sequences=True)(inputs)
    h = keras.layers.SimpleRNN(3, name="rnn", return_sequences=True)(h)
    out = keras.layers.Bidirectional(keras.layers.GRU(2), name="bi")(h)
    conv = keras.layers.SeparableConv1D(3, 2, name="sep")(inputs)
    return keras.Model(inputs, [out, keras.layers.Flatten()(conv)])


MASKS = {
    "lstm/recurrent_kernel": _random(0),
    "rnn": _random(1),
    "bi": _random(2),
    "sep/pointwise_kernel": _random(3),
}


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _partial(model):
    return [
        layer
        for layer in refimpl._compat.sub_layers(model)
        if isinstance(layer, PartialWeightMixin)
    ]


@pytest.mark.slow
def test_each_key_reaches_the_weight_it_names_and_training_is_exact(tmp_path):
    model = _model()
    converted = refimpl.partialize(model, MASKS)
    for a, b in zip(converted.predict(X, verbose=0), model.predict(X, verbose=0)):
        np.testing.assert_array_equal(a, b)
    chosen = sorted(
        (type(layer).__name__, layer._partial_target) for layer in _partial(converted)
    )
    assert chosen == [
        ("PartialGRUCell", "kernel"),
        ("PartialGRUCell", "kernel"),
        ("PartialLSTMCell", "recurrent_kernel"),
        ("PartialSeparableConv1D", "pointwise_kernel"),
        ("PartialSimpleRNNCell", "kernel"),
    ]
    layers = _partial(converted)
    before = [_numpy(getattr(layer, layer._partial_target)) for layer in layers]
    converted.compile(keras.optimizers.AdamW(0.1, weight_decay=0.5), ["mse", "mse"])
    converted.fit(X, TARGETS, epochs=3, verbose=0)
    for start, layer in zip(before, layers, strict=True):
        after = _numpy(getattr(layer, layer._partial_target))
        refimpl.testing.assert_frozen(start, after, layer.partial_weight.mask)
        assert refimpl.testing.moved(start, after)[layer.partial_weight.mask].all()
    free = sum(layer.partial_weight.num_free for layer in layers)
    assert refimpl.testing.count_free_parameters(converted) == free
    path = tmp_path / "rnn.keras"
    converted.save(path)
    loaded = keras.saving.load_model(path)
    for a, b in zip(loaded.predict(X, verbose=0), converted.predict(X, verbose=0)):
        np.testing.assert_array_equal(a, b)
    merged = refimpl.merge(loaded)
    assert not _partial(merged)
    for a, b in zip(merged.predict(X, verbose=0), converted.predict(X, verbose=0)):
        np.testing.assert_array_equal(a, b)


def test_a_weight_the_layer_does_not_have_is_named_in_the_error():
    model = _model()
    cell = model.get_layer("lstm").cell
    with pytest.raises(ValueError, match=r"`weight` must be one of \['kernel', "):
        refimpl.enable_partial(cell, np.ones((5, 16), bool), weight="bias")
