"""The ten paths of refimpl 1.0 that failed silently, one regression test each.

Each test reproduces what a user did and checks that it now either works or
raises a clear error naming what was wrong.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import _compat
from refimpl.partial import partial_weights
from refimpl.testing import assert_frozen

pytestmark = pytest.mark.every_backend

X = np.random.default_rng(0).normal(size=(32, 6)).astype("float32")
Y = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")


def _dense_model(**kwargs):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, name="proj", **kwargs)]
    )


def _numpy(value):
    return np.array(keras.ops.convert_to_numpy(value))


# 1 ------------------------------------------------------------------------
def test_kernel_constraint_is_honoured_not_dropped():
    model = _dense_model(kernel_constraint=keras.constraints.NonNeg())
    model.get_layer("proj").kernel.assign(np.abs(_numpy(model.layers[0].kernel)))
    mask = np.ones((6, 4), bool)
    mask[0] = False
    converted = refimpl.partialize(model, {"proj": mask})
    converted.compile(keras.optimizers.SGD(1.0), "mse")
    # A large step towards negative values: NonNeg must clip the free entries.
    converted.fit(X, -100.0 * np.abs(Y), epochs=3, verbose=0)
    kernel = _numpy(converted.get_layer("proj").kernel)
    assert kernel.min() >= 0.0
    assert (kernel[mask] == 0.0).any()  # the constraint did act


def test_a_kernel_constraint_that_is_not_elementwise_is_refused():
    model = _dense_model(kernel_constraint=keras.constraints.MaxNorm(1.0))
    with pytest.raises(ValueError, match="kernel_constraint=MaxNorm"):
        refimpl.partialize(model, {"proj": np.eye(6, 4, dtype=bool)})
    with pytest.raises(ValueError, match="kernel_constraint=UnitNorm"):
        refimpl.PartialDense(4, np.eye(6, 4, dtype=bool), kernel_constraint="unit_norm")


# 2 ------------------------------------------------------------------------
def test_masked_optimizer_from_config_matches_masks_by_path_not_index():
    a = keras.Variable(np.zeros((3, 3), "float32"), name="a")
    b = keras.Variable(np.zeros((3, 3), "float32"), name="b")
    optimizer = refimpl.MaskedOptimizer(
        keras.optimizers.SGD(0.1), [(b, np.eye(3, dtype=bool))]
    )
    optimizer.build([a, b])
    config = optimizer.get_config()
    rebuilt = refimpl.MaskedOptimizer.from_config(config)
    rebuilt.build([b, a])  # another order: the saved index points at `a`
    assert rebuilt._mask_of.get(rebuilt._var_key(b)) is not None
    assert rebuilt._mask_of.get(rebuilt._var_key(a)) is None


def test_masked_optimizer_from_config_refuses_an_ambiguous_path():
    from refimpl.optimizers import _find_path

    inner = [keras.Variable(np.zeros(2), name="kernel") for _ in range(2)]
    # Two variables whose paths both end in the saved path.
    paths = [v.path for v in inner]
    assert paths[0] == paths[1]
    with pytest.raises(ValueError, match="2 variables"):
        _find_path(paths[0], inner)


# 3 ------------------------------------------------------------------------
def test_a_short_name_matching_several_layers_converts_every_one():
    def block(name):
        inputs = keras.Input((6,))
        return keras.Model(
            inputs, keras.layers.Dense(6, name="proj")(inputs), name=name
        )

    inputs = keras.Input((6,))
    outputs = block("second")(block("first")(inputs))
    model = keras.Model(inputs, outputs)
    mask = np.eye(6, dtype=bool)
    converted = refimpl.partialize(model, {"proj": mask})
    weights = partial_weights(converted)
    assert len(weights) == 2, weights
    assert {weight.num_free for weight in weights} == {6}
    np.testing.assert_array_equal(
        converted.predict(X, verbose=0), model.predict(X, verbose=0)
    )


# 4 ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: refimpl.BandedDense(1, 1, fixed_diagonal=2.0), id="banded_fixed"
        ),
        pytest.param(
            lambda: refimpl.BlockDense(
                [[0.5 * np.eye(3), "trainable"]], col_sizes=[3, 2]
            ),
            id="block_fixed",
        ),
    ],
)
def test_structured_shell_refuses_to_run_on_missing_fixed_values(make):
    layer = make()
    layer.build((None, 3))
    shell = type(layer).from_config(layer.get_config())
    shell.build((None, 3))
    with pytest.raises(_compat.NotLoadedError, match="without its weights"):
        shell(np.ones((1, 3), "float32"))
    shell.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        _numpy(shell(np.ones((1, 3), "float32"))),
        _numpy(layer(np.ones((1, 3), "float32"))),
    )


# 5 ------------------------------------------------------------------------
def test_saving_leaves_the_frozen_base_untouched(tmp_path):
    mask = np.eye(6, 4, dtype=bool)
    converted = refimpl.partialize(_dense_model(), {"proj": mask})
    layer = converted.get_layer("proj")
    layer.partial_weight.free.assign(
        np.full(layer.partial_weight.num_free, 7.0, "float32")
    )
    base = _numpy(layer.partial_weight.base)
    converted.save(tmp_path / "m.keras")
    np.testing.assert_array_equal(_numpy(layer.partial_weight.base), base)
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(
        _numpy(loaded.get_layer("proj").kernel), _numpy(layer.kernel)
    )


# 6 ------------------------------------------------------------------------
def test_a_narrower_dtype_that_rounds_the_frozen_entries_is_refused():
    values = np.full((3, 3), 0.1, "float32")  # 0.1 is not a float16
    with pytest.raises(ValueError, match="`dtype` 'float16'"):
        refimpl.PartialVariable(values, np.eye(3, dtype=bool), dtype="float16")
    exact = refimpl.PartialVariable(values.astype("float16"), np.eye(3, dtype=bool))
    assert exact.base.dtype == "float16"
    # Values a float16 holds exactly are accepted as they are.
    halves = np.full((3, 3), 0.5, "float32")
    v = refimpl.PartialVariable(halves, np.eye(3, dtype=bool), dtype="float16")
    np.testing.assert_array_equal(_numpy(v.value()).astype("float32"), halves)


# 7 ------------------------------------------------------------------------
def test_the_sparse_product_keeps_the_shape_of_a_one_dimensional_input():
    w = np.random.default_rng(2).normal(size=(6, 4)).astype("float32")
    mask = np.zeros((6, 4), bool)
    mask[1, 2] = True
    x = X[0]
    outputs = {}
    for mode in ("delta", "sparse"):
        pv = refimpl.PartialVariable(w, mask, mode=mode)
        outputs[mode] = _numpy(pv.matmul(x))
    assert outputs["sparse"].shape == outputs["delta"].shape == (4,)
    np.testing.assert_allclose(
        outputs["sparse"], outputs["delta"], rtol=1e-6, atol=1e-6
    )


# 8 ------------------------------------------------------------------------
def test_converting_in_place_after_fit_asks_for_a_new_compile():
    model = _dense_model()
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(X, Y, epochs=1, verbose=0)
    mask = np.eye(6, 4, dtype=bool)
    refimpl.partialize(model, {"proj": mask}, in_place=True)
    with pytest.raises(ValueError, match="compile"):
        model.fit(X, Y, epochs=1, verbose=0)
    model.compile(keras.optimizers.Adam(0.01), "mse")
    before = _numpy(model.get_layer("proj").kernel)
    model.fit(X, Y, epochs=2, verbose=0)
    after = _numpy(model.get_layer("proj").kernel)
    assert_frozen(before, after, mask)
    assert (after[mask] != before[mask]).all()  # the free entries trained


# 9 ------------------------------------------------------------------------
def test_a_converted_model_converts_again_on_another_layer():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(6, name="a"),
            keras.layers.Dense(4, name="b"),
        ]
    )
    once = refimpl.partialize(model, {"a": np.eye(6, dtype=bool)})
    twice = refimpl.partialize(once, {"b": np.eye(6, 4, dtype=bool)})
    assert [type(layer).__name__ for layer in twice.layers] == ["PartialDense"] * 2
    np.testing.assert_array_equal(
        twice.predict(X, verbose=0), model.predict(X, verbose=0)
    )


def test_a_partial_layer_builds_from_a_call():
    layer = refimpl.PartialDense(4, np.eye(6, 4, dtype=bool))
    shell = refimpl.PartialDense.from_config(layer.get_config())
    out = keras.Sequential([keras.Input((6,)), shell])  # built by a symbolic call
    assert shell.built and out.output_shape == (None, 4)


# 10 -----------------------------------------------------------------------
def test_an_error_message_never_prints_a_whole_array():
    array = np.random.default_rng(0).normal(size=(64, 64))
    with pytest.raises(TypeError) as raised:
        refimpl.selection.random_mask(array, k=5)
    message = str(raised.value)
    assert "ndarray of shape (64, 64)" in message
    assert len(message) < 300
    assert str(array[0, 0])[:6] not in message
