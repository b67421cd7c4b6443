"""Quantized sub-layers that a layer's config does not describe.

``model.quantize("int8")`` quantizes a ``MultiHeadAttention``'s projections,
but the attention layer's config records none of it: a copy rebuilt from the
config (``partialize``, ``merge``) or a model loaded from ``.keras`` builds
float projections. ``partialize`` and ``merge`` quantize the copy's
sub-layers as the source's, and a converted model's file records them, so
that every way out keeps Keras' codes and scales bit for bit.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.partial import partial_weights
from tests.processes import run_python

pytestmark = [
    pytest.mark.every_backend,
    pytest.mark.skipif(
        keras.backend.backend() == "torch",
        reason="a quantized base's product reads NumPy values under PyTorch's autograd",
    ),
]

RNG = np.random.default_rng(0)
X = RNG.integers(0, 50, (16, 8))
Y = RNG.integers(0, 50, (16, 8))
PROJECTIONS = ("query", "key", "value", "attention_output")


def _numpy(value):
    return np.array(keras.ops.convert_to_numpy(value))


def _model():
    """An embedding, a self-attention and a Dense head, as in a language model."""
    keras.utils.set_random_seed(0)
    t = keras.Input((8,), dtype="int32")
    h = keras.layers.Embedding(50, 16, name="emb")(t)
    a = keras.layers.MultiHeadAttention(2, 8, name="att")(h, h)
    return keras.Model(t, keras.layers.Dense(50, name="head")(h + a))


def _quantized():
    model = _model()
    model.quantize("int8")
    return model


def _masks():
    def pick(seed):
        return lambda w: selection.random_mask(w.shape, fraction=0.1, seed=seed)

    return {"query": pick(0), "head": pick(1)}


def _projections(model):
    att = model.get_layer("att")
    layers = (att.query_dense, att.key_dense, att.value_dense, att.output_dense)
    return dict(zip(PROJECTIONS, layers))


def _codes_and_scales(model):
    """Every integer code array and scale of the model's quantized layers, by path."""
    return {
        v.path: _numpy(v)
        for v in model.weights
        if str(v.dtype) == "int8" or v.path.endswith("_scale")
    }


def _fit(model, epochs=2):
    model.compile(
        keras.optimizers.Adam(0.05),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(X, Y, epochs=epochs, batch_size=8, verbose=0, shuffle=False)
    return model


def test_partialize_of_a_quantized_attention_model_predicts_as_it_bit_for_bit():
    # Before: Keras' "You called `set_weights(weights)` on layer 'att' with a
    # weight list of length 12, but the layer was expecting 8 weights": the
    # copy's attention had float projections.
    model = _quantized()
    converted = refimpl.partialize(model, _masks())
    for name, layer in _projections(converted).items():
        assert layer.quantization_mode == "int8", name
    query = converted.get_layer("att").query_dense
    assert query.partial_weight.quantized is not None
    before = _codes_and_scales(model)
    after = _codes_and_scales(converted)
    assert before.keys() == after.keys()
    for name in PROJECTIONS:
        assert {f"att/{name}/kernel", f"att/{name}/kernel_scale"} <= before.keys()
    for path, array in before.items():
        np.testing.assert_array_equal(after[path], array, err_msg=path)
    np.testing.assert_array_equal(
        converted.predict(X, verbose=0), model.predict(X, verbose=0)
    )


def test_a_converted_quantized_attention_model_trains_with_codes_and_scales_unchanged():
    converted = refimpl.partialize(_quantized(), _masks())
    before = _codes_and_scales(converted)
    free = [_numpy(pw.free) for pw in partial_weights(converted)]
    _fit(converted)
    for path, array in _codes_and_scales(converted).items():
        np.testing.assert_array_equal(array, before[path], err_msg=path)
    for pw, start in zip(partial_weights(converted), free):
        assert not np.array_equal(_numpy(pw.free), start), pw.owner.path


_LOAD_AND_PREDICT = """
import sys, numpy as np, keras
import refimpl  # noqa: F401  (its registered names)
model = keras.saving.load_model(sys.argv[1])
np.save(sys.argv[2], model.predict(np.load(sys.argv[3]), verbose=0))
att = model.get_layer("att")
print(type(att).__name__, type(att.query_dense).__name__,
      [att.key_dense.quantization_mode, att.query_dense.quantization_mode])
"""


def test_a_trained_quantized_attention_model_reloads_bit_for_bit(tmp_path):
    # Before: "Layer 'key' expected 2 variables, but received 0 variables
    # during loading": the loaded attention rebuilt float projections.
    converted = _fit(refimpl.partialize(_quantized(), _masks()))
    path = str(tmp_path / "converted.keras")
    converted.save(path)
    want = converted.predict(X, verbose=0)
    reloaded = keras.saving.load_model(path)
    state = _codes_and_scales(converted)
    assert _codes_and_scales(reloaded).keys() == state.keys()
    for path_, array in _codes_and_scales(reloaded).items():
        np.testing.assert_array_equal(array, state[path_], err_msg=path_)
    for one, two in zip(partial_weights(reloaded), partial_weights(converted)):
        np.testing.assert_array_equal(_numpy(one.free), _numpy(two.free))
    np.testing.assert_array_equal(reloaded.predict(X, verbose=0), want)
    # A fresh process, which has made none of refimpl's classes yet.
    np.save(tmp_path / "x.npy", X)
    out = run_python(_LOAD_AND_PREDICT, path, tmp_path / "y.npy", tmp_path / "x.npy")
    assert "PartialMultiHeadAttention PartialEinsumDense ['int8', 'int8']" in out
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_merge_of_a_quantized_attention_model_folds_the_trained_projection():
    converted = _fit(refimpl.partialize(_quantized(), _masks()))
    folded = {pw.owner.name: pw.folded() for pw in partial_weights(converted)}
    state = _codes_and_scales(converted)
    merged = refimpl.merge(converted)
    att = merged.get_layer("att")
    assert type(att) is keras.layers.MultiHeadAttention
    projections = _projections(merged)
    assert projections["query"].quantization_mode is None
    np.testing.assert_array_equal(_numpy(projections["query"].kernel), folded["query"])
    np.testing.assert_array_equal(
        _numpy(merged.get_layer("head").kernel), folded["head"]
    )
    for name in ("key", "value", "attention_output"):  # untouched: still Keras'
        layer = projections[name]
        assert layer.quantization_mode == "int8", name
        for v in (layer._kernel, layer.kernel_scale):
            np.testing.assert_array_equal(_numpy(v), state[v.path], err_msg=v.path)
    # The float projection drops the int8 rounding of the query's inputs only.
    unmerged = converted.predict(X, verbose=0)
    change = np.abs(merged.predict(X, verbose=0) - unmerged).max()
    assert change / np.abs(unmerged).max() < 0.02


def test_merge_requantize_of_a_quantized_attention_model_quantizes_it_again():
    converted = _fit(refimpl.partialize(_quantized(), _masks()))
    merged = refimpl.merge(converted, requantize=True)
    for name, layer in _projections(merged).items():
        assert type(layer) is keras.layers.EinsumDense, name
        assert layer.quantization_mode == "int8", name
    assert merged.get_layer("head").quantization_mode == "int8"
    unmerged = converted.predict(X, verbose=0)
    change = np.abs(merged.predict(X, verbose=0) - unmerged).max()
    # At most what quantizing the float merge costs against it.
    floating = refimpl.merge(converted)
    floating_out = floating.predict(X, verbose=0)
    requantized = refimpl.merge(converted)
    requantized.quantize("int8", filters=lambda layer: not layer.quantization_mode)
    rounding = np.abs(floating_out - requantized.predict(X, verbose=0)).max()
    assert change <= 2 * rounding + 1e-6


def test_both_orders_on_an_attention_model_give_the_same_codes_scales_and_outputs():
    first = refimpl.partialize(_quantized(), _masks())
    second = refimpl.partialize(_model(), _masks())
    second.quantize("int8")
    for name, layer in _projections(second).items():
        assert layer.quantization_mode == "int8", name
    for one, two in zip(partial_weights(first), partial_weights(second)):
        assert one.owner.path == two.owner.path
        assert [v.path for v in one.owner.weights] == [
            v.path for v in two.owner.weights
        ]
        # partialize-first keeps the free entries' float values
        one.free.assign(_numpy(two.free))
    state = _codes_and_scales(second)
    assert _codes_and_scales(first).keys() == state.keys()
    for path, array in _codes_and_scales(first).items():
        np.testing.assert_array_equal(array, state[path], err_msg=path)
    np.testing.assert_array_equal(
        first.predict(X, verbose=0), second.predict(X, verbose=0)
    )


@keras.saving.register_keras_serializable("test_quantized_attention")
class Towers(keras.layers.Layer):
    """Sums ``towers`` Dense layers; its config records ``units`` only, so a
    copy rebuilt from it has one tower."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.towers = 1

    def build(self, shape):
        self.dense = [keras.layers.Dense(self.units) for _ in range(self.towers)]
        for layer in self.dense:
            layer.build(shape)

    def call(self, x):
        return sum(layer(x) for layer in self.dense)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_a_layer_rebuilt_with_other_quantized_sub_layers_is_refused_naming_it():
    # Before: Keras' "set_weights(weights) on layer 'towers' with a weight
    # list of length 6, but the layer was expecting 2 weights".
    keras.utils.set_random_seed(0)
    x = keras.Input((8,))
    towers = Towers(name="towers")
    towers.towers = 2
    model = keras.Model(x, keras.layers.Dense(3, name="head")(towers(x)))
    model.quantize("int8")
    for what in (refimpl.partialize, refimpl.merge):
        args = ({"head": [[0, 0]]},) if what is refimpl.partialize else ()
        with pytest.raises(ValueError, match="'towers'.*other sub-layers.*in_place"):
            what(model, *args)


@pytest.mark.slow
def test_a_quantized_keras_hub_task_is_copied_with_its_quantized_head(tmp_path):
    # The task's config does not record its quantized head either. Before:
    # partialize refused it ("rebuilt from its config lacks weights it has:
    # ['logits/kernel_scale']"), and a converted task could not be copied.
    import keras_hub

    keras.utils.set_random_seed(0)
    tiny = {
        "vocabulary_size": 50, "num_heads": 2, "hidden_dim": 16,
        "intermediate_dim": 32, "max_sequence_length": 16, "dropout": 0.0,
    }  # fmt: skip
    backbone = keras_hub.models.BertBackbone(num_layers=1, **tiny)
    model = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0
    )
    model.quantize("int8")
    ids = RNG.integers(0, 50, (4, 8))
    x = {
        "token_ids": ids,
        "padding_mask": np.ones_like(ids),
        "segment_ids": np.zeros_like(ids),
    }
    converted = refimpl.partialize(model, {"query": [[0, 0, 0]], "logits": [[1, 2]]})
    assert converted.get_layer("logits").partial_weight.quantized is not None
    want = model.predict(x, verbose=0)
    np.testing.assert_array_equal(converted.predict(x, verbose=0), want)
    path = str(tmp_path / "task.keras")
    converted.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), want)
    merged = refimpl.merge(reloaded, requantize=True)
    assert merged.get_layer("logits").quantization_mode == "int8"
