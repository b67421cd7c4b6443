"""Regression: configs must not grow with n².

Before 1.0, masks, fixed diagonals, fixed blocks and frozen values were
written into ``get_config`` as nested lists, so a ``.keras`` file's
``config.json`` held megabytes of numbers at n = 4096 and saving and loading
took seconds in JSON. Now every array is a weight (or an optimizer variable)
and every config holds only shapes and options. These tests save each
technique at a size where an array in the config could not hide, walk the
JSON for long runs of numbers, and bound the file.
"""

import json
import statistics
import time
import zipfile

import keras
import numpy as np
import pytest

import refimpl

pytestmark = pytest.mark.every_backend

MAX_NUMBERS = 16  # no list in a config may hold more numbers than this
MAX_CONFIG_BYTES = 64 * 1024


def _sequential(n, layer):
    return keras.Sequential([keras.Input((n,)), layer])


def _partial_dense(n):
    mask = np.random.default_rng(0).random((n, n)) < 0.01
    return _sequential(n, refimpl.PartialDense(n, mask))


def _band_fixed_diagonal(n, as_array=False):
    values = np.random.default_rng(0).normal(size=n)
    layer = refimpl.BandedDense(
        1, 1, fixed_diagonal=values if as_array else values.tolist()
    )
    return _sequential(n, layer)


def _block_fixed(n):
    h = n // 2
    rng = np.random.default_rng(0)
    blocks = [[rng.normal(size=(h, h)), None], [rng.normal(size=(h, h)), "trainable"]]
    return _sequential(n, refimpl.BlockDense(blocks, col_sizes=[h, h]))


def _freeze_entries(n):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(n, n)).astype("float32")
    constraint = refimpl.FreezeEntries(values, rng.random((n, n)) < 0.01)
    return _sequential(n, keras.layers.Dense(n, kernel_constraint=constraint))


def _masked_optimizer(n):
    dense = keras.layers.Dense(n)
    model = _sequential(n, dense)
    mask = np.random.default_rng(0).random((n, n)) < 0.01
    optimizer = refimpl.MaskedOptimizer(keras.optimizers.Adam(), [(dense.kernel, mask)])
    model.compile(optimizer=optimizer, loss="mse")
    optimizer.build(model.trainable_variables)  # the masks become variables
    return model


CASES = [
    pytest.param(_partial_dense, id="PartialDense"),
    pytest.param(_band_fixed_diagonal, id="BandedDense_fixed_diagonal_list"),
    pytest.param(
        lambda n: _band_fixed_diagonal(n, as_array=True),
        id="BandedDense_fixed_diagonal_array",
    ),
    pytest.param(_block_fixed, id="BlockDense_fixed_blocks"),
    pytest.param(_freeze_entries, id="FreezeEntries"),
    pytest.param(_masked_optimizer, id="MaskedOptimizer"),
]


def _count_numbers(value):
    """The number of numbers in a list, nested lists included."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return 1
    if isinstance(value, list):
        return sum(_count_numbers(v) for v in value)
    return 0


def _long_lists(value, where="config"):
    """The places in a JSON value where a list holds too many numbers."""
    found = []
    if isinstance(value, list):
        if _count_numbers(value) > MAX_NUMBERS:
            return [f"{where}: {_count_numbers(value)} numbers"]
        for i, v in enumerate(value):
            found += _long_lists(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            found += _long_lists(v, f"{where}.{k}")
    elif isinstance(value, str) and len(value) > 1000:
        found.append(f"{where}: a string of {len(value)} characters")
    return found


def test_the_walker_finds_an_array_in_a_config():
    config = {"a": {"b": [1, 2]}, "c": [[0.5] * 5] * 4, "d": [True] * 40}
    assert _long_lists(config) == ["config.c: 20 numbers"]


def _config_json(model, path):
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        return archive.read("config.json")


def _check_config(make, n, tmp_path):
    model = make(n)
    raw = _config_json(model, tmp_path / "model.keras")
    assert _long_lists(json.loads(raw)) == []
    assert len(raw) < MAX_CONFIG_BYTES, f"config.json has {len(raw)} bytes"
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    for saved, restored in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(restored, saved)
    for layer in model.layers:
        assert _long_lists(layer.get_config()) == []


@pytest.mark.parametrize("make", CASES)
def test_config_holds_no_arrays_at_n_1024(make, tmp_path):
    _check_config(make, 1024, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("make", CASES)
def test_config_holds_no_arrays_at_n_4096(make, tmp_path):
    _check_config(make, 4096, tmp_path)


def _save_load_seconds(model, path):
    start = time.perf_counter()
    model.save(path)
    keras.saving.load_model(path)
    return time.perf_counter() - start


@pytest.mark.slow
# The bound is TensorFlow's save path; on JAX the same files are written, and
# the sizes above are checked on every backend.
@pytest.mark.tensorflow_only
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_partial_dense, id="PartialDense"),
        pytest.param(_block_fixed, id="BlockDense_fixed_blocks"),
    ],
)
def test_save_and_load_take_at_most_twice_the_dense_time_at_n_4096(make, tmp_path):
    n = 4096
    models = {"refimpl": make(n), "dense": _sequential(n, keras.layers.Dense(n))}
    times = {name: [] for name in models}
    for round_ in range(3):  # interleaved, so that machine noise hits both
        for name, model in models.items():
            path = tmp_path / f"{name}_{round_}.keras"
            times[name].append(_save_load_seconds(model, path))
    ratio = statistics.median(times["refimpl"]) / statistics.median(times["dense"])
    assert ratio <= 2.0, f"save+load times {times}: ratio {ratio:.2f}"
