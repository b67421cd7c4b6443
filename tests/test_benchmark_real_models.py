"""The variants of the real-model benchmark are what their names say.

``evidence.benchmarks.real_models`` times them; here each is built at the
quick size and checked: what trains, in which form, and under which scope.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from evidence.benchmarks import real_models
from tests.models import partial_layers as _partial

SIZES = real_models._sizes(quick=True)


def _model(name):
    import tensorflow as tf

    return real_models._prepared(name, keras, np, tf, SIZES)[0]


def _kernel_count(model):
    return len(real_models._kernel_layers(keras, model))


def test_full_trains_everything_and_the_floor_no_kernel():
    full = _model("full")
    assert all(v.trainable for v in full.weights)
    floor = _model("floor")
    names = {v.path.rpartition("/")[2] for v in floor.trainable_variables}
    assert names <= {"gamma", "beta", "bias"}


@pytest.mark.parametrize(
    "name, mode",
    [
        ("random 1%", "delta"),
        ("rows 1%", "slices"),
        ("rows 1% (delta)", "delta"),
        ("columns 1%", "slices"),
    ],
)
def test_partial_variants_convert_every_kernel_in_their_form(name, mode):
    model = _model(name)
    partial = _partial(model)
    assert len(partial) == _kernel_count(real_models.build(keras, SIZES))
    assert {layer.partial_mode for layer in partial} == {mode}
    assert not model.get_layer("embedding").trainable
    kernels = {id(layer.base_weight) for layer in partial}
    assert not any(id(v) in kernels for v in model.trainable_variables)


def test_the_remat_variant_is_rematerialized_and_lora_freezes_the_kernels():
    model = _model("random 1% (remat)")
    assert all(layer._remat_mode is not None for layer in _partial(model))
    lora = _model("lora4")
    names = {v.path.rpartition("/")[2] for v in lora.trainable_variables}
    assert "kernel" not in names and "lora_kernel_a" in names
