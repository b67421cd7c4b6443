"""Partial layers inside other layers: attention, keras-hub models, wrappers.

Each model is converted as a user would, trained, saved as ``.keras`` and
reloaded (same outputs; training continues exactly), then merged: the merged
model holds only Keras and keras-hub classes at every depth, predicts the
same, and its file loads in a process where ``refimpl`` cannot be imported.
The models are random-init keras-hub backbones and task models of a tiny
size, a plain Keras ``MultiHeadAttention``, ``TimeDistributed`` and a model
nested in a model.
"""

import keras
import keras_hub
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.layers.partial import PartialWeightMixin
from refimpl.partial import partial_weights
from tests.processes import WITHOUT_REFIMPL, run_python

# Whole transformers and keras-hub models: `make test` runs them, `make check` not.
pytestmark = [pytest.mark.tensorflow_only, pytest.mark.slow]

RNG = np.random.default_rng(0)
IDS = RNG.integers(0, 50, (4, 8))


def _random(fraction, seed):
    return lambda w: selection.random_mask(w.shape, fraction=fraction, seed=seed)


def _mha():
    keras.utils.set_random_seed(0)
    x = keras.Input((4, 8))
    h = keras.layers.MultiHeadAttention(2, 4, name="mha")(x, x)
    model = keras.Model(x, keras.layers.Dense(3, name="head")(h))
    data = RNG.normal(size=(8, 4, 8)).astype("float32")
    return model, {"mha/query/kernel": _random(0.2, 0)}, data


# No dropout in the keras-hub models: two copies that continue training must
# draw the same numbers, and a dropout layer's seed state is not saved.
TINY = {
    "vocabulary_size": 50, "num_heads": 2, "hidden_dim": 16,
    "intermediate_dim": 32, "max_sequence_length": 16, "dropout": 0.0,
}  # fmt: skip


def _gpt2():
    keras.utils.set_random_seed(0)
    model = keras_hub.models.GPT2Backbone(num_layers=2, **TINY)
    masks = {
        "feedforward_intermediate_dense": _random(0.1, 0),
        "query": _random(0.1, 1),
    }
    return model, masks, {"token_ids": IDS, "padding_mask": np.ones_like(IDS)}


def _bert_classifier():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(num_layers=1, **TINY)
    model = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0
    )
    masks = {"segment_embedding": _random(0.5, 0), "value": _random(0.1, 2)}
    inputs = {
        "token_ids": IDS,
        "segment_ids": np.zeros_like(IDS),
        "padding_mask": np.ones_like(IDS),
    }
    return model, masks, inputs


def _time_distributed():
    keras.utils.set_random_seed(0)
    x = keras.Input((3, 5))
    layer = keras.layers.TimeDistributed(keras.layers.Dense(2, name="inner"), name="td")
    model = keras.Model(x, layer(x))
    return model, {"inner": [[0, 0], [4, 1]]}, RNG.normal(size=(4, 3, 5)).astype("f4")


def _nested():
    keras.utils.set_random_seed(0)
    inner = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, name="a"),
         keras.layers.Dense(2, name="b")],
        name="sub",
    )  # fmt: skip
    x = keras.Input((5,))
    model = keras.Model(x, keras.layers.Dense(1, name="top")(inner(x)))
    masks = {"a": np.eye(5, 4, dtype=bool), "b": [[0, 0]]}
    return model, masks, RNG.normal(size=(4, 5)).astype("float32")


MODELS = {
    "multi_head_attention": _mha,
    "gpt2_backbone": _gpt2,
    "bert_text_classifier": _bert_classifier,
    "time_distributed": _time_distributed,
    "nested_model": _nested,
}


def _numpy(value):
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return np.asarray(keras.ops.convert_to_numpy(value))


def _predict(model, inputs):
    return _numpy(model.predict(inputs, verbose=0))


def _equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    else:
        np.testing.assert_array_equal(a, b)


def _target(outputs):
    return (
        {k: np.ones_like(v) for k, v in outputs.items()}
        if isinstance(outputs, dict)
        else np.ones_like(outputs)
    )


def _step(model, inputs, target):
    model.fit(inputs, target, epochs=1, batch_size=len(IDS), verbose=0, shuffle=False)


def _refimpl_classes(model):
    return [
        f"{layer.path or layer.name} ({type(layer).__name__})"
        for layer in [model, *refimpl._compat.sub_layers(model)]
        if type(layer).__module__.split(".")[0] == "refimpl"
    ]


@pytest.mark.parametrize("name", MODELS)
def test_converts_trains_reloads_continues_exactly_and_merges(name, tmp_path):
    model, masks, inputs = MODELS[name]()
    original = _predict(model, inputs)
    converted = refimpl.partialize(model, masks)
    assert partial_weights(converted)
    _equal(_predict(converted, inputs), original)
    # The rest is frozen: only the chosen entries train.
    free = sum(weight.num_free for weight in partial_weights(converted))
    assert refimpl.testing.count_free_parameters(converted) == free
    target = _target(original)
    converted.compile(keras.optimizers.AdamW(0.05, weight_decay=0.1), "mse", metrics=[])
    _step(converted, inputs, target)
    path = tmp_path / "converted.keras"
    converted.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(converted)
    _equal(_predict(loaded, inputs), _predict(converted, inputs))
    for a, b in zip(loaded.weights, converted.weights, strict=True):
        assert a.trainable == b.trainable, a.path
    if isinstance(loaded, keras_hub.models.Task):
        # A keras-hub task's own `compile` is not restored by `load_model`
        # (Keras warns): compile both afresh, then continue from the weights.
        for m in (converted, loaded):
            m.compile(keras.optimizers.AdamW(0.05, weight_decay=0.1), "mse", metrics=[])
    # Training continues exactly (with the optimizer state of the file).
    _step(converted, inputs, target)
    _step(loaded, inputs, target)
    for a, b in zip(loaded.weights, converted.weights, strict=True):
        np.testing.assert_array_equal(_numpy(a), _numpy(b), err_msg=a.path)
    merged = refimpl.merge(loaded)
    assert _refimpl_classes(merged) == []
    _equal(_predict(merged, inputs), _predict(converted, inputs))
    # The converted model itself is untouched by merge.
    assert any(
        isinstance(layer, PartialWeightMixin)
        for layer in refimpl._compat.sub_layers(loaded)
    )


def test_in_place_conversion_of_a_keras_hub_model_merges(tmp_path):
    model, masks, inputs = _bert_classifier()
    original = _predict(model, inputs)
    same = refimpl.partialize(model, masks, in_place=True)
    assert same is model
    _equal(_predict(model, inputs), original)
    merged = refimpl.merge(model)
    assert type(merged) is keras_hub.models.BertTextClassifier
    assert _refimpl_classes(merged) == []
    _equal(_predict(merged, inputs), original)
    refimpl.merge(model, in_place=True)
    assert _refimpl_classes(model) == []
    _equal(_predict(model, inputs), original)


class SubclassedAttention(keras.Model):
    def __init__(self):
        super().__init__()
        self.mha = keras.layers.MultiHeadAttention(2, 4)
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return self.head(self.mha(x, x))


def test_a_subclassed_model_merges_in_place_only():
    keras.utils.set_random_seed(0)
    model = SubclassedAttention()
    x = RNG.normal(size=(2, 3, 4)).astype("float32")
    original = _predict(model, x)
    refimpl.partialize(model, {"query": _random(0.3, 0)}, in_place=True)
    with pytest.raises(TypeError, match="in_place=True"):
        refimpl.merge(model)
    refimpl.merge(model, in_place=True)
    assert _refimpl_classes(model) == []
    _equal(_predict(model, x), original)


_LOAD_AND_PREDICT = """
import sys, numpy as np
import keras, keras_hub
folder = sys.argv[1]
for name in sys.argv[2:]:
    model = keras.saving.load_model(f"{folder}/{name}.keras")
    inputs = np.load(f"{folder}/{name}-x.npz")
    inputs = dict(inputs) if "arr_0" not in inputs else inputs["arr_0"]
    out = model.predict(inputs, verbose=0)
    want = np.load(f"{folder}/{name}-y.npz")
    if isinstance(out, dict):
        for key in out:
            np.testing.assert_array_equal(np.asarray(out[key]), want[key])
    else:
        np.testing.assert_array_equal(out, want["arr_0"])
    print(name, "loaded")
"""
_WITHOUT_REFIMPL = WITHOUT_REFIMPL + _LOAD_AND_PREDICT


def _save_with_outputs(model, inputs, folder, name):
    model.save(folder / f"{name}.keras")
    for what, value in (("x", inputs), ("y", _predict(model, inputs))):
        arrays = value if isinstance(value, dict) else {"arr_0": value}
        np.savez(folder / f"{name}-{what}.npz", **arrays)


def test_converted_files_load_in_a_fresh_process(tmp_path):
    # A fresh process has made no host or on-demand class yet: the file must
    # load by the registered names alone (a keras-hub task model that holds a
    # `PartialGPT2Backbone` did not).
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(num_layers=1, **TINY)
    converted = refimpl.partialize(
        backbone, {"query": _random(0.2, 0), "token_embedding": _random(0.1, 1)}
    )
    task = keras_hub.models.GPT2CausalLM(backbone=converted, preprocessor=None)
    inputs = {"token_ids": IDS, "padding_mask": np.ones_like(IDS)}
    _save_with_outputs(task, inputs, tmp_path, "gpt2_causal_lm")
    names = ["gpt2_causal_lm"]
    for name, make in MODELS.items():
        model, masks, inputs = make()
        _save_with_outputs(refimpl.partialize(model, masks), inputs, tmp_path, name)
        names.append(name)
    out = run_python("import refimpl\n" + _LOAD_AND_PREDICT, tmp_path, *names)
    assert out.count("loaded") == len(names)


def test_merged_files_load_where_refimpl_cannot_be_imported(tmp_path):
    for name, make in MODELS.items():
        model, masks, inputs = make()
        converted = refimpl.partialize(model, masks)
        converted.compile("adam", "mse", metrics=[])
        _step(converted, inputs, _target(_predict(model, inputs)))
        _save_with_outputs(refimpl.merge(converted), inputs, tmp_path, name)
    out = run_python(_WITHOUT_REFIMPL, tmp_path, *MODELS)
    assert out.count("loaded") == len(MODELS)


def test_new_token_rows_of_the_tied_embedding_train_and_only_they(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=53, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16, dropout=0.0,
    )  # fmt: skip
    rows = np.zeros((53, 16), bool)
    rows[50:] = True  # three new tokens
    converted = refimpl.partialize(backbone, {"token_embedding": rows})
    model = keras_hub.models.GPT2CausalLM(backbone=converted, preprocessor=None)
    ids = RNG.integers(0, 53, (4, 8))
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    table = converted.token_embedding
    before = _numpy(table.embeddings)
    model.compile(keras.optimizers.AdamW(0.05, weight_decay=0.1), metrics=[])
    model.fit(inputs, ids, epochs=2, batch_size=4, verbose=0)
    after = _numpy(table.embeddings)
    refimpl.testing.assert_frozen(before, after, rows)
    assert refimpl.testing.moved(before, after)[rows].all()
    assert refimpl.testing.count_free_parameters(model) == rows.sum()
    # The free rows serve the output projection too (the tied logits).
    path = tmp_path / "tokens.npz"
    refimpl.save_partial_weights(converted, path)
    keras.utils.set_random_seed(0)
    plain = keras_hub.models.GPT2Backbone(**backbone.get_config())
    refimpl.load_partial_weights(plain, path)
    again = keras_hub.models.GPT2CausalLM(backbone=plain, preprocessor=None)
    _equal(_predict(again, inputs), _predict(model, inputs))


def test_the_trained_entries_file_is_no_larger_than_lora_at_equal_count(tmp_path):
    model, _, _ = _gpt2()
    model.enable_lora(rank=2)
    lora_count = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    model.save_lora_weights(str(tmp_path / "adapters.lora.h5"))
    lora_bytes = (tmp_path / "adapters.lora.h5").stat().st_size
    # The same number of trained values, spread over the same kernels.
    model, _, _ = _gpt2()
    kernels = [
        layer.name
        for layer in refimpl._compat.sub_layers(model)
        if layer.name in ("query", "value")
    ]
    assert kernels
    sizes = [16 * 16] * len(kernels)
    fraction = lora_count / sum(sizes)
    converted = refimpl.partialize(model, {"query": _random(fraction, 0),
                                           "value": _random(fraction, 1)})  # fmt: skip
    path = tmp_path / "entries.npz"
    refimpl.save_partial_weights(converted, path)
    k = refimpl.testing.count_free_parameters(converted)
    assert abs(k - lora_count) <= len(kernels) * 2  # rounding per kernel
    assert path.stat().st_size <= lora_bytes
