import inspect
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refimpl import PartialVariable
from refimpl.ops import SELECT_ABOVE_DENSITY, choose_mode, compose
from refimpl.testing import assert_frozen, count_free_parameters
from tests.strategies import shape_and_mask

finite = st.floats(-1e6, 1e6, width=32, allow_subnormal=True)
modes = st.sampled_from(["delta", "select", "auto"])


@st.composite
def dense_and_mask(draw):
    shape, mask = draw(shape_and_mask())
    w = draw(hnp.arrays(np.float32, shape, elements=finite))
    return w, mask


@st.composite
def matrix_and_band_mask(draw):
    """A square matrix and a mask: a band of random width, or a random mask."""
    n = draw(st.integers(1, 6))
    w = draw(hnp.arrays(np.float32, (n, n), elements=st.floats(-2, 2, width=32)))
    if draw(st.booleans()):
        below, above = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        i, j = np.indices((n, n))
        mask = (j - i <= above) & (i - j <= below)
    else:
        mask = draw(hnp.arrays(np.bool_, (n, n)))
    return w, mask


@given(dense_and_mask(), modes)
def test_from_dense_then_value_round_trips_bit_exact(case, mode):
    w, mask = case
    v = PartialVariable.from_dense(w, mask, mode=mode)
    np.testing.assert_array_equal(v.value().numpy().view(np.uint32), w.view(np.uint32))


@given(matrix_and_band_mask(), st.sampled_from(["delta", "select"]))
def test_adamw_leaves_frozen_entries_bit_exact(case, mode):
    w, mask = case
    v = PartialVariable.from_dense(w, mask, mode=mode)
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    target = tf.ones_like(w)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((v.value() - target) ** 2)
        grads = tape.gradient(loss, v.trainable_variables)
        optimizer.apply_gradients(zip(grads, v.trainable_variables, strict=True))
    assert_frozen(w, v.value(), mask)


def test_from_dense_accepts_tf_and_keras_variables():
    w = np.arange(4.0, dtype="float32").reshape(2, 2)
    for variable in (tf.Variable(w), keras.Variable(w)):
        v = PartialVariable.from_dense(variable, [[0, 1]])
        np.testing.assert_array_equal(v.value(), w)
        np.testing.assert_array_equal(v.free, [1.0])


def test_training_moves_the_free_entries():
    mask = np.array([[True, False], [False, True]])
    v = PartialVariable(tf.zeros((2, 2)), mask)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((v.value() - 1.0) ** 2)
    keras.optimizers.SGD(0.25).apply_gradients(
        zip(tape.gradient(loss, v.trainable_variables), v.trainable_variables)
    )
    np.testing.assert_array_equal(v.value(), [[0.5, 0.0], [0.0, 0.5]])


@pytest.mark.parametrize("mode", ["delta", "select"])
def test_only_free_is_trainable_and_its_size_follows_the_mode(mode):
    mask = np.zeros((4, 4), bool)
    mask[1, 2] = mask[3, 0] = True
    v = PartialVariable(tf.ones((4, 4)), mask, mode=mode)
    assert [id(t) for t in v.trainable_variables] == [id(v.free)]
    assert not v.base.trainable
    assert v.free.shape == ((2,) if mode == "delta" else (4, 4))
    np.testing.assert_array_equal(v.indices, [[1, 2], [3, 0]])
    assert v.indices.dtype == np.int64


@pytest.mark.parametrize("mode", ["delta", "select"])
def test_checkpoint_round_trip_restores_free_and_base(mode, tmp_path):
    mask = np.eye(3, dtype=bool)
    v = PartialVariable.from_dense(np.arange(9.0, dtype="float32").reshape(3, 3), mask)
    v = PartialVariable.from_dense(v.value(), mask, mode=mode)
    v.free.assign(v.free + 1.0)
    path = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))
    restored = PartialVariable(tf.zeros((3, 3)), mask, mode=mode)
    tf.train.Checkpoint(v=restored).read(path).assert_consumed()
    np.testing.assert_array_equal(restored.value(), v.value())


def _restore(target, saved, how, tmp_path):
    if how == "checkpoint":
        path = tf.train.Checkpoint(v=saved).write(str(tmp_path / "ckpt"))
        tf.train.Checkpoint(v=target).read(path).assert_consumed()
    else:
        target.set_weights(saved.get_weights())


@pytest.mark.parametrize("how", ["checkpoint", "set_weights"])
@pytest.mark.parametrize("mode", ["delta", "select"])
def test_restoring_other_positions_into_a_used_variable_takes_them(mode, how, tmp_path):
    w = np.arange(6.0, dtype="float32").reshape(2, 3)
    saved_mask = np.array([[False, False, False], [False, False, True]])
    saved = PartialVariable(w, saved_mask, mode=mode)
    saved.free.assign(saved.free + 100.0)
    other_mask = np.array([[True, False, False], [False, False, False]])
    target = PartialVariable(np.zeros((2, 3), "float32"), other_mask, mode=mode)
    target.value()  # a variable already in use
    _restore(target, saved, how, tmp_path)
    np.testing.assert_array_equal(target.mask, saved_mask)
    np.testing.assert_array_equal(target.value(), saved.value())


@pytest.mark.parametrize("mode", ["delta", "select"])
def test_value_works_inside_tf_function_and_gives_gradients(mode):
    v = PartialVariable(tf.zeros((2, 3)), [[0, 2]], mode=mode)

    @tf.function
    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v.value() * 3.0)
        return tape.gradient(loss, v.free)

    expected = [3.0] if mode == "delta" else [[0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]
    np.testing.assert_array_equal(grad(), expected)


@given(dense_and_mask())
def test_compose_modes_agree(case):
    w, mask = case
    free_values = tf.constant(w[mask] + 1.0)
    indices = np.argwhere(mask)
    delta = compose(tf.constant(w), indices, free_values)
    dense_free = tf.tensor_scatter_nd_update(tf.zeros_like(w), indices, free_values)
    select = compose(w, indices, dense_free, mode="select", mask=mask)
    np.testing.assert_array_equal(delta, select)


def test_compose_takes_flat_positions_an_index_list_or_a_mask():
    base = np.arange(6, dtype="float32").reshape(2, 3)
    mask = np.array([[False, True, False], [True, False, True]])
    free = np.float32([10.0, 20.0, 30.0])  # in row-major order
    expected = np.float32([[0.0, 10.0, 2.0], [20.0, 4.0, 30.0]])
    dense_free = np.float32([[-1.0, 10.0, -1.0], [20.0, -1.0, 30.0]])
    for positions in (np.array([1, 3, 5]), [[0, 1], [1, 0], [1, 2]], mask):
        np.testing.assert_array_equal(compose(base, positions, free), expected)
        np.testing.assert_array_equal(
            compose(base, positions, dense_free, mode="select"), expected
        )
        # `mask=`: the select form's mask, precomputed as a tensor.
        np.testing.assert_array_equal(
            compose(base, positions, dense_free, mode="select", mask=tf.constant(mask)),
            expected,
        )


def test_choose_mode_follows_the_density_threshold():
    mask = np.zeros(100, bool)
    mask[: int(np.ceil(SELECT_ABOVE_DENSITY * 100))] = True
    assert choose_mode(mask) == "select"
    mask[: int(np.ceil(SELECT_ABOVE_DENSITY * 100)) - 1 :] = False
    assert choose_mode(mask) == "delta"
    assert PartialVariable(tf.zeros(100), mask, mode="auto").mode == "delta"
    assert PartialVariable(tf.zeros(100), ~mask, mode="auto").mode == "select"


def test_the_default_mode_is_delta_even_for_a_dense_mask():
    default = inspect.signature(PartialVariable).parameters["mode"].default
    assert default == "delta"
    v = PartialVariable(tf.zeros((4, 4)), np.ones((4, 4), bool))
    assert v.mode == "delta"
    assert v.free.shape == (16,)


@pytest.mark.parametrize("mode", ["delta", "select"])
def test_it_is_a_keras_layer_with_three_weights(mode):
    mask = np.array([[False, True, False], [True, False, False]])
    w = np.arange(6.0, dtype="float32").reshape(2, 3)
    v = PartialVariable(w, mask, mode=mode, name="kernel")
    assert isinstance(v, keras.layers.Layer)
    assert v.built
    names = {x.name: x for x in v.weights}
    assert set(names) == {"free", "base", "positions"}
    assert [x.name for x in v.trainable_weights] == ["free"]
    assert names["positions"].dtype == "int32"
    np.testing.assert_array_equal(names["positions"].numpy(), [1, 3])
    np.testing.assert_array_equal(names["base"].numpy(), w)
    assert v.shape == (2, 3)
    assert v.num_free == 2
    np.testing.assert_array_equal(v.mask, mask)
    np.testing.assert_array_equal(v.indices, [[0, 1], [1, 0]])
    assert count_free_parameters(v) == (2 if mode == "delta" else 6)
    assert v.count_params() == count_free_parameters(v) + 6 + 2


def test_calling_it_on_inputs_raises_a_type_error_that_points_to_value():
    v = PartialVariable(tf.zeros(3), [True, False, True])
    with pytest.raises(TypeError, match=r"\.value\(\)"):
        v(tf.zeros(3))


def test_config_holds_no_arrays_and_a_shell_needs_the_weights():
    mask = np.random.default_rng(0).random((30, 30)) < 0.5
    v = PartialVariable(np.ones((30, 30), "float32"), mask)
    config = v.get_config()
    assert config["shape"] == [30, 30]
    assert config["num_free"] == int(mask.sum())
    assert len(json.dumps(config)) < 1000
    shell = PartialVariable.from_config(config)
    assert shell.free.shape == (int(mask.sum()),)
    with pytest.raises(ValueError, match="rebuilt from a config"):
        shell.value()
    with pytest.raises(ValueError, match="rebuilt from a config"):
        shell.mask  # noqa: B018


def test_a_shell_filled_by_load_own_variables_equals_the_original():
    mask = np.random.default_rng(0).random((4, 5)) < 0.3
    w = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    v = PartialVariable(w, mask)
    store = {}
    v.save_own_variables(store)
    shell = PartialVariable.from_config(v.get_config())
    shell.load_own_variables(store)
    np.testing.assert_array_equal(shell.value(), w)
    np.testing.assert_array_equal(shell.mask, mask)


def test_a_shell_filled_by_set_weights_equals_the_original():
    mask = np.random.default_rng(0).random((4, 5)) < 0.3
    w = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    v = PartialVariable(w, mask)
    shell = PartialVariable.from_config(v.get_config())
    shell.set_weights(v.get_weights())
    np.testing.assert_array_equal(shell.value(), w)


@pytest.mark.parametrize(
    "call, error, words",
    [
        pytest.param(
            lambda: PartialVariable(tf.zeros((2, 2)), np.ones(3, bool)),
            ValueError,
            "`mask`",
            id="mask_shape",
        ),
        pytest.param(
            lambda: PartialVariable(tf.zeros(2), [True, False], mode="dense"),
            ValueError,
            "mode='dense'",
            id="bad_mode",
        ),
        pytest.param(
            lambda: PartialVariable(tf.zeros(2, tf.int32), [True, False]),
            TypeError,
            "floating-point",
            id="int_value",
        ),
        pytest.param(
            lambda: PartialVariable.from_dense(tf.zeros(2), [[2]]),
            ValueError,
            "out of range",
            id="index_range",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[0]], tf.ones(2)),
            ValueError,
            "shape (1,)",
            id="free_length",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[0]], tf.ones(1), mode="select"),
            ValueError,
            "shape (3,)",
            id="select_free_shape",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[0]], tf.ones(1, tf.float64)),
            TypeError,
            "float64",
            id="free_dtype",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[0]], tf.ones(1), mode="where"),
            ValueError,
            "`mode`",
            id="compose_mode",
        ),
        pytest.param(lambda: choose_mode([[0]]), TypeError, "boolean", id="choose_idx"),
        pytest.param(
            lambda: PartialVariable(tf.zeros(2)),
            ValueError,
            "mask=None",
            id="no_mask",
        ),
        pytest.param(
            lambda: PartialVariable(shape=(2, 2)),
            ValueError,
            "initial_value",
            id="shell_without_num_free",
        ),
        pytest.param(
            lambda: PartialVariable(shape=(2, 2), num_free=5),
            ValueError,
            "num_free=5",
            id="shell_num_free_too_big",
        ),
        pytest.param(
            lambda: PartialVariable(shape=(2, 2), num_free=1, mode="auto"),
            ValueError,
            "mode",
            id="shell_auto",
        ),
    ],
)
def test_bad_arguments_raise(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
