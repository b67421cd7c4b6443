"""Smoke test of the benchmark pipeline: it runs and writes a well-formed CSV.

No timing is asserted: CI machines are shared and noisy. What is checked is
the shape of the result that the book reads. The quick run takes a while, so
the tests that read it are marked ``slow``; building and stepping every
variant once, and the committed results, are checked in the fast suite.
"""

import math
import pathlib
import struct

import keras
import numpy as np
import pytest
import tensorflow as tf

from evidence import registry
from evidence.benchmarks import report, run, variants

# The benchmarked techniques that train one full variable.
RESTRICT = [t.id for t in registry.select(family=registry.RESTRICT) if t.benchmark]
PLOTS = ("optimizer_state", "ratio_vs_density", "ratio_vs_n")
# Drawn by a full run only: its hidden-layer, crossover, scaling and memory runs.
EXTRA_PLOTS = ("crossover", "hidden", "memory", "scaling")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert run.main(["--quick", "--out", str(out), "--repeats", "2"]) == 0
    return out


@pytest.fixture(scope="module")
def quick_rows(quick_run):
    csvs = sorted(quick_run.glob("*-quick.csv"))
    assert len(csvs) == 1, csvs
    return report.read_csv(csvs[0]), csvs[0].name.removesuffix("-quick.csv")


@pytest.mark.slow
def test_quick_run_writes_the_agreed_columns_in_order(quick_rows):
    rows, _ = quick_rows
    assert list(rows[0]) == report.COLUMNS
    agreed = (
        "device,tf_version,jit,n,variant,density,free_params,optimizer_state_values,"
        "median_ms,q25_ms,q75_ms,ratio_to_dense,ratio_q25,ratio_q75,repeats"
    ).split(",")
    assert report.COLUMNS[: len(agreed)] == agreed


@pytest.mark.slow
def test_quick_run_has_one_row_per_variant_and_setting(quick_rows):
    rows, _ = quick_rows
    keys = [(r["jit"], r["n"], r["variant"], r["density"]) for r in rows]
    assert len(keys) == len(set(keys))
    expected = list(variants.cases(variants.ALL, [0.01, 0.5]))
    for jit in (False, True):
        found = [(v, d) for j, _, v, d in keys if j == jit]
        assert found == expected


@pytest.mark.slow
def test_dense_baseline_has_ratio_one(quick_rows):
    rows, _ = quick_rows
    for dense in report.select(rows, variant="dense_adam"):
        assert dense["status"] == "ok"
        assert dense["ratio_to_dense"] == dense["ratio_q25"] == 1.0
        assert dense["ratio_q75"] == 1.0


@pytest.mark.slow
def test_timed_rows_have_positive_ordered_statistics(quick_rows):
    rows, _ = quick_rows
    timed = [r for r in rows if r["status"] == "ok"]
    assert len(timed) > len(rows) // 2
    for r in timed:
        assert 0 < r["q25_ms"] <= r["median_ms"] <= r["q75_ms"], r
        assert 0 < r["ratio_q25"] <= r["ratio_to_dense"] <= r["ratio_q75"], r
        assert math.isfinite(r["ratio_to_dense"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    variants.ALL,
)
def test_every_variant_ran_in_the_quick_run(quick_rows, name):
    rows, _ = quick_rows
    found = report.select(rows, variant=name)
    assert found, f"no row for {name}"
    failed = {
        (r["jit"], r["density"]): r["status"] for r in found if r["status"] != "ok"
    }
    assert not failed, failed


@pytest.mark.slow
def test_rows_that_did_not_run_say_why_and_have_no_timing(quick_rows):
    rows, _ = quick_rows
    for r in rows:
        if r["status"] != "ok":
            assert r["status"], r
            assert r["median_ms"] is None and r["ratio_to_dense"] is None


@pytest.mark.slow
def test_parameter_and_state_counts_follow_the_technique(quick_rows):
    rows, _ = quick_rows
    for r in report.select(rows, status="ok"):
        n = r["n"]
        full = {variants.BASELINE, "band_naive", *RESTRICT}
        if r["variant"] in full:
            assert r["optimizer_state_values"] == 2 * n * n  # Adam: 2 slots
        if r["variant"] == "partial_delta":
            assert r["optimizer_state_values"] == 2 * r["free_params"]
            assert r["free_params"] == round(r["density"] * n * n)
        if r["variant"].startswith("diag_"):
            assert r["free_params"] == n and r["optimizer_state_values"] == 2 * n


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    """Width and height of a PNG file; fails unless it is a PNG with pixels."""
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR", f"{path.name} has no PNG header chunk"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
def test_quick_run_draws_every_plot_as_a_non_empty_png(quick_run, quick_rows):
    _, device = quick_rows
    assert device == report.machine_description()[0]
    expected = {f"{device}-quick_{plot}.png" for plot in PLOTS}
    assert {p.name for p in quick_run.glob("*.png")} == expected
    for name in sorted(expected):
        width, height = _png_size(quick_run / name)
        assert width > 100 and height > 100, (name, width, height)


@pytest.mark.parametrize("plot", PLOTS + EXTRA_PLOTS)
def test_the_committed_plots_are_non_empty_pngs(plot):
    width, height = _png_size(run.RESULTS / f"cpu_{plot}.png")
    assert width > 100 and height > 100


def test_the_committed_results_name_only_known_variants():
    for csv in sorted(run.RESULTS.glob("*.csv")):
        rows = report.read_csv(csv)
        assert rows, csv.name
        assert {r["variant"] for r in rows} <= set(variants.ALL), csv.name
    full = report.read_csv(run.RESULTS / "cpu.csv")
    assert {r["variant"] for r in full} == set(variants.ALL)


@pytest.mark.parametrize("name", variants.ALL)
def test_every_variant_builds_and_takes_a_step(name):
    rng = np.random.default_rng(0)
    variant = variants.build(name, 8, rng, density=0.5)
    assert variant.name == name and variant.free_params > 0
    x = tf.constant(rng.standard_normal((4, 8)).astype("float32"))
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variant.params)
    before = [np.array(p) for p in variant.params]
    step = variants.make_step(variant, optimizer, jit=False)
    loss = step.python_function(x, tf.zeros((4, 8)))  # eagerly: no tracing
    assert np.isfinite(float(loss))
    assert any((np.array(p) != b).any() for p, b in zip(variant.params, before))


def test_variants_are_techniques_of_the_registry_or_comparisons():
    for name in variants.ALL:
        technique = variants.technique(name)
        if technique is None:
            assert name in (variants.BASELINE, variants.FLOOR) or name.endswith(
                "_naive"
            )
        else:
            assert technique is registry.get(name) and technique.benchmark
    with pytest.raises(ValueError, match="PartialVariable"):
        variants.build("PartialVariable (delta)", 8, np.random.default_rng(0))


def test_max_density_limits_the_sparse_product_only():
    cases = list(variants.cases(["partial_sparse", "partial_delta"], [0.01, 0.1, 0.5]))
    assert ("partial_sparse", 0.5) not in cases and ("partial_sparse", 0.1) in cases
    assert ("partial_delta", 0.5) in cases


def test_hidden_step_also_takes_the_input_gradient():
    rng = np.random.default_rng(0)
    variant = variants.build("partial_sparse", 8, rng, density=0.1)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variant.params)
    step = variants.make_step(variant, optimizer, jit=False, hidden=True)
    graph = step.get_concrete_function(tf.zeros((4, 8)), tf.zeros((4, 8))).graph
    first = variants.make_step(variant, optimizer, jit=False)
    fewer = first.get_concrete_function(tf.zeros((4, 8)), tf.zeros((4, 8))).graph
    assert len(graph.get_operations()) > len(fewer.get_operations())


def test_slopes_of_the_committed_scaling_run_follow_the_stated_asymptotics():
    rows = report.read_csv(run.RESULTS / "cpu.csv")
    rows += report.read_csv(run.RESULTS / "cpu_scaling.csv")
    fitted = report.slopes(rows, report.SCALING_CASES)
    assert fitted[("dense_adam", None)]["time"] > 1.5  # O(n^2) at batch 64
    for variant in ("diag_refimpl", "band_refimpl"):
        assert fitted[(variant, None)]["time"] < 1.5  # O(n), O(n b)
    assert set(fitted[("dense_adam", None)]["sizes"]) >= {1024, 4096, 8192}


def test_the_committed_memory_table_has_a_row_per_variant():

    rows = report.read_csv(run.RESULTS / "cpu_memory.csv")
    assert {r["variant"] for r in rows} == set(variants.ALL)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["peak_mb"] >= r["resident_mb"] > 0
