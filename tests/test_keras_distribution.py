"""Partially trainable models under keras.distribution, on 8 simulated JAX devices.

``make backends`` runs this module under ``KERAS_BACKEND=jax`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` and
``REFIMPL_DISTRIBUTION_TESTS=required`` (where a missing mesh fails instead of
skipping). For ``DataParallel`` and for ``ModelParallel`` on a 1-D and a 2-D
mesh, by rows, by columns and by both:

* every weight of the converted model has the layout the plain model's weight
  of the same path has; the composed weight (``layer.kernel``) has its base's
  layout; ``partial_free`` and ``partial_positions`` are replicated unless a
  ``LayoutMap`` key names them;
* direct calls and ``predict`` give the plain model's outputs bit for bit;
* ``fit`` keeps every frozen entry's bits and trains as on one device;
* ``.keras`` files load under the distribution and without it, and ``merge``
  gives back plain layers with the same layouts and outputs;
* every converted layer type, and a keras-hub backbone under its own
  ``get_layout_map``.
"""

from __future__ import annotations

import os
import re

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.testing import assert_frozen
from tests.models import partial_layers as _partial

pytestmark = pytest.mark.every_backend

DEVICES = 8
_REQUIRED = os.environ.get("REFIMPL_DISTRIBUTION_TESTS") == "required"


def _devices():
    if keras.backend.backend() != "jax":
        return None
    import jax

    devices = jax.devices("cpu")
    return devices if len(devices) >= DEVICES else None


if _devices() is None:
    reason = (
        f"keras.distribution needs the JAX backend with {DEVICES} devices "
        f"(XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES}); "
        f"running on {keras.backend.backend()}"
    )
    if _REQUIRED:
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

dist = keras.distribution
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 16)).astype("float32")
Y = RNG.normal(size=(32, 8)).astype("float32")


def _mesh(shape, names):
    return dist.DeviceMesh(shape, names, _devices()[: int(np.prod(shape))])


def _model_parallel(mesh, layouts, batch="batch"):
    layout_map = dist.LayoutMap(mesh)
    for key, axes in layouts.items():
        layout_map[key] = axes
    return dist.ModelParallel(layout_map=layout_map, batch_dim_name=batch)


def _distribution(name):
    flat = _mesh((8,), ["model"])
    square = _mesh((2, 4), ["batch", "model"])
    return {
        "data": lambda: dist.DataParallel(devices=_devices()),
        "columns_then_rows": lambda: _model_parallel(
            square, {"d1/kernel": (None, "model"), "d2/kernel": ("model", None)}
        ),
        "rows_then_columns_1d": lambda: _model_parallel(
            flat, {"d1/kernel": ("model", None), "d2/kernel": (None, "model")}, "model"
        ),
        "both_axes_2d": lambda: _model_parallel(
            square, {"d1/kernel": ("batch", "model"), "d2/kernel": ("model", "batch")}
        ),
    }[name]()


DISTRIBUTIONS = ["data", "columns_then_rows", "rows_then_columns_1d", "both_axes_2d"]


@pytest.fixture(autouse=True)
def _no_distribution_after():
    yield
    dist.set_distribution(None)


def spec(tensor) -> tuple:
    """The sharding of a tensor or variable, one entry per axis (None = whole)."""
    value = getattr(tensor, "value", tensor)
    axes = tuple(value.sharding.spec)
    return axes + (None,) * (len(value.shape) - len(axes))


def layouts(model) -> dict:
    return {v.path: spec(v) for v in model.weights}


def _plain(seed=0, first_bias=True):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu", use_bias=first_bias, name="d1")(
        inputs
    )
    return keras.Model(inputs, keras.layers.Dense(8, name="d2")(hidden))


MASKS = {
    "d1": selection.random_mask((16, 32), fraction=0.125, seed=1),  # 64 free
    "d2": selection.random_mask((32, 8), fraction=0.125, seed=2),  # 32 free
}


def _numpy(x):
    return np.array(keras.ops.convert_to_numpy(x))


def _converted(distribution, first_bias=True, **kwargs):
    with distribution.scope():
        plain = _plain(first_bias=first_bias)
        converted = refimpl.partialize(plain, MASKS, **kwargs)
    return plain, converted


def _fit(model, epochs=3):
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_layouts_follow_the_plain_model_and_outputs_are_bit_identical(name):
    distribution = _distribution(name)
    plain, converted = _converted(distribution)
    before = layouts(plain)
    after = layouts(converted)
    for path, axes in before.items():
        assert after[path] == axes, path  # the base keeps its path and layout
    for layer in (converted.get_layer("d1"), converted.get_layer("d2")):
        assert spec(layer.kernel) == spec(layer.partial_weight.base), layer.name
        assert spec(layer.partial_weight.free) == (None,)
        assert spec(layer.partial_weight.positions) == (None,)
    with distribution.scope():
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))
        np.testing.assert_array_equal(
            converted.predict(X, batch_size=16, verbose=0),
            plain.predict(X, batch_size=16, verbose=0),
        )


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_fit_keeps_frozen_entries_and_trains_as_on_one_device(name):
    distribution = _distribution(name)
    _, converted = _converted(distribution)
    start = {n: _numpy(converted.get_layer(n).kernel) for n in MASKS}
    with distribution.scope():
        _fit(converted)
    _, alone = _converted(dist.DataParallel(devices=_devices()[:1]))
    _fit(alone)
    for n, mask in MASKS.items():
        layer = converted.get_layer(n)
        trained = _numpy(layer.kernel)
        assert_frozen(start[n], trained, mask)
        assert not np.array_equal(trained[mask], start[n][mask])
        # The replicas' sums add in another order than one device's.
        np.testing.assert_allclose(
            trained, _numpy(alone.get_layer(n).kernel), rtol=1e-5, atol=1e-6
        )
        assert spec(layer.kernel) == spec(layer.partial_weight.base)
    for variable in converted.optimizer.variables:
        if "partial_free" in variable.path:
            assert spec(variable) == (None,), variable.path


def _reloads_alike(model, distribution, path, x):
    """Save ``model``; load it under ``distribution``: same outputs and layouts."""
    model.save(path)
    with distribution.scope():
        loaded = keras.saving.load_model(path)
        np.testing.assert_array_equal(_numpy(loaded(x)), _numpy(model(x)))
    assert layouts(loaded) == layouts(model)


@pytest.mark.parametrize("name", ["columns_then_rows", "both_axes_2d"])
def test_keras_file_loads_under_the_distribution_and_without_it(name, tmp_path):
    distribution = _distribution(name)
    _, converted = _converted(distribution)
    with distribution.scope():
        _fit(converted, epochs=1)
    path = tmp_path / "converted.keras"
    _reloads_alike(converted, distribution, path, X)
    alone = keras.saving.load_model(path)
    for a, b in zip(alone.weights, converted.weights):
        np.testing.assert_array_equal(_numpy(a), _numpy(b), err_msg=a.path)
        assert len(a.value.sharding.device_set) == 1  # one device, no mesh


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_merge_gives_plain_layers_with_the_plain_layouts(name):
    distribution = _distribution(name)
    plain, converted = _converted(distribution)
    with distribution.scope():
        _fit(converted, epochs=1)
        merged = refimpl.merge(converted)
        np.testing.assert_array_equal(_numpy(merged(X)), _numpy(converted(X)))
    assert layouts(merged) == layouts(plain)
    for n in MASKS:
        np.testing.assert_array_equal(
            _numpy(merged.get_layer(n).kernel), _numpy(converted.get_layer(n).kernel)
        )


def test_a_key_for_every_weight_of_a_layer_does_not_catch_the_partial_weights():
    # Right for the plain layer, whose one weight is its kernel; a vector of
    # free values cannot take a 2-D layout.
    distribution = _model_parallel(
        _mesh((2, 4), ["batch", "model"]), {"d1/.*": (None, "model")}
    )
    plain, converted = _converted(distribution, first_bias=False)
    assert spec(converted.get_layer("d1").partial_weight.free) == (None,)
    assert spec(converted.get_layer("d1").partial_weight.base) == (None, "model")
    with distribution.scope():
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))


def test_a_key_that_names_the_free_values_shards_them():
    distribution = _model_parallel(
        _mesh((2, 4), ["batch", "model"]),
        {"d1/kernel": ("model", None), "d1/partial_free": ("model",)},
    )
    plain, converted = _converted(distribution)
    layer = converted.get_layer("d1")
    assert spec(layer.partial_weight.free) == ("model",)
    assert spec(layer.partial_weight.positions) == (None,)
    start = _numpy(layer.kernel)
    with distribution.scope():
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))
        _fit(converted)
    assert_frozen(start, _numpy(layer.kernel), MASKS["d1"])
    slots = [v for v in converted.optimizer.variables if "d1_partial_free" in v.path]
    assert slots and all(spec(v) == ("model",) for v in slots)


def test_a_key_that_names_the_positions_shards_them():
    distribution = _model_parallel(
        _mesh((2, 4), ["batch", "model"]),
        {"d1/kernel": (None, "model"), ".*/partial_positions": ("model",)},
    )
    plain, converted = _converted(distribution)
    for n in MASKS:
        layer = converted.get_layer(n)
        assert spec(layer.partial_weight.positions) == ("model",)
        assert spec(layer.partial_weight.free) == (None,)
    start = _numpy(converted.get_layer("d1").kernel)
    with distribution.scope():
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))
        _fit(converted)
    assert_frozen(start, _numpy(converted.get_layer("d1").kernel), MASKS["d1"])


def test_keras_rebuilds_a_bidirectional_without_its_name_in_the_paths(tmp_path):
    # What the chapter's note says of Keras: a LayoutMap key for these
    # weights must match both paths.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3, 5))
    wrapped = keras.layers.Bidirectional(keras.layers.GRU(2), name="bi")
    model = keras.Model(inputs, wrapped(inputs))
    paths = [v.path for v in model.weights]
    assert "bi/forward_gru/gru_cell/kernel" in paths
    model.save(tmp_path / "bi.keras")
    for rebuilt in (
        keras.models.clone_model(model),
        keras.saving.load_model(tmp_path / "bi.keras"),
    ):
        again = [v.path for v in rebuilt.weights]
        assert "forward_gru/gru_cell/kernel" in again
        assert not any(p.startswith("bi/") for p in again)


@pytest.mark.parametrize(
    "axes, count",
    [(("model", None), 64), (("model",), 62)],
    ids=["two_axes_for_a_vector", "axis_does_not_divide_the_count"],
)
def test_a_named_layout_that_does_not_fit_is_refused(axes, count):
    distribution = _model_parallel(
        _mesh((2, 4), ["batch", "model"]), {"d1/partial_free": axes}
    )
    mask = MASKS["d1"].copy()
    mask.flat[np.flatnonzero(mask)[count:]] = False
    with distribution.scope():
        plain = _plain()
        masks = {"d2": MASKS["d2"], "d1": mask}  # d2 first: nothing is converted
        with pytest.raises(ValueError, match="LayoutMap entry for 'd1/partial_free'"):
            refimpl.partialize(plain, masks, in_place=True)
    assert not _partial(plain)


def test_select_form_lays_the_free_tensor_out_like_its_base():
    distribution = _distribution("columns_then_rows")
    plain, converted = _converted(distribution, mode="select")
    for n in MASKS:
        layer = converted.get_layer(n)
        assert spec(layer.partial_weight.free) == spec(layer.partial_weight.base)
    with distribution.scope():
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))


# -- every converted layer type, and a keras-hub backbone --------------------------
def _layer_cases():
    from tests import test_partial_layers as layers
    from tests import test_recurrent_and_separable as recurrent

    def one(name):
        model, x, _ = layers._setup(name)
        return (
            model,
            x,
            {"target": lambda w: selection.random_mask(w.shape, fraction=0.3, seed=3)},
        )

    cases = {name: (lambda n=name: one(n)) for name in layers.MODELS}
    cases["rnn_cells_and_separable"] = lambda: (
        recurrent._model(),
        recurrent.X,
        recurrent.MASKS,
    )
    return cases


LAYER_CASES = _layer_cases()


def _outputs(model, x):
    out = model(x)
    return [_numpy(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


# The part of a weight's path that names it in any copy of the model: a
# Sequential's name (`sequential_1/`) differs from copy to copy, and Keras
# rebuilds a Bidirectional's layers from its config (in `clone_model` and
# `load_model` alike) without its name in their paths (`bi/forward_gru/...`
# becomes `forward_gru/...`).
def _stable(model, path):
    return path.removeprefix(model.name + "/").removeprefix("bi/")


def _shard_one_even_axis(model) -> dict:
    """A layout map entry per kernel: its first even axis over "model"."""
    entries = {}
    for variable in model.weights:
        even = [i for i, d in enumerate(variable.shape) if d % 2 == 0]
        if len(variable.shape) >= 2 and even:
            axes = [None] * len(variable.shape)
            axes[even[0]] = "model"
            key = "(.*/)?" + re.escape(_stable(model, variable.path))
            entries[key] = tuple(axes)
    return entries


def _stable_layouts(model):
    return {_stable(model, path): axes for path, axes in layouts(model).items()}


@pytest.mark.parametrize("name", LAYER_CASES)
def test_every_converted_layer_type_keeps_its_layout_and_its_outputs(name):
    probe, _, _ = LAYER_CASES[name]()
    entries = _shard_one_even_axis(probe)
    distribution = _model_parallel(_mesh((4, 2), ["batch", "model"]), entries)
    with distribution.scope():
        plain, x, masks = LAYER_CASES[name]()
        converted = refimpl.partialize(plain, masks)
    assert any(spec(v) != (None,) * len(v.shape) for v in plain.weights)
    plain_layouts = _stable_layouts(plain)
    after = _stable_layouts(converted)
    assert {p: a for p, a in after.items() if p in plain_layouts} == plain_layouts
    partial = _partial(converted)
    assert partial
    start = []
    for layer in partial:
        composed = getattr(layer, layer._partial_target)
        assert spec(composed) == spec(layer.partial_weight.base), layer.path
        start.append((_numpy(composed), layer.partial_weight.mask))
    with distribution.scope():
        for a, b in zip(_outputs(converted, x), _outputs(plain, x)):
            np.testing.assert_array_equal(a, b)
        converted.compile(optimizer="adam", loss="mse")
        targets = [np.ones_like(o) for o in _outputs(plain, x)]
        converted.fit(x, targets, batch_size=len(x), epochs=2, verbose=0)
    for layer, (before, mask) in zip(partial, start):
        assert_frozen(before, _numpy(getattr(layer, layer._partial_target)), mask)


def test_a_keras_hub_backbone_under_its_own_layout_map(tmp_path):
    import keras_hub

    mesh = _mesh((2, 4), ["batch", "model"])
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
    distribution = dist.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    policy = lambda w: selection.random_mask(w.shape, fraction=0.05, seed=0)  # noqa: E731
    tokens = np.random.default_rng(0).integers(0, 64, size=(4, 8)).astype("int32")
    x = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    with distribution.scope():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GemmaBackbone(
            vocabulary_size=64,
            num_layers=2,
            num_query_heads=4,
            num_key_value_heads=4,
            hidden_dim=32,
            intermediate_dim=64,
            head_dim=8,
        )
        converted = refimpl.partialize(
            backbone,
            {"token_embedding": policy, "query": policy, "ffw_gating": policy},
        )
        np.testing.assert_array_equal(_numpy(converted(x)), _numpy(backbone(x)))
    plain_layouts = layouts(backbone)
    assert {p: a for p, a in layouts(converted).items() if p in plain_layouts} == (
        plain_layouts
    )
    partial = _partial(converted)
    assert len(partial) == 1 + 2 * 2  # the embedding; query and gating per block
    for layer in partial:
        assert spec(getattr(layer, layer._partial_target)) == spec(
            layer.partial_weight.base
        )
        assert spec(layer.partial_weight.free) == (None,)
    assert spec(converted.get_layer("token_embedding").partial_weight.base) == (
        "model",
        "batch",
    )
    _reloads_alike(converted, distribution, tmp_path / "gemma.keras", x)


@pytest.mark.parametrize("name", ["columns_then_rows", "both_axes_2d"])
def test_the_slices_form_under_model_parallel(name):
    distribution = _distribution(name)
    rows = np.zeros((16, 32), bool)
    rows[[2, 9]] = True
    columns = np.zeros((32, 8), bool)
    columns[:, [1, 6]] = True
    with distribution.scope():
        plain = _plain()
        converted = refimpl.partialize(
            plain, {"d1": rows, "d2": columns}, mode="slices"
        )
        np.testing.assert_array_equal(_numpy(converted(X)), _numpy(plain(X)))
        start = [_numpy(converted.get_layer(n).kernel) for n in ("d1", "d2")]
        _fit(converted)
    for before, n, mask in zip(start, ("d1", "d2"), (rows, columns)):
        layer = converted.get_layer(n)
        assert layer.partial_weight.mode == "slices"
        assert spec(layer.partial_weight.base) == layouts(plain)[f"{n}/kernel"]
        after = _numpy(layer.kernel)
        assert_frozen(before, after, mask)
        assert not np.array_equal(after[mask], before[mask])
