"""The mixed-batch serving benchmark serves what it says.

``python -m evidence.benchmarks.adapters`` times the servings; here they run
at the quick size: the adapters are what the benchmark describes, every
serving computes the same predictions, and the quick run writes the columns
the full run commits. No timing is asserted.
"""

from __future__ import annotations

import csv
import pathlib

import keras
import numpy as np
import pytest

from evidence.benchmarks import adapters as bench
from evidence.benchmarks import real_models

SIZES = bench._sizes(quick=True)


def test_each_row_gets_an_adapter_or_the_base_evenly():
    per_row = bench._assignment(np, 18)
    names = [None] + [f"task{i}" for i in range(bench.ADAPTERS)]
    assert sorted(per_row, key=str) == sorted(names * 2, key=str)
    assert per_row != [names[i % len(names)] for i in range(18)]  # shuffled


def test_an_adapter_file_holds_one_percent_of_every_kernel_moved(tmp_path):
    import refimpl
    from refimpl.partial import partial_weights

    path = tmp_path / "a.npz"
    bench.make_adapter(keras, np, SIZES, 1, path)
    pretrained = real_models.build(keras, SIZES)
    kernels = real_models._kernel_layers(keras, pretrained)
    tuned = refimpl.partialize(pretrained, bench._masks(keras, pretrained, 1))
    refimpl.load_partial_weights(tuned, path)
    weights = partial_weights(tuned)
    assert len(weights) == len(kernels)
    for pw in weights:
        assert pw.num_free == pytest.approx(bench.DENSITY * np.prod(pw.shape), abs=1)
        free = keras.ops.convert_to_numpy(pw.free)
        base = keras.ops.convert_to_numpy(pw.base).ravel()
        positions = keras.ops.convert_to_numpy(pw.positions)
        assert not np.any(free == base[positions])
    other = bench._masks(keras, pretrained, 2)
    first = bench._masks(keras, pretrained, 1)
    assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_every_serving_gives_each_row_its_adapters_prediction(tmp_path):
    functions, x, per_row = bench.servings(keras, np, SIZES, tmp_path)
    assert list(functions) == list(bench.SERVINGS)
    out = {name: np.asarray(f(x, None)) for name, f in functions.items()}
    np.testing.assert_allclose(out["mixed"], out["switching"], atol=1e-4)
    base_rows = [row for row, name in enumerate(per_row) if name is None]
    np.testing.assert_array_equal(out["base"], out["base (use None)"])
    np.testing.assert_allclose(
        out["mixed"][base_rows], out["base"][base_rows], atol=1e-4
    )
    np.testing.assert_allclose(out["mixed (all base)"], out["base"], atol=1e-4)
    first = [row for row, name in enumerate(per_row) if name == "task0"]
    np.testing.assert_allclose(
        out["mixed (one adapter)"][first], out["mixed"][first], atol=1e-4
    )
    tuned = [row for row, name in enumerate(per_row) if name is not None]
    assert not np.allclose(out["mixed"][tuned], out["base"][tuned], atol=1e-4)


@pytest.mark.slow
def test_quick_run_writes_every_serving_and_column(tmp_path):
    assert bench.main(["--quick", "--repeats", "1", "--out", str(tmp_path)]) == 0
    with open(pathlib.Path(tmp_path) / "cpu_quick_adapters.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["serving"] for row in rows] == list(bench.SERVINGS)
    assert list(rows[0]) == [
        "serving",
        "rows",
        "batch_size",
        "adapters",
        "density",
        "seconds",
        "rows_per_s",
        "vs_base",
        "vs_base_q25",
        "vs_base_q75",
    ]
    assert float(rows[0]["vs_base"]) == 1.0
    for row in rows:
        seconds, rate = float(row["seconds"]), float(row["rows_per_s"])
        assert rate == pytest.approx(int(row["rows"]) / seconds, rel=1e-2)


def test_the_target_line_says_met_or_missed():
    rows = [{"serving": "base", "vs_base": 1.0}, {"serving": "mixed", "vs_base": 0.7}]
    assert bench.target(rows).endswith("(target >= 0.8: missed)")
    rows[1]["vs_base"] = 0.85
    assert bench.target(rows).endswith("(target >= 0.8: met)")
