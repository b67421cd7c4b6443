"""Smoke test of the benchmark pipeline: it runs and writes a well-formed CSV.

No timing is asserted: CI machines are shared and noisy. What is checked is
the shape of the result that the book reads.
"""

import math

import pytest

from benchmarks import report, run, variants


@pytest.fixture(scope="module")
def quick_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert run.main(["--quick", "--out", str(out), "--repeats", "2"]) == 0
    csvs = sorted(out.glob("*-quick.csv"))
    assert len(csvs) == 1, csvs
    pngs = sorted(p.name for p in out.glob("*.png"))
    return report.read_csv(csvs[0]), pngs


def test_quick_run_writes_the_agreed_columns_in_order(quick_rows):
    rows, _ = quick_rows
    assert list(rows[0]) == report.COLUMNS
    agreed = (
        "device,tf_version,jit,n,variant,density,free_params,optimizer_state_values,"
        "median_ms,q25_ms,q75_ms,ratio_to_dense,ratio_q25,ratio_q75,repeats"
    ).split(",")
    assert report.COLUMNS[: len(agreed)] == agreed


def test_quick_run_has_one_row_per_variant_and_setting(quick_rows):
    rows, _ = quick_rows
    keys = [(r["jit"], r["n"], r["variant"], r["density"]) for r in rows]
    assert len(keys) == len(set(keys))
    expected = list(run.cases(variants.ALL, [0.01, 0.5]))
    for jit in (False, True):
        found = [(v, d) for j, _, v, d in keys if j == jit]
        assert found == expected


def test_dense_baseline_has_ratio_one(quick_rows):
    rows, _ = quick_rows
    for dense in report.select(rows, variant="dense_adam"):
        assert dense["status"] == "ok"
        assert dense["ratio_to_dense"] == dense["ratio_q25"] == 1.0
        assert dense["ratio_q75"] == 1.0


def test_timed_rows_have_positive_ordered_statistics(quick_rows):
    rows, _ = quick_rows
    timed = [r for r in rows if r["status"] == "ok"]
    assert len(timed) > len(rows) // 2
    for r in timed:
        assert 0 < r["q25_ms"] <= r["median_ms"] <= r["q75_ms"], r
        assert 0 < r["ratio_q25"] <= r["ratio_to_dense"] <= r["ratio_q75"], r
        assert math.isfinite(r["ratio_to_dense"])


def test_rows_that_did_not_run_say_why_and_have_no_timing(quick_rows):
    rows, _ = quick_rows
    for r in rows:
        if r["status"] != "ok":
            assert r["status"], r
            assert r["median_ms"] is None and r["ratio_to_dense"] is None


def test_parameter_and_state_counts_follow_the_technique(quick_rows):
    rows, _ = quick_rows
    for r in report.select(rows, status="ok"):
        n = r["n"]
        full = {"dense_adam", *variants.MASKED, "one_hot_scatter", "band_naive"}
        if r["variant"] in full:
            assert r["optimizer_state_values"] == 2 * n * n  # Adam: 2 slots
        if r["variant"] == "partial_delta":
            assert r["optimizer_state_values"] == 2 * r["free_params"]
            assert r["free_params"] == round(r["density"] * n * n)
        if r["variant"].startswith("diag_"):
            assert r["free_params"] == n and r["optimizer_state_values"] == 2 * n


def test_quick_run_draws_the_plots(quick_rows):
    _, pngs = quick_rows
    assert pngs == [
        "cpu-quick_optimizer_state.png",
        "cpu-quick_ratio_vs_density.png",
        "cpu-quick_ratio_vs_n.png",
    ] or all(p.startswith("gpu-quick") for p in pngs)
