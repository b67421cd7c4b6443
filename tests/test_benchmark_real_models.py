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
CNN = real_models._sizes(quick=True, model="cnn")


def _model(name, sizes=SIZES):
    import tensorflow as tf

    return real_models._prepared(name, keras, np, tf, sizes)[0]


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
    assert {layer.partial_weight.mode for layer in partial} == {mode}
    assert not model.get_layer("embedding").trainable
    kernels = {id(layer.partial_weight.base) for layer in partial}
    assert not any(id(v) in kernels for v in model.trainable_variables)


def test_the_remat_variant_is_rematerialized_and_lora_freezes_the_kernels():
    model = _model("random 1% (remat)")
    assert all(layer._remat_mode is not None for layer in _partial(model))
    lora = _model("lora4")
    names = {v.path.rpartition("/")[2] for v in lora.trainable_variables}
    assert "kernel" not in names and "lora_kernel_a" in names


@pytest.mark.parametrize(
    "name, mode, side",
    [
        ("random 1%", "delta", None),
        ("channels 1%", "slices", -2),
        ("filters 1%", "slices", -1),
        ("filters 1% (delta)", "delta", -1),
    ],
)
def test_cnn_variants_convert_every_convolution_and_the_head(name, mode, side):
    model = _model(name, CNN)
    partial = _partial(model)
    plain = real_models.build(keras, CNN)
    assert len(partial) == _kernel_count(plain)
    convolutions = [
        layer for layer in plain.layers if type(layer) is keras.layers.Conv2D
    ]
    assert sum(isinstance(layer, keras.layers.Conv2D) for layer in partial) == len(
        convolutions
    )
    assert len(convolutions) == 10  # the stem, two stages of two blocks, a projection
    assert {layer.partial_weight.mode for layer in partial} == {mode}
    for layer in partial:
        mask = layer.partial_weight.mask
        if side is not None:  # whole slices along one axis: input or output
            kept = mask.any(
                axis=tuple(a for a in range(mask.ndim) if a != mask.ndim + side)
            )
            index = [slice(None)] * mask.ndim
            index[side] = kept
            assert mask[tuple(index)].all() and 0 < kept.sum() < kept.size / 2


def test_the_cnn_floor_trains_only_norms_and_biases():
    floor = _model("floor", CNN)
    names = {v.path.rpartition("/")[2] for v in floor.trainable_variables}
    assert names == {"gamma", "beta", "bias"}


def test_the_components_are_the_parts_of_the_step():
    import tensorflow as tf

    model = real_models.variant("random 1%", keras, np, SIZES)
    x, y = real_models._batch(np, SIZES)
    parts = real_models.stages(model, keras, tf)
    assert list(parts) == ["compose", "forward", "gradient", "update", "step"]
    kernels = [layer.kernel for layer in _partial(model)]
    composed = sum(float(np.sum(keras.ops.convert_to_numpy(k))) for k in kernels)
    np.testing.assert_allclose(float(parts["compose"](x, y)), composed, rtol=1e-4)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = float(loss_fn(y, model(x, training=True)))
    np.testing.assert_allclose(float(parts["forward"](x, y)), expected, rtol=1e-5)
    before = [v.numpy().copy() for v in model.trainable_variables]
    parts["gradient"](x, y)  # computes, does not update
    assert all(
        np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables)
    )
    parts["update"](x, y)
    assert not all(
        np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables)
    )
    rows = real_models.components(["full", "random 1%"], quick=True, repeats=1)
    assert [row["variant"] for row in rows] == ["full", "random 1%"]
    assert set(rows[0]) == {
        "variant",
        "compose_ms",
        "forward_ms",
        "gradient_ms",
        "update_ms",
        "step_ms",
    }
