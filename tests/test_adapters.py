"""Many sparse fine-tunes on one base: ``refimpl.adapters``.

Each adapter predicts what its fine-tuned model predicted, bit for bit, in
any order of switching; ``combine`` applies disjoint adapters exactly and
reports where they overlap; a mixed batch gives each row its adapter's
output in one pass; a saved model reloads with every adapter. And
``load_partial_weights`` refuses a file that would combine silently with
entries already applied (the two failures of issue #36).
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import adapters, selection
from refimpl.layers.partial import PartialWeightMixin
from tests.processes import run_python

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
IDS = RNG.integers(0, 20, (12, 5)).astype("int32")
TARGETS = RNG.normal(size=(12, 5, 3)).astype("float32")


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _pretrained(seed=0):
    """An ``Embedding``, an ``EinsumDense`` and two ``Dense`` layers."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(20, 8, name="emb")(inputs)
    h = keras.layers.EinsumDense(
        "abc,cde->abde", (5, 2, 4), bias_axes="de", name="ein"
    )(h)
    h = keras.layers.Reshape((5, 8))(h)
    h = keras.layers.Dense(6, activation="tanh", name="hidden")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(h), name="net")


def _random(fraction, seed):
    return lambda w: selection.random_mask(w.shape, fraction=fraction, seed=seed)


def _rows(*rows):
    def mask(w):
        chosen = np.zeros(w.shape, bool)
        chosen[list(rows)] = True
        return chosen

    return mask


#: Three tasks: random entries, whole rows (of an embedding table too), and
#: another layer alone.
TASKS = {
    "a": {"hidden": _random(0.3, 1), "ein": _random(0.3, 2)},
    "b": {"hidden": _rows(0, 3), "emb": _rows(3, 4)},
    "c": {"head": _random(0.5, 3)},
}


def _fine_tune(masks, path, seed):
    tuned = refimpl.partialize(_pretrained(), masks)
    tuned.compile(keras.optimizers.Adam(0.05), "mse")
    keras.utils.set_random_seed(seed)
    tuned.fit(IDS, TARGETS, epochs=2, batch_size=4, verbose=0)
    refimpl.save_partial_weights(tuned, path)
    return _numpy(tuned.predict(IDS, verbose=0))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """``{name: (file, the fine-tuned model's predictions)}``."""
    folder = tmp_path_factory.mktemp("tasks")
    found = {}
    for i, (name, masks) in enumerate(TASKS.items()):
        path = folder / f"{name}.npz"
        found[name] = (path, _fine_tune(masks, path, i))
    return found


def _with_adapters(tasks, model=None):
    model = _pretrained() if model is None else model
    for name, (path, _) in tasks.items():
        adapters.load(model, path, name)
    return model


def _predict(model):
    return _numpy(model.predict(IDS, verbose=0))


# -- load and use --------------------------------------------------------------


@pytest.mark.parametrize("onto", ["plain", "converted", "converted_select"])
def test_each_adapter_predicts_its_fine_tune_bit_for_bit_in_any_order(tasks, onto):
    model = _pretrained()
    if onto == "converted":
        model = refimpl.partialize(model, TASKS["a"])
    if onto == "converted_select":  # the select form keeps its form
        model = refimpl.partialize(model, TASKS["a"], mode="select")
    base = _predict(_pretrained())
    _with_adapters(tasks, model)
    if onto == "converted_select":
        assert model.get_layer("hidden").partial_weight.mode == "select"
    assert adapters.names(model) == ["a", "b", "c"]
    assert adapters.active(model) is None
    np.testing.assert_array_equal(_predict(model), base)
    for name in ["b", "a", None, "c", "a", "b", None, "c"]:
        adapters.use(model, name)
        assert adapters.active(model) == name
        want = base if name is None else tasks[name][1]
        np.testing.assert_array_equal(_predict(model), want, err_msg=str(name))


def test_use_switches_in_place_without_new_variables_or_a_new_trace(tasks):
    model = _with_adapters(tasks)
    adapters.use(model, "a")
    _predict(model)
    variables = [id(v) for v in model.variables]
    compiled = model.predict_function
    for name in ["b", None, "c"]:
        adapters.use(model, name)
        np.testing.assert_array_equal(
            _predict(model), tasks[name][1] if name else _predict(_pretrained())
        )
        assert [id(v) for v in model.variables] == variables
        assert model.predict_function is compiled


def test_loading_an_adapter_leaves_the_base_and_the_others_unchanged(tasks):
    model = _pretrained()
    adapters.load(model, tasks["a"][0], "a")
    adapters.use(model, "a")
    adapters.load(model, tasks["b"][0], "b")
    assert adapters.active(model) == "a"  # loading does not switch
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])
    adapters.use(model, None)
    for layer in model.layers:
        if isinstance(layer, PartialWeightMixin):
            pw = layer.partial_weight
            plain = _pretrained().get_layer(layer.name)
            np.testing.assert_array_equal(
                _numpy(pw.base), _numpy(getattr(plain, layer._partial_target))
            )
            np.testing.assert_array_equal(
                _numpy(getattr(layer, pw.base.name)), _numpy(pw.base)
            )


def test_a_duplicate_name_a_bad_name_and_another_base_are_refused(tasks, tmp_path):
    model = _pretrained()
    adapters.load(model, tasks["a"][0], "a")
    with pytest.raises(ValueError, match="already an adapter"):
        adapters.load(model, tasks["b"][0], "a")
    with pytest.raises(TypeError, match="`name` must be a string"):
        adapters.load(model, tasks["b"][0], 3)
    with pytest.raises(ValueError, match="not the one the file's entries"):
        adapters.load(_pretrained(seed=1), tasks["a"][0], "a")
    with pytest.raises(ValueError, match="must name an adapter"):
        adapters.use(model, "b")
    with pytest.raises(TypeError, match="must be a string"):
        adapters.use(model, 1)
    with pytest.raises(ValueError, match="must name an adapter"):
        adapters.remove(model, "b")
    # A file with a layer trained whole: adapters hold entries only.
    tuned = refimpl.partialize(_pretrained(), TASKS["a"], train=["head"])
    refimpl.save_partial_weights(tuned, tmp_path / "whole.npz")
    with pytest.raises(ValueError, match="trained whole"):
        adapters.load(model, tmp_path / "whole.npz", "w")
    assert adapters.names(model) == ["a"]


def test_a_converted_layer_with_trained_entries_of_its_own_is_refused(tasks):
    model = refimpl.partialize(_pretrained(), TASKS["a"])
    layer = model.get_layer("hidden")
    layer.partial_weight.free.assign(layer.partial_weight.free + 1.0)
    with pytest.raises(ValueError, match="trained entries of its own"):
        adapters.load(model, tasks["a"][0], "a")
    assert adapters.names(model) == []


def test_removing_the_active_adapter_gives_the_base_and_the_last_the_plain_layers(
    tasks,
):
    model = _with_adapters(tasks)
    base = _predict(_pretrained())
    adapters.use(model, "b")
    adapters.remove(model, "b")
    assert adapters.names(model) == ["a", "c"] and adapters.active(model) is None
    np.testing.assert_array_equal(_predict(model), base)
    adapters.use(model, "a")
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])
    adapters.remove(model, "a")
    adapters.remove(model, "c")
    assert adapters.names(model) == []
    assert not any(isinstance(layer, PartialWeightMixin) for layer in model.layers)
    np.testing.assert_array_equal(_predict(model), base)
    for a, b in zip(model.weights, _pretrained().weights, strict=True):
        np.testing.assert_array_equal(_numpy(a), _numpy(b))


# -- combine -------------------------------------------------------------------


def _entries(path):
    """``{weight path: (positions, values)}`` of a file, read with NumPy."""
    from refimpl.trained_entries import _open, _positions, _read

    header, arrays, version = _open(str(path))
    return {
        record["path"]: (
            _positions(arrays, record, i, version),
            _read(arrays, header, f"values_{i}", "float32"),
        )
        for i, record in enumerate(header["partial"])
    }


def _write(model, entries):
    """Write each weight's entries into a plain ``model``'s weights."""
    for path, (positions, values) in entries.items():
        layer = model.get_layer(path.split("/")[0])
        variable = next(w for w in layer.weights if w.name == path.split("/")[1])
        flat = _numpy(variable).reshape(-1).copy()
        flat[positions] = values
        variable.assign(flat.reshape(variable.shape))


def test_combining_disjoint_adapters_applies_both_exactly(tasks):
    # "a" trains hidden and ein, "c" the head: no entry in common.
    model = _with_adapters(tasks)
    report = adapters.combine(model, {"a": 1.0, "c": 1.0}, name="ac")
    assert report["total"] == 0 and report["max_disagreement"] == 0.0
    k = sum(
        len(p)
        for p, _ in {**_entries(tasks["a"][0]), **_entries(tasks["c"][0])}.values()
    )
    assert report["positions"] == k
    both = _pretrained()
    _write(both, {**_entries(tasks["a"][0]), **_entries(tasks["c"][0])})
    adapters.use(model, "ac")
    np.testing.assert_array_equal(_predict(model), _predict(both))
    adapters.use(model, "a")  # the others are unchanged
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])


def test_combining_overlapping_adapters_adds_both_changes_and_reports_them(tasks):
    # "a" and "b" both train the hidden kernel: shared entries get both changes.
    model = _with_adapters(tasks)
    report = adapters.combine(model, {"a": 1.0, "b": 0.5}, name="ab")
    a, b = _entries(tasks["a"][0]), _entries(tasks["b"][0])
    base = _numpy(_pretrained().get_layer("hidden").kernel).reshape(-1)
    (pa, va), (pb, vb) = a["hidden/kernel"], b["hidden/kernel"]
    shared, ia, ib = np.intersect1d(pa, pb, return_indices=True)
    assert len(shared) > 0
    assert report["overlap"]["hidden/kernel"] == len(shared)
    assert report["total"] == len(shared)
    gaps = np.abs((va[ia] - base[shared]) - (vb[ib] - base[shared]))
    np.testing.assert_allclose(
        report["disagreement"]["hidden/kernel"], gaps.max(), rtol=1e-6
    )
    assert report["max_disagreement"] >= report["disagreement"]["hidden/kernel"]
    adapters.use(model, "ab")
    kernel = _numpy(model.get_layer("hidden").kernel).reshape(-1)
    want = base[shared] + (va[ia] - base[shared]) + 0.5 * (vb[ib] - base[shared])
    np.testing.assert_allclose(kernel[shared], want, rtol=1e-6)
    # Neither fine-tune's value, at the shared entries.
    assert not np.array_equal(kernel[shared], va[ia])
    assert not np.array_equal(kernel[shared], vb[ib])


# -- mixed batches -------------------------------------------------------------


def _row_by_row(model, names):
    was = adapters.active(model)
    rows = []
    for i, name in enumerate(names):
        adapters.use(model, name)
        rows.append(_numpy(model.predict(IDS[i : i + 1], verbose=0))[0])
    adapters.use(model, was)
    return np.stack(rows)


@pytest.mark.parametrize("batch_size", [12, 5])
def test_a_mixed_batch_gives_each_row_its_adapters_output(tasks, batch_size):
    model = _with_adapters(tasks)
    adapters.use(model, "c")
    names = ["a", None, "b", "c", "a", "b", None, "c", "b", "a", "a", None]
    mixed = adapters.predict(model, IDS, names, batch_size=batch_size)
    want = _row_by_row(model, names)
    # float32 rounding: a row's sum runs in another order (and XLA may round
    # a row of a batch of 12 otherwise than a batch of 1).
    np.testing.assert_allclose(mixed, want, rtol=1e-5, atol=1e-6)
    assert adapters.active(model) == "c"
    np.testing.assert_array_equal(_predict(model), tasks["c"][1])


def test_a_mixed_batch_through_an_embedding_is_its_lookup_bit_for_bit(tmp_path):
    def pretrained():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((5,), dtype="int32"),
                keras.layers.Embedding(20, 4, name="emb"),
            ]
        )

    for name, mask in (("rows", _rows(3, 4, 7)), ("random", _random(0.3, 5))):
        tuned = refimpl.partialize(pretrained(), {"emb": mask})
        pw = tuned.get_layer("emb").partial_weight
        pw.free.assign(pw.free + np.arange(pw.num_free, dtype="float32"))
        refimpl.save_partial_weights(tuned, tmp_path / f"{name}.npz")
    model = pretrained()
    adapters.load(model, tmp_path / "rows.npz", "rows")
    adapters.load(model, tmp_path / "random.npz", "random")
    names = ["rows", "random", None, "random"] * 3
    np.testing.assert_array_equal(
        adapters.predict(model, IDS, names), _row_by_row(model, names)
    )


@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="PyTorch multiplies a one-row group by another kernel: rounding",
)
def test_a_layer_without_a_mixed_product_switches_group_by_group(tmp_path):
    def pretrained():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.Input((6, 2)), keras.layers.Conv1D(3, 2, name="conv")]
        )

    x = RNG.normal(size=(6, 6, 2)).astype("float32")
    for name, seed in (("a", 1), ("b", 2)):
        tuned = refimpl.partialize(pretrained(), {"conv": _random(0.4, seed)})
        pw = tuned.get_layer("conv").partial_weight
        pw.free.assign(pw.free + 1.0)
        refimpl.save_partial_weights(tuned, tmp_path / f"{name}.npz")
    model = pretrained()
    adapters.load(model, tmp_path / "a.npz", "a")
    adapters.load(model, tmp_path / "b.npz", "b")
    names = ["b", "a", None, "a", "b", "b"]
    want = []
    for i, name in enumerate(names):
        adapters.use(model, name)
        want.append(_numpy(model.predict(x[i : i + 1], verbose=0))[0])
    adapters.use(model, None)
    np.testing.assert_array_equal(adapters.predict(model, x, names), np.stack(want))


def test_a_layer_whose_rows_are_not_the_batchs_switches_group_by_group(tmp_path):
    # TimeDistributed folds time into the first axis (under TensorFlow).
    def pretrained():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((3, 4)),
                keras.layers.TimeDistributed(keras.layers.Dense(2, name="d"), name="t"),
            ]
        )

    x = RNG.normal(size=(6, 3, 4)).astype("float32")
    for name, seed in (("a", 1), ("b", 2)):
        tuned = refimpl.partialize(pretrained(), {"d": _random(0.5, seed)})
        pw = refimpl.partial.partial_weights(tuned)[0]
        pw.free.assign(pw.free + 1.0)
        refimpl.save_partial_weights(tuned, tmp_path / f"{name}.npz")
    model = pretrained()
    adapters.load(model, tmp_path / "a.npz", "a")
    adapters.load(model, tmp_path / "b.npz", "b")
    names = ["b", "a", None, "a", "b", "b"]
    want = []
    for i, name in enumerate(names):
        adapters.use(model, name)
        want.append(_numpy(model.predict(x[i : i + 1], verbose=0))[0])
    adapters.use(model, None)
    got = adapters.predict(model, x, names)
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-5, atol=1e-6)


def test_a_quantized_base_is_refused(tasks):
    model = _pretrained()
    model.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        adapters.load(model, tasks["a"][0], "a")


def test_mixed_batch_arguments_are_checked(tasks):
    model = _with_adapters({"a": tasks["a"]})
    with pytest.raises(ValueError, match="one name per row"):
        adapters.predict(model, IDS, ["a"])
    with pytest.raises(ValueError, match="must name an adapter"):
        adapters.predict(model, IDS, ["z"] * len(IDS))
    with pytest.raises(TypeError, match="`adapters` must be a list"):
        adapters.predict(model, IDS, "a")
    with pytest.raises(TypeError, match="`batch_size` must be an int"):
        adapters.predict(model, IDS, ["a"] * len(IDS), batch_size=2.0)


# -- saving --------------------------------------------------------------------


_RELOAD = """
import sys, numpy as np, keras, refimpl
from refimpl import adapters
folder = sys.argv[1]
model = keras.saving.load_model(folder + "/model.keras")
ids = np.load(folder + "/ids.npy")
out = {"names": np.array(adapters.names(model)),
       "active": np.array(str(adapters.active(model)))}
out["now"] = keras.ops.convert_to_numpy(model.predict(ids, verbose=0))
for name in adapters.names(model):
    adapters.use(model, name)
    out[name] = keras.ops.convert_to_numpy(model.predict(ids, verbose=0))
np.savez(folder + "/out.npz", **out)
"""


def test_a_saved_model_reloads_every_adapter_and_the_active_one(tasks, tmp_path):
    model = _with_adapters(tasks)
    adapters.combine(model, {"a": 1.0, "c": 1.0}, name="ac")
    adapters.use(model, "ac")
    want = {name: None for name in adapters.names(model)}
    for name in want:
        adapters.use(model, name)
        want[name] = _predict(model)
    adapters.use(model, "b")
    model.save(tmp_path / "model.keras")
    again = keras.saving.load_model(tmp_path / "model.keras")
    assert adapters.names(again) == ["a", "b", "c", "ac"]
    assert adapters.active(again) == "b"
    np.testing.assert_array_equal(_predict(again), tasks["b"][1])
    for name in ["c", "a", "ac", None, "b"]:
        adapters.use(again, name)
        expected = _predict(_pretrained()) if name is None else want[name]
        np.testing.assert_array_equal(_predict(again), expected)
    # A fresh process: the registered names alone.
    np.save(tmp_path / "ids.npy", IDS)
    run_python(_RELOAD, tmp_path)
    with np.load(tmp_path / "out.npz") as out:
        assert list(out["names"]) == ["a", "b", "c", "ac"]
        assert str(out["active"]) == "b"
        np.testing.assert_array_equal(out["now"], tasks["b"][1])
        for name in want:
            np.testing.assert_array_equal(out[name], want[name])


def test_a_keras_hub_backbone_serves_two_tasks_and_reloads(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")

    def backbone():
        keras.utils.set_random_seed(0)
        return keras_hub.models.GPT2Backbone(
            vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=16, dropout=0.0,
        )  # fmt: skip

    ids = RNG.integers(0, 50, (6, 8))
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    y = RNG.normal(size=(6, 8, 16)).astype("float32")
    masks = {
        "a": {
            "query": _random(0.1, 1),
            "feedforward_intermediate_dense": _random(0.1, 2),
        },
        "b": {"value": _rows(0, 5), "feedforward_output_dense": _random(0.05, 3)},
    }
    want = {}
    for name, chosen in masks.items():
        tuned = refimpl.partialize(backbone(), chosen)
        tuned.compile(keras.optimizers.Adam(0.05), "mse")
        tuned.fit(x, y, epochs=2, batch_size=3, verbose=0)
        refimpl.save_partial_weights(tuned, tmp_path / f"{name}.npz")
        want[name] = _numpy(tuned.predict(x, verbose=0))
    model = backbone()
    for name in masks:
        adapters.load(model, tmp_path / f"{name}.npz", name)
    for name in ["b", "a", "b"]:
        adapters.use(model, name)
        np.testing.assert_array_equal(_numpy(model.predict(x, verbose=0)), want[name])
    names = ["a", "b", None, "b", "a", "a"]
    mixed = adapters.predict(model, x, names)
    base = _numpy(backbone().predict(x, verbose=0))
    for i, name in enumerate(names):
        row = base[i] if name is None else want[name][i]
        np.testing.assert_allclose(mixed[i], row, rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "gpt2.keras")
    again = keras.saving.load_model(tmp_path / "gpt2.keras")
    assert adapters.names(again) == ["a", "b"] and adapters.active(again) == "b"
    adapters.use(again, "a")
    np.testing.assert_array_equal(_numpy(again.predict(x, verbose=0)), want["a"])


# -- one file on one model: load_partial_weights refuses to combine ------------


def test_a_second_file_onto_the_plain_model_is_refused_not_combined(tasks):
    # Issue #36: file A then file C (other layers) loaded silently, giving A+C.
    model = _pretrained()
    refimpl.load_partial_weights(model, tasks["a"][0])
    with pytest.raises(ValueError, match="refimpl.adapters"):
        refimpl.load_partial_weights(model, tasks["c"][0])
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])
    # With the base restored by hand, the model is the pretrained one again.
    model.set_weights(_pretrained().get_weights())
    refimpl.load_partial_weights(model, tasks["c"][0])
    np.testing.assert_array_equal(_predict(model), tasks["c"][1])


def test_another_file_onto_a_model_converted_with_a_masks_is_refused(tmp_path, tasks):
    # Issue #36: onto a model converted with A's masks, file B (other
    # positions, and a layer A does not train) loaded silently and gave
    # neither; loading A back did not restore A.
    b_masks = {"hidden": _random(0.3, 9), "head": _random(0.5, 8)}
    _fine_tune(b_masks, tmp_path / "b.npz", 5)
    model = refimpl.partialize(_pretrained(), TASKS["a"])
    refimpl.load_partial_weights(model, tasks["a"][0])
    with pytest.raises(ValueError, match="refimpl.adapters"):
        refimpl.load_partial_weights(model, tmp_path / "b.npz")
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])
    refimpl.load_partial_weights(model, tasks["a"][0])  # A again: still A
    np.testing.assert_array_equal(_predict(model), tasks["a"][1])


def test_a_file_that_replaces_every_entry_applied_still_loads(tmp_path, tasks):
    # The same layers with other positions: every entry of A is replaced.
    other = {"hidden": _random(0.3, 11), "ein": _random(0.3, 12)}
    want = _fine_tune(other, tmp_path / "other.npz", 7)
    model = refimpl.partialize(_pretrained(), TASKS["a"])
    refimpl.load_partial_weights(model, tasks["a"][0])
    refimpl.load_partial_weights(model, tmp_path / "other.npz")
    np.testing.assert_array_equal(_predict(model), want)


def test_a_file_is_refused_onto_a_model_with_adapters(tasks):
    model = _with_adapters({"a": tasks["a"]})
    with pytest.raises(ValueError, match="refimpl.adapters.load"):
        refimpl.load_partial_weights(model, tasks["c"][0])
