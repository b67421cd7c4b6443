"""What the partial mechanism refuses, and what a key reaches.

A partial layer refuses LoRA: Keras' ``enable_lora`` on the layer, and
keras-hub's ``Backbone.enable_lora`` on a converted backbone (before it
changes anything) or on the backbone of a converted task model; converting a
layer that LoRA or quantization has changed is refused before anything is
converted. A key that names a wrapper (``TimeDistributed``,
``Bidirectional``, a user's ``keras.layers.Wrapper``) reaches the layer it
wraps.
"""

import os

import keras
import keras_hub
import numpy as np
import pytest

import refimpl
from refimpl import selection
from tests.models import partial_layers

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
IDS = RNG.integers(0, 50, (2, 8))
GPT2_INPUTS = {"token_ids": IDS, "padding_mask": np.ones_like(IDS)}
TINY = {
    "vocabulary_size": 50, "num_heads": 2, "hidden_dim": 16,
    "intermediate_dim": 32, "max_sequence_length": 16, "dropout": 0.0,
}  # fmt: skip


def _random(fraction=0.3, seed=0):
    return lambda w: selection.random_mask(w.shape, fraction=fraction, seed=seed)


def _numpy(value):
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return np.array(keras.ops.convert_to_numpy(value))


def _state(model):
    """Every variable's path, trainable flag and value, and each layer's LoRA."""
    variables = [(v.path, v.trainable, _numpy(v)) for v in model.variables]
    lora = [
        layer.path
        for layer in refimpl._compat.sub_layers(model)
        if getattr(layer, "lora_enabled", False)
    ]
    return variables, lora, type(model).__name__


def _assert_same_state(before, after):
    (variables, lora, name), (variables_after, lora_after, name_after) = (
        before,
        after,
    )
    assert (lora_after, name_after) == (lora, name)
    assert [v[:2] for v in variables_after] == [v[:2] for v in variables]
    for (_, _, a), (_, _, b) in zip(variables, variables_after):
        np.testing.assert_array_equal(a, b)


def _gpt2_backbone():
    keras.utils.set_random_seed(0)
    return keras_hub.models.GPT2Backbone(num_layers=2, **TINY)


# -- LoRA on a partial layer -----------------------------------------------------

# The classes whose Keras layer has `enable_lora`: a layer built, and its input.
LORA_LAYERS = {
    "Dense": (lambda: keras.layers.Dense(3), (None, 4)),
    "EinsumDense": (
        lambda: keras.layers.EinsumDense("ab,bc->ac", output_shape=3),
        (None, 4),
    ),
    "Embedding": (lambda: keras.layers.Embedding(5, 3), (None,)),
    "Conv2D": (lambda: keras.layers.Conv2D(3, 2), (None, 4, 4, 2)),
}


@pytest.mark.parametrize("name", list(LORA_LAYERS))
def test_enable_lora_on_a_partial_layer_is_refused(name):
    make, shape = LORA_LAYERS[name]
    layer = make()
    layer.build(shape)
    refimpl.enable_partial(layer, _random()(_numpy(layer.weights[0])))
    weights = [w.name for w in layer.weights]
    with pytest.raises(ValueError, match=r"LoRA cannot be enabled.*merge"):
        layer.enable_lora(2)
    assert [w.name for w in layer.weights] == weights
    assert not layer.lora_enabled


@pytest.mark.parametrize("key", ["query", "value"])
def test_backbone_enable_lora_on_a_converted_backbone_is_refused_before_any_change(
    key,
):
    converted = refimpl.partialize(_gpt2_backbone(), {key: _random(0.1)})
    before = _state(converted)
    outputs = _numpy(converted.predict(GPT2_INPUTS, verbose=0))
    with pytest.raises(ValueError, match=r"LoRA.*Nothing was changed"):
        converted.enable_lora(2)
    _assert_same_state(before, _state(converted))
    np.testing.assert_array_equal(
        _numpy(converted.predict(GPT2_INPUTS, verbose=0)), outputs
    )


def test_backbone_enable_lora_on_the_layers_left_plain_still_works():
    converted = refimpl.partialize(_gpt2_backbone(), {"query": _random(0.1)})
    converted.enable_lora(2, target_layer_names=["value"])
    lora = [
        layer.name
        for layer in refimpl._compat.sub_layers(converted)
        if getattr(layer, "lora_enabled", False)
    ]
    assert lora == ["value", "value"]


def test_enable_lora_on_the_backbone_of_a_converted_task_model_is_refused():
    backbone = _gpt2_backbone()
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    converted = refimpl.partialize(model, {"query": _random(0.1)})
    # The task model's backbone keeps its plain class: keras-hub's loop runs
    # until it reaches a partial layer, which refuses.
    with pytest.raises(ValueError, match=r"LoRA cannot be enabled.*query"):
        converted.backbone.enable_lora(2)
    assert all(
        not getattr(layer, "lora_enabled", False) for layer in partial_layers(converted)
    )


# -- converting a layer that LoRA or quantization changed -------------------------


def _two_dense(change):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="a"),
         keras.layers.Dense(2, name="b")]
    )  # fmt: skip
    if change == "lora":
        model.get_layer("b").enable_lora(1)
    else:
        model.get_layer("b").quantize(change)
    return model


# (int8 and int4 combine with a partial weight: tests/test_quantized_base.py)
@pytest.mark.parametrize("change", ["lora", "float8"])
@pytest.mark.parametrize("in_place", [False, True])
def test_partialize_of_a_lora_or_quantized_layer_is_refused_before_any_change(
    change, in_place
):
    model = _two_dense(change)
    before = _state(model)
    what = "LoRA" if change == "lora" else "float8"
    with pytest.raises(ValueError, match=rf"`layer_masks\['b'\]`.*{what}"):
        refimpl.partialize(model, {"a": [[0, 0]], "b": [[0, 0]]}, in_place=in_place)
    assert [type(layer).__name__ for layer in model.layers] == ["Dense", "Dense"]
    _assert_same_state(before, _state(model))


def test_partialize_of_a_lora_backbone_names_lora():
    backbone = _gpt2_backbone()
    backbone.enable_lora(2)
    with pytest.raises(ValueError, match=r"`layer_masks\['query'\]`.*LoRA"):
        refimpl.partialize(backbone, {"query": _random(0.1)})


# -- a key that names a wrapper ---------------------------------------------------


@keras.saving.register_keras_serializable(package="test_closed_mechanism")
class Doubled(keras.layers.Wrapper):
    """A user's wrapper: twice the wrapped layer's output."""

    def call(self, inputs):
        return 2.0 * self.layer(inputs)

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)


# name: (the wrapper around its layer, the input shape without the batch)
WRAPPERS = {
    "time_distributed_dense": (
        lambda: keras.layers.TimeDistributed(keras.layers.Dense(3), name="w"),
        (3, 5),
    ),
    "time_distributed_conv2d": (
        lambda: keras.layers.TimeDistributed(keras.layers.Conv2D(2, 2), name="w"),
        (3, 4, 4, 2),
    ),
    "bidirectional_lstm": (
        lambda: keras.layers.Bidirectional(keras.layers.LSTM(2), name="w"),
        (3, 5),
    ),
    "user_wrapper_dense": (lambda: Doubled(keras.layers.Dense(3), name="w"), (5,)),
}


def _wrapped_model(name):
    make, shape = WRAPPERS[name]
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape)
    h = keras.layers.Flatten()(make()(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(h))


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_a_key_naming_a_wrapper_reaches_the_layer_it_wraps(name, tmp_path):
    model = _wrapped_model(name)
    x = RNG.normal(size=(4, *model.input_shape[1:])).astype("float32")
    y = RNG.normal(size=(4, 2)).astype("float32")
    expected = _numpy(model.predict(x, verbose=0))
    converted = refimpl.partialize(model, {"w": _random()}, train=["head"])
    layers = partial_layers(converted)
    wrapped = converted.get_layer("w")
    inner = (
        [wrapped.forward_layer.cell, wrapped.backward_layer.cell]
        if isinstance(wrapped, keras.layers.Bidirectional)
        else [wrapped.layer]
    )
    assert {id(layer) for layer in layers} == {id(layer) for layer in inner}
    np.testing.assert_array_equal(_numpy(converted.predict(x, verbose=0)), expected)

    bases = [_numpy(layer.partial_weight.base) for layer in layers]
    converted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    converted.fit(x, y, epochs=1, batch_size=4, verbose=0)
    for layer, base in zip(layers, bases):
        kernel = _numpy(getattr(layer, layer._partial_target))
        mask = layer.partial_weight.mask
        np.testing.assert_array_equal(kernel[~mask], base[~mask])
        assert np.any(kernel[mask] != base[mask])
    trained = _numpy(converted.predict(x, verbose=0))

    path = os.path.join(tmp_path, "converted.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_numpy(loaded.predict(x, verbose=0)), trained)

    merged = refimpl.merge(converted)
    assert not partial_layers(merged)
    assert all(
        type(layer).__module__.split(".")[0] != "refimpl"
        for layer in refimpl._compat.sub_layers(merged)
    )
    np.testing.assert_array_equal(_numpy(merged.predict(x, verbose=0)), trained)
