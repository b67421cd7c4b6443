import inspect

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import refimpl
from refimpl import (
    BandedDense,
    BlockDense,
    DiagonalDense,
    PartialDense,
)
from refimpl.testing import assert_frozen, count_free_parameters, moved

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

EYE3 = np.eye(3)
SEED_BLOCKS = [[None, -0.2 * EYE3], [0.35 * EYE3, "trainable"]]
RANDOM_MASK = np.random.default_rng(3).random((5, 4)) < 0.4
DENSE_MASK = np.random.default_rng(4).random((5, 4)) < 0.8

# name: (factory, input size, free kernel entries, trainable kernel values)
LAYERS = {
    "diagonal": (lambda: DiagonalDense(use_bias=True), 5, 5, 5),
    "band_fixed_diag": (
        lambda: BandedDense(1, 2, fixed_diagonal=1.0),
        6,
        5 + 5 + 4,
        5 + 5 + 4,
    ),
    "band_lower_only": (lambda: BandedDense(2, 0), 4, 4 + 3 + 2, 4 + 3 + 2),
    "block_seed": (lambda: BlockDense(SEED_BLOCKS), 6, 9, 9),
    "block_sizes": (
        lambda: BlockDense(
            [["trainable", None], [np.ones((1, 2)), "trainable"]],
            row_sizes=[2, 1],
            col_sizes=[2, 3],
            use_bias=True,
        ),
        3,
        4 + 3,
        4 + 3,
    ),
    "partial_delta": (
        lambda: PartialDense(4, RANDOM_MASK),
        5,
        RANDOM_MASK.sum(),
        RANDOM_MASK.sum(),
    ),
    "partial_select": (
        lambda: PartialDense(4, DENSE_MASK, mode="select"),
        5,
        DENSE_MASK.sum(),
        DENSE_MASK.size,  # select keeps a kernel-sized trainable weight
    ),
    "partial_indices": (
        lambda: PartialDense(3, [[0, 0], [2, 1], [1, 2]], activation="tanh"),
        3,
        3,
        3,
    ),
}


def _names(**marks):
    """Every layer name, with the xfail marks of this test."""
    return [pytest.param(name, marks=marks.get(name, ())) for name in LAYERS]


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(16, n)).astype("float32")


def _model(layer, n, *, jit=False, optimizer=None):
    model = keras.Sequential([keras.Input((n,)), layer])
    optimizer = optimizer or keras.optimizers.AdamW(0.05, weight_decay=0.5)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    return model


def _targets(model, n, seed=1):
    units = model.output_shape[-1]
    return np.random.default_rng(seed).normal(size=(16, units)).astype("float32")


def _mask(layer):
    """The trainable mask: a partial layer's holder's, a structured layer's own."""
    if isinstance(layer, PartialDense):
        return layer.partial_weight.mask
    return layer.trainable_mask


@pytest.fixture
def mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("name", _names())
def test_layer_trains_saves_loads_and_trains_again_with_frozen_entries_bit_exact(
    name, tmp_path
):
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    model = _model(layer, n)
    x = _data(n)
    y = _targets(model, n)
    start = keras.ops.convert_to_numpy(layer.kernel)
    mask = _mask(layer)
    model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    assert_frozen(start, layer.kernel, mask)
    assert (moved(start, layer.kernel) & mask).any(), "no free entry moved"

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )

    reloaded_layer = loaded.layers[0]
    assert type(reloaded_layer) is type(layer)
    np.testing.assert_array_equal(_mask(reloaded_layer), mask)
    before_second = keras.ops.convert_to_numpy(reloaded_layer.kernel)
    loaded.fit(x, y, epochs=2, batch_size=8, verbose=0)
    assert (moved(before_second, reloaded_layer.kernel) & mask).any()
    assert_frozen(start, reloaded_layer.kernel, mask)


@pytest.mark.parametrize("name", list(LAYERS))
def test_trainable_weights_hold_exactly_the_free_values(name):
    factory, n, free, trainable = LAYERS[name]
    layer = factory()
    layer.build((None, n))
    bias = layer.kernel.shape[1] if layer.use_bias else 0
    assert count_free_parameters(layer) == trainable + bias
    assert _mask(layer).sum() == free


@pytest.mark.parametrize("name", list(LAYERS))
def test_no_change_to_the_trainable_weights_moves_a_frozen_kernel_entry(name):
    # Overwrite every entry of every trainable weight, as a wild optimizer
    # could; in select mode that includes the masked-out entries of the
    # kernel-sized free weight. The composed kernel's frozen entries keep
    # their bits, and every free entry moves.
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    layer.build((None, n))
    start = keras.ops.convert_to_numpy(layer.kernel)
    rng = np.random.default_rng(0)
    for weight in layer.trainable_weights:
        weight.assign(weight + rng.uniform(1.0, 2.0, size=weight.shape))
    assert_frozen(start, layer.kernel, _mask(layer))
    np.testing.assert_array_equal(
        moved(start, layer.kernel), _mask(layer), "a free entry stayed"
    )


@pytest.mark.parametrize("name", list(LAYERS))
def test_summary_reports_the_true_trainable_count(name):
    factory, n, _, trainable = LAYERS[name]
    layer = factory()
    model = _model(layer, n)
    lines = []
    model.summary(print_fn=lambda line, *args, **kwargs: lines.append(line))
    text = "\n".join(lines)
    bias = layer.kernel.shape[1] if layer.use_bias else 0
    assert f"Trainable params: {trainable + bias:,} " in text
    fixed = layer.count_params() - trainable - bias
    assert f"Non-trainable params: {fixed:,} " in text


@pytest.mark.parametrize("name", list(LAYERS))
def test_call_equals_x_times_the_dense_kernel(name):
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    x = _data(n)
    y = layer(x)
    bias = keras.ops.convert_to_numpy(layer.bias) if layer.use_bias else 0.0
    expected = x @ keras.ops.convert_to_numpy(layer.kernel) + bias
    if isinstance(layer, PartialDense) and layer.activation is keras.activations.tanh:
        expected = np.tanh(expected)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name",
    _names(),
)
def test_from_config_round_trip_gives_the_same_layer(name):
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    x = _data(n)
    layer(x)
    config = layer.get_config()
    init_args = set(inspect.signature(type(layer).__init__).parameters)
    if isinstance(layer, PartialDense):
        # No arrays in a config: the mask travels as the positions, with the
        # weights; the config holds its size and the resolved mode instead.
        assert "trainable_mask" not in config
        assert config["num_free"] == layer.partial_weight.num_free
        assert config["mode"] == layer.partial_weight.mode
        init_args -= {"trainable_mask"}
    assert init_args - {"self", "kwargs"} <= set(config)
    clone = type(layer).from_config(config)
    clone.build((None, n))
    if isinstance(layer, PartialDense):
        # A shell: its positions and values come with the weights.
        with pytest.raises(
            refimpl._compat.NotLoadedError,
            match="was rebuilt from a config without its weights",
        ):
            clone(x)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == config
    np.testing.assert_array_equal(_mask(clone), _mask(layer))
    np.testing.assert_array_equal(clone(x), layer(x))


@pytest.mark.slow
@pytest.mark.tensorflow_only
@pytest.mark.parametrize("name", _names())
def test_checkpoint_round_trip_restores_the_kernel(name, tmp_path):
    factory, n, _, _ = LAYERS[name]
    model = _model(factory(), n)
    model.fit(_data(n), _targets(model, n), epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh = _model(factory(), n)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh.layers[0].kernel, model.layers[0].kernel)


@pytest.mark.tensorflow_only
@pytest.mark.slow  # XLA compiles per layer: make test runs it, make check does not
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_trains_under_jit_compile_and_mixed_float16(name, mixed_precision):
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    model = _model(layer, n, jit=True)
    x = _data(n)
    start = keras.ops.convert_to_numpy(layer.kernel)
    model.fit(x, _targets(model, n), epochs=2, batch_size=8, verbose=0)
    assert layer.kernel.dtype == tf.float32
    assert model(x).dtype == tf.float16
    assert_frozen(start, layer.kernel, _mask(layer))
    assert (moved(start, layer.kernel) & _mask(layer)).any()


def test_block_dense_reproduces_the_fixed_blocks_exactly():
    layer = BlockDense(SEED_BLOCKS)
    layer.build((None, 6))
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    np.testing.assert_array_equal(kernel[:3, :3], np.zeros((3, 3), "float32"))
    np.testing.assert_array_equal(kernel[:3, 3:], np.float32(-0.2) * np.eye(3))
    np.testing.assert_array_equal(kernel[3:, :3], np.float32(0.35) * np.eye(3))
    expected_mask = np.zeros((6, 6), bool)
    expected_mask[3:, 3:] = True
    np.testing.assert_array_equal(layer.trainable_mask, expected_mask)


@pytest.mark.tensorflow_only
def test_banded_dense_is_zero_outside_the_band_with_the_fixed_diagonal():
    layer = BandedDense(1, 1, fixed_diagonal=[1.0, 2.0, 3.0, 4.0])
    layer.build((None, 4))
    layer.off_diagonals.assign(np.arange(1, 7, dtype="float32"))
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    np.testing.assert_array_equal(np.diag(kernel), [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(np.diag(kernel, -1), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.diag(kernel, 1), [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(tf.linalg.band_part(kernel, 1, 1), kernel)


def test_partial_dense_from_dense_copies_kernel_and_bias_bit_exact():
    dense = keras.layers.Dense(4, activation="relu", bias_initializer="ones")
    dense.build((None, 5))
    for mode in ("delta", "select", "auto"):
        layer = PartialDense.from_dense(dense, RANDOM_MASK, mode=mode)
        np.testing.assert_array_equal(layer.kernel, dense.kernel)
        np.testing.assert_array_equal(layer.bias, dense.bias)
        x = _data(5)
        np.testing.assert_array_equal(layer(x), dense(x))


def test_partial_dense_modes_build_the_same_kernel():
    init = keras.initializers.GlorotUniform(seed=7)
    kernels = [
        PartialDense(4, RANDOM_MASK, kernel_initializer=init, mode=mode)
        for mode in ("delta", "select")
    ]
    for layer in kernels:
        layer.build((None, 5))
    np.testing.assert_array_equal(kernels[0].kernel, kernels[1].kernel)
    assert kernels[0].partial_weight.free.shape == (RANDOM_MASK.sum(),)
    assert kernels[1].partial_weight.free.shape == RANDOM_MASK.shape


@pytest.mark.slow
@pytest.mark.parametrize(
    "nothing",
    [
        pytest.param(np.zeros((3, 2), bool), id="false_mask"),
        pytest.param(np.zeros((0, 2), "int64"), id="empty_index_array"),
        pytest.param([], id="empty_list"),
    ],
)
def test_partial_dense_with_nothing_free_trains_only_the_bias(nothing):
    layer = PartialDense(2, nothing, use_bias=True)
    model = _model(layer, 3)
    start = keras.ops.convert_to_numpy(layer.kernel)
    model.fit(_data(3), _targets(model, 3), epochs=1, verbose=0)
    assert_frozen(start, layer.kernel, np.zeros((3, 2), bool))
    assert count_free_parameters(layer) == 2


def test_partial_dense_is_a_dense_defaulting_to_delta_with_its_kernel_frozen():
    layer = PartialDense(4, RANDOM_MASK)
    layer.build((None, 5))
    assert isinstance(layer, keras.layers.Dense)
    assert layer.partial_weight.mode == layer.get_config()["mode"] == "delta"
    assert layer.partial_weight.num_free == RANDOM_MASK.sum()
    # The Dense's own kernel variable is the frozen base.
    assert layer.partial_weight.base is layer._kernel
    assert not layer.partial_weight.base.trainable
    assert not layer.partial_weight.positions.trainable
    positions_dtype = layer.partial_weight.positions.dtype
    assert keras.backend.standardize_dtype(positions_dtype) == "int32"
    assert {w.name for w in layer.trainable_weights} == {"partial_free", "bias"}
    assert {w.path for w in layer.weights} == {
        f"{layer.name}/kernel",
        f"{layer.name}/bias",
        f"{layer.name}/partial_free",
        f"{layer.name}/partial_positions",
    }
    # The positions are the mask's flat row-major positions.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer.partial_weight.positions),
        np.flatnonzero(RANDOM_MASK),
    )


def test_partial_dense_weight_order_is_the_documented_one():
    layer = PartialDense(4, RANDOM_MASK)
    layer.build((None, 5))
    # Dense's own weights first, then the two a partial layer adds.
    assert [w.name for w in layer.weights] == [
        "kernel",
        "bias",
        "partial_free",
        "partial_positions",
    ]


def test_partial_dense_auto_mode_resolves_by_density_and_default_does_not():
    one = [[2, 1]]  # 1 of 20 entries free
    layers = {
        "default_dense": PartialDense(4, DENSE_MASK),
        "auto_dense": PartialDense(4, DENSE_MASK, mode="auto"),
        "auto_sparse": PartialDense(4, one, mode="auto"),
    }
    for layer in layers.values():
        layer.build((None, 5))
    assert layers["default_dense"].partial_weight.mode == "delta"
    assert layers["auto_dense"].partial_weight.mode == "select"
    assert layers["auto_sparse"].partial_weight.mode == "delta"
    assert layers["auto_dense"].get_config()["mode"] == "select"


def test_fixed_values_are_non_trainable_weights_that_count_params_includes():
    band = BandedDense(1, 2, fixed_diagonal=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    band.build((None, 6))
    assert [w.name for w in band.non_trainable_weights] == ["fixed_diagonal"]
    np.testing.assert_array_equal(band.fixed_diagonal, [1, 2, 3, 4, 5, 6])
    assert count_free_parameters(band) == 5 + 5 + 4
    assert band.count_params() == 5 + 5 + 4 + 6

    blocks = BlockDense(SEED_BLOCKS)
    blocks.build((None, 6))
    assert [w.name for w in blocks.non_trainable_weights] == ["fixed_0_1", "fixed_1_0"]
    assert count_free_parameters(blocks) == 9
    assert blocks.count_params() == 9 + 9 + 9


@pytest.mark.slow
def test_fixed_values_stay_bit_exact_under_weight_decay():
    layer = BlockDense(SEED_BLOCKS)
    model = _model(layer, 6)
    fixed = [keras.ops.convert_to_numpy(w) for w in layer.non_trainable_weights]
    model.fit(_data(6), _targets(model, 6), epochs=2, batch_size=8, verbose=0)
    for before, weight in zip(fixed, layer.non_trainable_weights):
        assert_frozen(before, weight, np.zeros(before.shape, bool))


def test_banded_dense_takes_a_numpy_fixed_diagonal():
    values = np.array([1.0, 2.0, 3.0, 4.0])
    layer = BandedDense(1, 1, fixed_diagonal=values)
    layer.build((None, 4))
    np.testing.assert_array_equal(
        np.diag(keras.ops.convert_to_numpy(layer.kernel)), values
    )


@pytest.mark.parametrize(
    "make, error, words",
    [
        pytest.param(
            lambda: DiagonalDense(use_bias="no"), TypeError, "use_bias", id="diag_bias"
        ),
        pytest.param(
            lambda: BandedDense(-1, 0), ValueError, "lower=-1", id="band_negative"
        ),
        pytest.param(
            lambda: BandedDense(1, 1.5), TypeError, "upper=1.5", id="band_float"
        ),
        pytest.param(lambda: BandedDense(True, 0), TypeError, "lower", id="band_bool"),
        pytest.param(
            lambda: BandedDense(0, 0, fixed_diagonal=np.eye(2)),
            ValueError,
            "fixed_diagonal",
            id="band_fixed_2d",
        ),
        pytest.param(
            lambda: BandedDense(0, 0, fixed_diagonal=[[1.0, 0.0], [0.0, 1.0]]),
            ValueError,
            "fixed_diagonal",
            id="band_fixed_2d_list",
        ),
        pytest.param(
            lambda: BandedDense(0, 0, fixed_diagonal="one"),
            TypeError,
            "fixed_diagonal",
            id="band_fixed_text",
        ),
        pytest.param(lambda: BlockDense([]), ValueError, "non-empty", id="block_empty"),
        pytest.param(
            lambda: BlockDense([[EYE3, None], [EYE3]]),
            ValueError,
            "rectangular",
            id="ragged",
        ),
        pytest.param(
            lambda: BlockDense([["train"]], row_sizes=[1], col_sizes=[1]),
            ValueError,
            "'train'",
            id="block_unknown_word",
        ),
        pytest.param(
            lambda: BlockDense([[np.ones((2, 2, 2))]]),
            ValueError,
            "at most 2",
            id="block_3d",
        ),
        pytest.param(
            lambda: BlockDense([[np.eye(2), np.eye(3)]]),
            ValueError,
            "block row 0",
            id="block_heights_disagree",
        ),
        pytest.param(
            lambda: BlockDense([[np.eye(2)], [np.ones((2, 3))]]),
            ValueError,
            "block column 0",
            id="block_widths_disagree",
        ),
        pytest.param(
            lambda: BlockDense([["trainable", EYE3]]),
            ValueError,
            "col_sizes",
            id="block_width_unknown",
        ),
        pytest.param(
            lambda: BlockDense([[EYE3]], row_sizes=[2]),
            ValueError,
            "block row 0",
            id="block_size_conflict",
        ),
        pytest.param(
            lambda: BlockDense([[EYE3]], row_sizes=[3, 3]),
            ValueError,
            "row_sizes",
            id="block_sizes_length",
        ),
        pytest.param(
            lambda: BlockDense([["trainable"]], row_sizes=[0], col_sizes=[1]),
            ValueError,
            "positive",
            id="block_zero_size",
        ),
        pytest.param(
            lambda: PartialDense(0, []), ValueError, "units=0", id="units_zero"
        ),
        pytest.param(
            lambda: PartialDense(-1, []), ValueError, "units=-1", id="units_neg"
        ),
        pytest.param(
            lambda: PartialDense(2.5, []), TypeError, "units=2.5", id="units_float"
        ),
        pytest.param(
            lambda: PartialDense(2, np.ones((3, 3), bool)),
            ValueError,
            "trainable_mask",
            id="mask_columns",
        ),
        pytest.param(
            lambda: PartialDense(2, [], mode="fast"), ValueError, "mode", id="mode"
        ),
    ],
)
def test_bad_constructor_argument_raises(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


@pytest.mark.parametrize(
    "make, n, words",
    [
        pytest.param(lambda: BandedDense(3, 0), 3, "lower=3", id="band_too_wide"),
        pytest.param(lambda: BandedDense(0, 4), 3, "upper=4", id="upper_too_wide"),
        pytest.param(
            lambda: BandedDense(0, 0, fixed_diagonal=[1.0, 2.0]),
            3,
            "fixed_diagonal",
            id="fixed_length",
        ),
        pytest.param(
            lambda: BlockDense(SEED_BLOCKS), 5, "sum of the block-row", id="block_fit"
        ),
        pytest.param(
            lambda: PartialDense(2, np.ones((4, 2), bool)),
            3,
            "trainable_mask",
            id="mask_rows",
        ),
        pytest.param(
            lambda: PartialDense(2, [[3, 0]]),
            3,
            "out of range",
            id="index_out_of_range",
        ),
        pytest.param(lambda: DiagonalDense(), None, "must be known", id="unknown_size"),
    ],
)
def test_bad_input_size_raises_when_built(make, n, words):
    layer = make()
    with pytest.raises(ValueError) as info:
        layer.build((None, n))
    assert words in str(info.value)


@pytest.mark.parametrize(
    "dense, error",
    [
        pytest.param(keras.layers.Dense(2), TypeError, id="unbuilt"),
        pytest.param(keras.layers.Conv1D(2, 1), TypeError, id="not_dense"),
    ],
)
def test_bad_from_dense_argument_raises(dense, error):
    with pytest.raises(error, match="dense"):
        PartialDense.from_dense(dense, [])


def test_kernel_of_an_unbuilt_layer_raises():
    if keras.backend.backend() == "torch":
        pytest.skip(
            "a torch layer is an nn.Module, whose __getattr__ replaces the message"
        )
    with pytest.raises(
        AttributeError, match="You must build the layer before accessing"
    ):
        PartialDense(2, np.zeros((3, 2), bool)).kernel  # noqa: B018
    partial = PartialDense(2, [[0, 0]], name="pd")
    with pytest.raises(AttributeError, match="`partial_weight`. Received: 'pd'"):
        partial.partial_weight  # noqa: B018
    unbuilt = DiagonalDense(name="diag")
    with pytest.raises(AttributeError, match="Build the layer before reading `kernel`"):
        unbuilt.kernel  # noqa: B018
    with pytest.raises(AttributeError, match="`trainable_mask`. Received: 'diag'"):
        unbuilt.trainable_mask  # noqa: B018


def _eager_adamw_steps(layer, x, steps=3):
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.9)
    if not layer.trainable_variables:  # a fully fixed band: nothing to train
        return
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(x) - 1.0))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))


@pytest.mark.tensorflow_only
@given(
    mask=hnp.arrays(np.bool_, hnp.array_shapes(min_dims=2, max_dims=2, max_side=5)),
    mode=st.sampled_from(["delta", "select", "auto"]),
)
def test_random_mask_frozen_entries_stay_bit_exact_under_adamw(mask, mode):
    n, units = mask.shape
    layer = PartialDense(units, mask, mode=mode, use_bias=False)
    x = _data(n)
    layer.build((None, n))
    start = keras.ops.convert_to_numpy(layer.kernel)
    _eager_adamw_steps(layer, x)
    assert_frozen(start, layer.kernel, mask)


@pytest.mark.slow
@pytest.mark.tensorflow_only
@given(data=st.data())
def test_random_band_frozen_entries_stay_bit_exact_under_adamw(data):
    n = data.draw(st.integers(1, 6))
    lower = data.draw(st.integers(0, n - 1))
    upper = data.draw(st.integers(0, n - 1))
    fixed = data.draw(st.sampled_from([None, 0.5]))
    layer = BandedDense(lower, upper, fixed_diagonal=fixed, kernel_initializer="ones")
    x = _data(n)
    layer.build((None, n))
    start = keras.ops.convert_to_numpy(layer.kernel)
    _eager_adamw_steps(layer, x)
    assert_frozen(start, layer.kernel, layer.trainable_mask)
    expected = np.tril(np.triu(np.ones((n, n), bool), -lower), upper)
    if fixed is not None:
        expected &= ~np.eye(n, dtype=bool)
    np.testing.assert_array_equal(layer.trainable_mask, expected)


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_acts_on_the_last_axis_of_a_rank_3_input(name):
    factory, n, _, _ = LAYERS[name]
    layer = factory()
    x = _data(n).reshape(2, 8, n)
    y = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(y.reshape(16, -1), layer(x.reshape(16, n)), rtol=1e-6)
