"""The file of trained entries: ``save_partial_weights``/``load_partial_weights``.

It reproduces the fine-tuned model exactly on the plain pretrained model and
on a converted one, refuses another base, and costs 5 to 6 bytes per trained
value (the gaps between positions in one or two bytes): far smaller than the
model, and smaller than keras-hub's LoRA file at the same trainable count.
"""

import io
import json
import os

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.partial import partial_weights

pytestmark = pytest.mark.every_backend

RNG = np.random.default_rng(0)
X = RNG.normal(size=(16, 6)).astype("float32")
Y = RNG.normal(size=(16, 2)).astype("float32")


def _numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def _pretrained(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, name="hidden", activation="tanh"),
            keras.layers.Dense(2, name="head"),
        ],
        name="net",
    )


MASKS = {
    "hidden": lambda w: selection.random_mask(w.shape, fraction=0.25, seed=1),
    "head": lambda w: selection.random_mask(w.shape, fraction=0.5, seed=2),
}


def _fine_tuned(mode="delta", train=None):
    converted = refimpl.partialize(_pretrained(), MASKS, mode=mode, train=train)
    converted.compile(keras.optimizers.AdamW(0.05, weight_decay=0.1), "mse")
    converted.fit(X, Y, epochs=3, batch_size=8, verbose=0)
    return converted


@pytest.mark.parametrize(
    "mode", ["delta", pytest.param("select", marks=pytest.mark.slow)]
)
def test_the_file_reproduces_the_fine_tune_on_the_plain_and_the_converted_model(
    mode, tmp_path
):
    tuned = _fine_tuned(mode)
    want = _numpy(tuned.predict(X, verbose=0))
    path = tmp_path / "tuned.npz"
    saved = refimpl.save_partial_weights(tuned, path)
    k = sum(weight.num_free for weight in partial_weights(tuned))
    assert sum(saved["partial"].values()) == k and saved["full"] == {}
    # Onto the plain pretrained model: its weights become the merged ones.
    plain = _pretrained()
    refimpl.load_partial_weights(plain, path)
    np.testing.assert_array_equal(_numpy(plain.predict(X, verbose=0)), want)
    merged = refimpl.merge(tuned)
    for a, b in zip(plain.weights, merged.weights, strict=True):
        np.testing.assert_array_equal(_numpy(a), _numpy(b))
    # Onto a freshly converted model: it predicts the same and trains on.
    again = refimpl.partialize(_pretrained(), MASKS, mode=mode)
    refimpl.load_partial_weights(again, path)
    np.testing.assert_array_equal(_numpy(again.predict(X, verbose=0)), want)
    for layer in ("hidden", "head"):
        np.testing.assert_array_equal(
            again.get_layer(layer).partial_weight.mask,
            tuned.get_layer(layer).partial_weight.mask,
        )


@pytest.mark.slow
def test_fully_trained_weights_travel_whole(tmp_path):
    tuned = _fine_tuned(train=["head"])
    path = tmp_path / "tuned.npz"
    saved = refimpl.save_partial_weights(tuned, path)
    assert saved["full"] == {"head/bias": 2}
    plain = _pretrained()
    refimpl.load_partial_weights(plain, path)
    np.testing.assert_array_equal(
        _numpy(plain.predict(X, verbose=0)), _numpy(tuned.predict(X, verbose=0))
    )


@pytest.mark.parametrize(("fraction", "per_value"), [(0.04, 5), (0.002, 6)])
def test_a_value_costs_its_4_bytes_and_a_gap_of_1_or_2(fraction, per_value, tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, name="d")])
    mask = selection.random_mask((64, 256), fraction=fraction, seed=0)
    converted = refimpl.partialize(model, {"d": mask})
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(converted, path)
    k = int(mask.sum())
    header = 1024  # the JSON header and the archive's directory
    assert per_value * k < os.path.getsize(path) <= per_value * k + header
    plain = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, name="d")])
    plain.set_weights(model.get_weights())
    refimpl.load_partial_weights(plain, path)
    np.testing.assert_array_equal(
        _numpy(plain.layers[0].kernel), _numpy(converted.layers[0].kernel)
    )


def _rewrite(path, change):
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    header = json.loads(arrays["header"].tobytes().decode())
    change(arrays, header)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getvalue())


def test_a_version_1_file_of_int32_positions_still_loads(tmp_path):
    tuned = _fine_tuned()
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(tuned, path)

    def version_1(arrays, header):
        header["version"] = 1
        for i, record in enumerate(header["partial"]):
            gaps = arrays.pop(f"gaps_{i}").astype(np.int64)
            first = record.pop("first")
            record.pop("num_free")
            positions = first + np.concatenate([[0], np.cumsum(gaps)])
            arrays[f"positions_{i}"] = positions.astype(np.int32)

    _rewrite(path, version_1)
    plain = _pretrained()
    refimpl.load_partial_weights(plain, path)
    np.testing.assert_array_equal(
        _numpy(plain.predict(X, verbose=0)), _numpy(tuned.predict(X, verbose=0))
    )
    _rewrite(path, lambda arrays, header: header.update(version=4))
    with pytest.raises(ValueError, match="format version 4.*upgrade refimpl"):
        refimpl.load_partial_weights(_pretrained(), path)


def test_another_base_is_refused(tmp_path):
    tuned = _fine_tuned()
    path = tmp_path / "tuned.npz"
    refimpl.save_partial_weights(tuned, path)
    other = _pretrained(seed=5)
    before = [_numpy(w) for w in other.weights]
    with pytest.raises(ValueError, match="is not the one its entries were trained on"):
        refimpl.load_partial_weights(other, path)
    for a, b in zip(other.weights, before, strict=True):
        np.testing.assert_array_equal(_numpy(a), b)  # nothing was written
    fewer = refimpl.partialize(_pretrained(), {"hidden": [[0, 0]]})
    with pytest.raises(ValueError, match="has 1 free entries and the file has"):
        refimpl.load_partial_weights(fewer, path)
    small = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, name="x")])
    with pytest.raises(ValueError, match="has weights that `model` does not"):
        refimpl.load_partial_weights(small, path)


def test_bad_arguments_name_themselves(tmp_path):
    tuned = _fine_tuned()
    with pytest.raises(ValueError, match=r"`path` must end in '\.npz'"):
        refimpl.save_partial_weights(tuned, tmp_path / "tuned.h5")
    with pytest.raises(TypeError, match="`path` must be a file path"):
        refimpl.save_partial_weights(tuned, 3)
    with pytest.raises(ValueError, match="`model` has no partial weight"):
        refimpl.save_partial_weights(_pretrained(), tmp_path / "x.npz")
    with pytest.raises(TypeError, match="`model` must be a Keras model"):
        refimpl.load_partial_weights("model", tmp_path / "x.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="is not a file of `save_partial_weights`"):
        refimpl.load_partial_weights(_pretrained(), tmp_path / "other.npz")
