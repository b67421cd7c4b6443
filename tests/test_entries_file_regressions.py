"""The trained-entries file, where it once failed in silence.

``save_partial_weights``/``load_partial_weights`` keep a layer kept with
``train=`` whole (its moving statistics too), tell apart two layers of one
name in two sub-models, load the file of a wrapped or nested model onto the
plain model it started from, and save and load every dtype policy exactly.
"""

import json
import re

import keras
import numpy as np
import pytest

import refimpl
from refimpl import adapters, selection, trained_entries
from tests.models import partial_layers
from tests.processes import run_python

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
X = RNG.normal(size=(16, 6)).astype("float32")
Y = RNG.normal(size=(16, 2)).astype("float32")
SEQUENCES = RNG.normal(size=(8, 3, 6)).astype("float32")


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _random(fraction, seed):
    return lambda w: selection.random_mask(w.shape, fraction=fraction, seed=seed)


def _fit(model, x, y, optimizer=None):
    model.compile(optimizer or keras.optimizers.Adam(0.05), "mse")
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
    return model


def _assert_same_weights(model, other):
    for a, b in zip(model.weights, other.weights, strict=True):
        np.testing.assert_array_equal(_numpy(a), _numpy(b), err_msg=a.path)


def _assert_same_outputs(model, other, x):
    np.testing.assert_array_equal(
        _numpy(model.predict(x, verbose=0)), _numpy(other.predict(x, verbose=0))
    )


# -- A layer kept with `train=`: all of its weights, its state too ---------------


def _with_batch_norm():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, name="hidden"),
            keras.layers.BatchNormalization(name="norm"),
            keras.layers.Dense(2, name="head"),
        ],
        name="net",
    )


_FRESH_PROCESS = """
import sys, numpy as np, keras, refimpl
d = sys.argv[1]
base = keras.saving.load_model(d + "/base.keras")
refimpl.load_partial_weights(base, d + "/tuned.npz")
outputs = base.predict(np.load(d + "/x.npy"), verbose=0)
np.save(d + "/outputs.npy", keras.ops.convert_to_numpy(outputs))
"""


def test_a_batch_norm_kept_with_train_loads_its_moving_statistics_bit_for_bit(
    tmp_path,
):
    masks = {"hidden": _random(0.25, 1)}
    tuned = refimpl.partialize(_with_batch_norm(), masks, train=["norm", "head"])
    start = _numpy(tuned.get_layer("norm").moving_mean)
    _fit(tuned, X, 3 * Y + 1)
    assert refimpl.testing.moved(start, tuned.get_layer("norm").moving_mean).all()
    saved = refimpl.save_partial_weights(tuned, tmp_path / "tuned.npz")
    plain = _with_batch_norm()
    plain.save(tmp_path / "base.keras")
    refimpl.load_partial_weights(plain, tmp_path / "tuned.npz")
    _assert_same_outputs(plain, tuned, X)
    _assert_same_weights(plain, refimpl.merge(tuned))
    assert {"norm/moving_mean", "norm/moving_variance"} <= set(saved["full"])
    again = refimpl.partialize(_with_batch_norm(), masks, train=["norm", "head"])
    refimpl.load_partial_weights(again, tmp_path / "tuned.npz")
    _assert_same_outputs(again, tuned, X)
    # A fresh process: the file alone carries the statistics.
    np.save(tmp_path / "x.npy", X)
    run_python(_FRESH_PROCESS, tmp_path)
    np.testing.assert_array_equal(
        np.load(tmp_path / "outputs.npy"), _numpy(tuned.predict(X, verbose=0))
    )


def test_a_weight_trained_whole_is_refused_where_the_model_holds_it_partial(
    tmp_path,
):
    tuned = refimpl.partialize(
        _with_batch_norm(), {"hidden": _random(0.25, 1)}, train=["head"]
    )
    refimpl.save_partial_weights(_fit(tuned, X, Y), tmp_path / "tuned.npz")
    both = {"hidden": _random(0.25, 1), "head": _random(0.5, 2)}
    converted = refimpl.partialize(_with_batch_norm(), both)
    with pytest.raises(ValueError, match="'head/kernel' trained whole.*partial"):
        refimpl.load_partial_weights(converted, tmp_path / "tuned.npz")


# -- Two layers of one name: both come back, or the ambiguity is refused ----------


def _two_towers():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))

    def tower(name):
        body = keras.layers.Dense(4, name="body")
        head = keras.layers.Dense(2, name="head")
        return keras.Sequential([keras.Input((6,)), body, head], name=name)

    outputs = keras.layers.Add()([tower("a")(inputs), tower("b")(inputs)])
    return keras.Model(inputs, outputs, name="towers")


def test_two_sub_models_with_layers_of_one_name_both_come_back(tmp_path):
    masks = {"body": _random(0.25, 2)}
    tuned = _fit(refimpl.partialize(_two_towers(), masks, train=["head"]), X, Y)
    saved = refimpl.save_partial_weights(tuned, tmp_path / "tuned.npz")
    again = refimpl.partialize(_two_towers(), masks, train=["head"])
    refimpl.load_partial_weights(again, tmp_path / "tuned.npz")
    _assert_same_outputs(again, tuned, X)
    plain = _two_towers()
    refimpl.load_partial_weights(plain, tmp_path / "tuned.npz")
    _assert_same_outputs(plain, tuned, X)
    _assert_same_weights(plain, refimpl.merge(tuned))
    assert set(saved["partial"]) == {"a/body/kernel", "b/body/kernel"}
    assert {"a/head/kernel", "b/head/kernel"} <= set(saved["full"])


class _Pair(keras.layers.Layer):
    """Two Dense layers whose names the caller picks (one name twice, say)."""

    def __init__(self, first, second, **kwargs):
        super().__init__(**kwargs)
        self.first = keras.layers.Dense(2, name=first)
        self.second = keras.layers.Dense(2, name=second)

    def build(self, input_shape):
        self.first.build(input_shape)
        self.second.build(input_shape)

    def call(self, x):
        return self.first(x) + self.second(x)


def _pair_model(first, second):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    return keras.Model(inputs, _Pair(first, second, name="pair")(inputs))


def test_two_weights_at_one_path_are_refused_at_saving_and_at_loading(tmp_path):
    twins = refimpl.partialize(
        _pair_model("head", "head"), {"head": [[0, 0]]}, in_place=True
    )
    with pytest.raises(ValueError, match="2 weights at the path 'pair/head/kernel'"):
        refimpl.save_partial_weights(twins, tmp_path / "twins.npz")
    assert not (tmp_path / "twins.npz").exists()
    distinct = refimpl.partialize(
        _pair_model("head", "tail"), {"head": [[0, 0]]}, in_place=True
    )
    refimpl.save_partial_weights(distinct, tmp_path / "distinct.npz")
    target = _pair_model("head", "head")
    before = [_numpy(w) for w in target.weights]
    with pytest.raises(ValueError, match="2 weights at the path 'pair/head/kernel'"):
        refimpl.load_partial_weights(target, tmp_path / "distinct.npz")
    for weight, start in zip(target.weights, before, strict=True):
        np.testing.assert_array_equal(_numpy(weight), start)  # nothing written


# -- A wrapped or nested model: the file loads onto the model it started from -----


def _time_distributed():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3, 6))
    layer = keras.layers.TimeDistributed(keras.layers.Dense(2, name="inner"), name="td")
    return keras.Model(inputs, layer(inputs), name="wrapped")


def _bidirectional():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3, 6))
    rnn = keras.layers.Bidirectional(
        keras.layers.LSTM(1, return_sequences=True, name="lstm"), name="bi"
    )
    return keras.Model(inputs, rnn(inputs), name="wrapped")


def _nested():
    keras.utils.set_random_seed(0)
    encoder = keras.Sequential(
        [keras.Input((3, 6)), keras.layers.Dense(4, name="d_in")], name="enc"
    )
    inputs = keras.Input((3, 6))
    outputs = keras.layers.Dense(2, name="out")(encoder(inputs))
    return keras.Model(inputs, outputs, name="nested")


NESTED = {
    "time_distributed": (_time_distributed, "inner", {"td/inner/kernel"}),
    "bidirectional": (
        _bidirectional,
        "bi",
        # The cell, named by Keras, goes by the attribute that holds it.
        {"bi/forward_lstm/cell/kernel", "bi/backward_lstm/cell/kernel"},
    ),
    "nested_sequential": (_nested, "d_in", {"enc/d_in/kernel"}),
}


@pytest.mark.parametrize("name", list(NESTED))
def test_the_file_of_a_wrapped_or_nested_model_loads_onto_the_plain_model(
    name, tmp_path
):
    make, key, paths = NESTED[name]
    masks = {key: _random(0.3, 3)}
    tuned = _fit(refimpl.partialize(make(), masks), SEQUENCES, SEQUENCES[..., :2])
    saved = refimpl.save_partial_weights(tuned, tmp_path / "tuned.npz")
    plain = make()
    refimpl.load_partial_weights(plain, tmp_path / "tuned.npz")
    _assert_same_outputs(plain, tuned, SEQUENCES)
    _assert_same_weights(plain, refimpl.merge(tuned))
    again = refimpl.partialize(make(), masks)
    refimpl.load_partial_weights(again, tmp_path / "tuned.npz")
    _assert_same_outputs(again, tuned, SEQUENCES)
    assert set(saved["partial"]) == paths  # the layers' names, from the model down


def test_a_version_2_file_of_a_wrapped_model_loads_onto_the_plain_model(tmp_path):
    # Version 2 named a weight by its variable's path, which the converted copy
    # of a wrapped layer gives without the wrapper's name.
    tuned = refimpl.partialize(_time_distributed(), {"inner": _random(0.3, 3)})
    _fit(tuned, SEQUENCES, SEQUENCES[..., :2])
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(tuned, path)
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    header = json.loads(arrays["header"].tobytes().decode())
    header["version"] = 2
    header["partial"][0]["path"] = "inner/kernel"
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    plain = _time_distributed()
    refimpl.load_partial_weights(plain, path)
    _assert_same_outputs(plain, tuned, SEQUENCES)


def test_a_keras_hub_file_loads_across_the_backbone_and_its_task_model(tmp_path):
    # A task model's paths have its backbone's name in front; Keras' own
    # variable paths do not, and files of 2.x loaded across: so do these.
    keras_hub = pytest.importorskip("keras_hub")

    def backbone():
        keras.utils.set_random_seed(0)
        return keras_hub.models.GPT2Backbone(
            vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=16, dropout=0.0,
        )  # fmt: skip

    def task(backbone):
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

    tuned = refimpl.partialize(backbone(), {"query": _random(0.2, 7)})
    lm = task(tuned)
    ids = RNG.integers(0, 50, (2, 8))
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    for layer in partial_layers(tuned):  # as if trained
        layer.partial_weight.free.assign(layer.partial_weight.free + 0.5)
    refimpl.save_partial_weights(tuned, tmp_path / "backbone.npz")
    refimpl.save_partial_weights(lm, tmp_path / "task.npz")
    onto_task = task(backbone())
    refimpl.load_partial_weights(onto_task, tmp_path / "backbone.npz")
    onto_backbone = backbone()
    refimpl.load_partial_weights(onto_backbone, tmp_path / "task.npz")
    for model in (onto_task, task(onto_backbone)):
        _assert_same_outputs(model, lm, inputs)


# -- A task model's backbone: named by its attribute, not by a counted name -------
# A keras-hub task model holds its backbone as `_backbone` (the public
# `backbone` is a property); the backbone's name is Keras' counted default
# (`gpt2_backbone_1` for the second one built in a process).


def _gpt2_backbone(**kwargs):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    return keras_hub.models.GPT2Backbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16, dropout=0.0, **kwargs,
    )  # fmt: skip


def _causal_lm(backbone):
    keras_hub = pytest.importorskip("keras_hub")
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


TOKENS = RNG.integers(0, 50, (2, 8))
TOKEN_INPUTS = {"token_ids": TOKENS, "padding_mask": np.ones_like(TOKENS)}


def _tuned_causal_lm():
    """A task model whose backbone, not the first one built, has trained entries."""
    _causal_lm(_gpt2_backbone())  # the next backbone's name is counted
    masks = {"query": _random(0.2, 7)}
    tuned = _causal_lm(refimpl.partialize(_gpt2_backbone(), masks))
    for layer in partial_layers(tuned):  # as if trained
        layer.partial_weight.free.assign(layer.partial_weight.free + 0.5)
    assert tuned.backbone.name != "gpt2_backbone"
    return tuned, masks


_FIRST_TASK_MODEL = """
import sys, numpy as np, keras, keras_hub, refimpl
d = sys.argv[1]
keras.utils.set_random_seed(0)
backbone = keras_hub.models.GPT2Backbone(
    vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
    intermediate_dim=32, max_sequence_length=16, dropout=0.0,
)
model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
refimpl.load_partial_weights(model, d + "/tuned.npz")
ids = np.load(d + "/ids.npy")
outputs = model.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)})
weights = [keras.ops.convert_to_numpy(w) for w in model.weights]
np.savez(d + "/loaded.npz", backbone.name, outputs, *weights)
"""


def test_the_second_built_task_models_file_loads_onto_a_first_built_one_bit_for_bit(
    tmp_path,
):
    tuned, _ = _tuned_causal_lm()
    refimpl.save_partial_weights(tuned, tmp_path / "tuned.npz")
    np.save(tmp_path / "ids.npy", TOKENS)
    run_python(_FIRST_TASK_MODEL, tmp_path)
    merged = refimpl.merge(tuned)
    with np.load(tmp_path / "loaded.npz") as loaded:
        name, outputs, *weights = (loaded[f"arr_{i}"] for i in range(len(loaded)))
    assert str(name) == "gpt2_backbone"  # the first one built in its process
    np.testing.assert_array_equal(
        outputs, _numpy(tuned.predict(TOKEN_INPUTS, verbose=0))
    )
    assert len(weights) == len(merged.weights)
    for weight, want in zip(weights, merged.weights, strict=True):
        np.testing.assert_array_equal(weight, _numpy(want), err_msg=want.path)


def _child_name_3_0_0(parent, child, *_):
    """``_child_name`` of refimpl 3.0.0: only a public attribute named a child
    whose name Keras made up; one held by a private attribute kept its name."""
    made_up = False
    for cls in type(child).__mro__:
        snake = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", cls.__name__)
        snake = re.sub(r"([a-z])([A-Z])", r"\1_\2", snake).lower()
        made_up = made_up or re.fullmatch(re.escape(snake) + r"(_\d+)?", child.name)
    if made_up:
        held = {**vars(parent), **vars(parent).get("_modules", {})}
        for attribute, value in held.items():
            if value is child and not attribute.startswith("_"):
                return attribute
    return child.name


def test_a_3_0_0_file_keyed_by_the_counted_backbone_name_still_loads(
    tmp_path, monkeypatch
):
    tuned, masks = _tuned_causal_lm()
    path = tmp_path / "tuned.npz"
    with monkeypatch.context() as patched:
        patched.setattr(trained_entries, "_child_name", _child_name_3_0_0)
        saved = refimpl.save_partial_weights(tuned, path)
    counted = tuned.backbone.name
    assert saved["partial"] and saved["full"] == {}
    assert all(key.startswith(counted + "/") for key in saved["partial"])
    merged = refimpl.merge(tuned)
    # Onto the task model whose backbone has that name, plain or converted,
    # and onto the bare backbone, wherever 3.0.0 loaded it.
    plain = _causal_lm(_gpt2_backbone(name=counted))
    refimpl.load_partial_weights(plain, path)
    _assert_same_weights(plain, merged)
    _assert_same_outputs(plain, tuned, TOKEN_INPUTS)
    converted = _causal_lm(refimpl.partialize(_gpt2_backbone(name=counted), masks))
    refimpl.load_partial_weights(converted, path)
    _assert_same_outputs(converted, tuned, TOKEN_INPUTS)
    bare = _gpt2_backbone()
    refimpl.load_partial_weights(bare, path)
    _assert_same_outputs(_causal_lm(bare), tuned, TOKEN_INPUTS)


class _Twins(keras.layers.Layer):
    """Two Dense layers named alike, held by private attributes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._left = keras.layers.Dense(2, name="dense")
        self._right = keras.layers.Dense(2, name="dense")

    def build(self, input_shape):
        self._left.build(input_shape)
        self._right.build(input_shape)

    def call(self, x):
        return self._left(x) + self._right(x)


def _twins_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    return keras.Model(inputs, _Twins(name="twins")(inputs))


def test_a_3_0_0_path_that_two_weights_of_the_model_share_is_refused(tmp_path):
    # The attributes tell the twins apart (`twins/left/kernel`); the path
    # 3.0.0 gave them, `twins/dense/kernel`, names both: no guess.
    tuned = refimpl.partialize(_twins_model(), {"dense": [[0, 0]]}, in_place=True)
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(tuned, path)
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    header = json.loads(arrays["header"].tobytes().decode())
    paths = {r["path"] for r in header["partial"]}
    assert paths == {"twins/left/kernel", "twins/right/kernel"}
    header["partial"][0]["path"] = "twins/dense/kernel"  # as 3.0.0 keyed it
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    target = _twins_model()
    with pytest.raises(ValueError, match="2 weights at the path 'twins/dense/kernel'"):
        refimpl.load_partial_weights(target, path)


def test_an_adapter_from_another_task_models_file_loads_bit_for_bit(tmp_path):
    tuned, _ = _tuned_causal_lm()
    refimpl.save_partial_weights(tuned, tmp_path / "tuned.npz")
    model = _causal_lm(_gpt2_backbone())  # another counted name
    assert model.backbone.name != tuned.backbone.name
    adapters.load(model, tmp_path / "tuned.npz", "tuned")
    adapters.use(model, "tuned")
    _assert_same_outputs(model, tuned, TOKEN_INPUTS)
    adapters.use(model, None)
    _assert_same_outputs(model, _causal_lm(_gpt2_backbone()), TOKEN_INPUTS)


# -- Every dtype policy: the values as they are, bit for bit ----------------------


def _small(policy):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, name="hidden", dtype=policy),
            keras.layers.Dense(2, name="head", dtype=policy),
        ],
        name="net",
    )


@pytest.mark.parametrize(
    "policy", ["float16", "bfloat16", "mixed_float16", "mixed_bfloat16"]
)
def test_every_dtype_policy_saves_and_loads_bit_for_bit(policy, tmp_path):
    masks = {"hidden": _random(0.25, 4)}
    tuned = refimpl.partialize(_small(policy), masks, train=["head"])
    _fit(tuned, X, Y, keras.optimizers.SGD(0.05))
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(tuned, path)
    plain = _small(policy)
    refimpl.load_partial_weights(plain, path)
    _assert_same_weights(plain, refimpl.merge(tuned))
    _assert_same_outputs(plain, tuned, X)
    again = refimpl.partialize(_small(policy), masks, train=["head"])
    refimpl.load_partial_weights(again, path)
    _assert_same_outputs(again, tuned, X)


def test_a_bfloat16_gemma_backbone_loads_its_entries_bit_for_bit(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")

    def gemma():
        keras.utils.set_random_seed(0)
        return keras_hub.models.GemmaBackbone(
            vocabulary_size=64, num_layers=2, num_query_heads=2,
            num_key_value_heads=1, hidden_dim=16, intermediate_dim=32,
            head_dim=8, dtype="bfloat16",
        )  # fmt: skip

    masks = {"token_embedding": _random(0.1, 5), "query": _random(0.1, 6)}
    tuned = refimpl.partialize(gemma(), masks)
    for layer in partial_layers(tuned):  # as if trained
        free = layer.partial_weight.free
        free.assign(free + keras.ops.cast(0.5, free.dtype))
    ids = RNG.integers(0, 64, (2, 8))
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    path = tmp_path / "gemma.npz"
    saved = refimpl.save_partial_weights(tuned, path)
    assert len(saved["partial"]) == 3 and saved["full"] == {}
    plain = gemma()
    refimpl.load_partial_weights(plain, path)
    _assert_same_weights(plain, refimpl.merge(tuned))
    np.testing.assert_array_equal(_numpy(plain(inputs)), _numpy(tuned(inputs)))


# -- An unbuilt model is a wrong value --------------------------------------------


def test_an_unbuilt_model_is_refused_with_a_value_error(tmp_path):
    unbuilt = keras.Sequential([keras.layers.Dense(2)], name="unbuilt")
    with pytest.raises(ValueError, match="`model` must be built.*'unbuilt'"):
        refimpl.save_partial_weights(unbuilt, tmp_path / "x.npz")
    with pytest.raises(ValueError, match="`model` must be built.*'unbuilt'"):
        refimpl.load_partial_weights(unbuilt, tmp_path / "x.npz")
