"""The int8 variants of the real-model benchmark are what their names say.

``python -m evidence.benchmarks.real_models --quantized`` times them and
measures their memory; here each is built at the quick size and checked, and
the quick run writes the columns the full run commits. No timing is asserted:
the benchmark measures performance, the tests only what it runs.
"""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest

from evidence.benchmarks import real_models
from tests.models import partial_layers as _partial

SIZES = real_models._sizes(quick=True)


def _model(name):
    import tensorflow as tf

    return real_models._prepared(name, keras, np, tf, SIZES)[0]


def _codes(model):
    return [v for v in model.variables if str(v.dtype) == "int8"]


def test_int8_variants_quantize_every_kernel_and_the_embedding():
    model = _model("int8 floor")
    kernels = real_models._kernel_layers(keras, model)
    assert kernels and all(layer.quantization_mode == "int8" for layer in kernels)
    assert model.get_layer("embedding").quantization_mode == "int8"
    assert not any(v.trainable for v in _codes(model))
    names = {v.path.rpartition("/")[2] for v in model.trainable_variables}
    assert names <= {"gamma", "beta", "bias"}


def test_int8_lora_trains_only_the_factors_norms_and_biases():
    model = _model("int8 lora8")
    kernels = real_models._kernel_layers(keras, model)
    assert all(layer.lora_enabled and layer.lora_rank == 8 for layer in kernels)
    names = {v.path.rpartition("/")[2] for v in model.trainable_variables}
    assert names == {"lora_kernel_a", "lora_kernel_b", "gamma", "beta", "bias"}


def test_weight_bytes_count_codes_as_one_byte_and_floats_as_four():
    float_model = real_models.build(keras, SIZES)
    values = sum(int(np.prod(v.shape)) for v in float_model.variables)
    assert real_models.weight_bytes(float_model)["weight_bytes"] == 4 * values
    model = _model("int8 floor")
    held = real_models.weight_bytes(model)
    codes = sum(int(np.prod(v.shape)) for v in _codes(model))
    floats = sum(
        int(np.prod(v.shape)) for v in model.variables if str(v.dtype) == "float32"
    )
    assert held["weight_bytes"] == codes + 4 * floats
    assert held["weight_bytes"] == held["frozen_bytes"] + held["trainable_bytes"]
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert held["trainable_bytes"] == 4 * trainable


@pytest.mark.parametrize(
    "name, forms",
    [("int8 random 1%", {"delta", "sparse"}), ("int8 rows 1%", {"slices"})],
)
def test_partial_int8_variants_add_float_free_values_to_frozen_codes(name, forms):
    model = _model(name)
    partial = _partial(model)
    assert len(partial) == len(
        real_models._kernel_layers(keras, real_models.build(keras, SIZES))
    )
    assert {layer.partial_weight.mode for layer in partial} <= forms
    assert all(layer.quantization_mode == "int8" for layer in partial)
    assert all(layer.partial_weight.quantized is not None for layer in partial)
    assert not any(v.trainable for v in _codes(model))
    free = [layer.partial_weight.free for layer in partial]
    assert all(v.trainable and str(v.dtype) == "float32" for v in free)
    assert not model.get_layer("embedding").trainable
    assert real_models._form(model) in forms


@pytest.mark.slow
def test_quick_quantized_run_writes_every_variant_and_column(tmp_path):
    argv = ["--quantized", "--quick", "--repeats", "1", "--memory-repeats", "1"]
    assert real_models.main(argv + ["--out", str(tmp_path)]) == 0
    with open(tmp_path / "cpu_quick_transformer_int8.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["variant"] for row in rows] == list(real_models.QUANTIZED)
    columns = ["variant", "step_ms"]
    for reference in ("full", "int8_lora8"):
        columns += [f"vs_{reference}", f"vs_{reference}_q25", f"vs_{reference}_q75"]
    columns += [
        "trainable_values",
        "optimizer_state_values",
        "weight_bytes",
        "frozen_bytes",
        "trainable_bytes",
        "held_mb",
        "step_mb",
        "training_mb",
        "training_vs_full",
        "form",
    ]
    assert list(rows[0]) == columns
    by_name = {row["variant"]: row for row in rows}
    assert float(by_name["full"]["vs_full"]) == 1.0
    assert float(by_name["int8 lora8"]["vs_int8_lora8"]) == 1.0
    assert float(by_name["full"]["training_vs_full"]) == 1.0
    for row in rows:
        held, step = float(row["held_mb"]), float(row["step_mb"])
        assert float(row["training_mb"]) == pytest.approx(held + step, abs=0.11)
    assert by_name["int8 lora8"]["form"] == "lora"
    assert by_name["int8 rows 1%"]["form"] == "slices"
    assert by_name["full"]["form"] == ""
    # an int8 base holds about a quarter of the float kernels' bytes
    full_bytes = int(by_name["full"]["weight_bytes"])
    assert int(by_name["int8 floor"]["weight_bytes"]) < full_bytes / 2


@pytest.mark.slow
def test_quantized_components_take_apart_each_int8_step(tmp_path):
    argv = ["--quantized", "--components", "--quick", "--repeats", "1"]
    assert real_models.main(argv + ["--out", str(tmp_path)]) == 0
    with open(tmp_path / "cpu_quick_transformer_int8_components.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["variant"] for row in rows] == list(real_models.QUANTIZED_COMPONENTS)
    assert list(rows[0]) == [
        "variant",
        "compose_ms",
        "forward_ms",
        "gradient_ms",
        "update_ms",
        "step_ms",
    ]


def test_targets_are_judged_for_the_partial_int8_variants_only():
    rows = [
        {"variant": "full", "vs_int8_lora8": 0.5, "training_vs_full": 1.0},
        {"variant": "int8 lora8", "vs_int8_lora8": 1.0, "training_vs_full": 0.9},
        {"variant": "int8 random 1%", "vs_int8_lora8": 1.2, "training_vs_full": 0.4},
        {"variant": "int8 rows 1%", "vs_int8_lora8": 0.8, "training_vs_full": 0.6},
    ]
    lines = real_models.targets(rows)
    assert len(lines) == 2
    assert lines[0].startswith("int8 random 1%")
    assert "(target <= 1: missed)" in lines[0] and "(target <= 0.5: met)" in lines[0]
    assert "(target <= 1: met)" in lines[1] and "(target <= 0.5: missed)" in lines[1]
