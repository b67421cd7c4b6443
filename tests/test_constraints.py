import json

import keras
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given

from refimpl import FreezeEntries
from refimpl.testing import assert_frozen, moved
from tests.strategies import shape_and_mask

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

MASK = np.random.default_rng(0).random((5, 3)) < 0.4
X = np.random.default_rng(1).normal(size=(32, 5)).astype("float32")
Y = np.random.default_rng(2).normal(size=(32, 3)).astype("float32")

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5),
    "rmsprop_decay": lambda: keras.optimizers.RMSprop(0.05, weight_decay=0.1),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.1),
    "lion": lambda: keras.optimizers.Lion(0.01),
    "adafactor": lambda: keras.optimizers.Adafactor(0.1),
}


def _dense_model(optimizer, *, freeze=True):
    dense = keras.layers.Dense(3, name="dense")
    model = keras.Sequential([keras.Input((5,)), dense])
    if freeze:
        dense.kernel.constraint = FreezeEntries.from_variable(dense.kernel, MASK)
    model.compile(optimizer=optimizer, loss="mse")
    return model, dense


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_frozen_entries_stay_bit_exact_with_fit_and_every_optimizer(name):
    model, dense = _dense_model(OPTIMIZERS[name]())
    start = keras.ops.convert_to_numpy(dense.kernel)
    model.fit(X, Y, epochs=3, batch_size=8, verbose=0)
    assert_frozen(start, dense.kernel, MASK)
    assert (moved(start, dense.kernel) & MASK).any(), "no free entry moved"


@pytest.mark.slow
def test_without_the_constraint_adamw_moves_frozen_entries():
    model, dense = _dense_model(OPTIMIZERS["adamw"](), freeze=False)
    start = keras.ops.convert_to_numpy(dense.kernel)
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)
    with pytest.raises(AssertionError, match="frozen entries moved"):
        assert_frozen(start, dense.kernel, MASK)


@pytest.mark.slow
def test_dense_with_the_constraint_saves_loads_and_trains_on_bit_exact(tmp_path):
    values = np.random.default_rng(3).normal(size=(5, 3)).astype("float32")
    dense = keras.layers.Dense(
        3,
        kernel_initializer=keras.initializers.Constant(1.0),
        kernel_constraint=FreezeEntries(values, MASK),
    )
    model = keras.Sequential([keras.Input((5,)), dense])
    model.compile(optimizer=OPTIMIZERS["adamw"](), loss="mse")
    model.fit(X, Y, epochs=2, verbose=0)
    expected = np.where(MASK, keras.ops.convert_to_numpy(dense.kernel), values)
    np.testing.assert_array_equal(dense.kernel, expected)

    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(
        loaded.predict(X, verbose=0), model.predict(X, verbose=0)
    )
    constraint = loaded.layers[0].kernel_constraint
    assert isinstance(constraint, FreezeEntries)
    np.testing.assert_array_equal(constraint.mask, MASK)
    np.testing.assert_array_equal(constraint.values, values)
    loaded.fit(X, Y, epochs=2, verbose=0)
    assert_frozen(values, loaded.layers[0].kernel, MASK)


def _constrained_model(values, mask):
    dense = keras.layers.Dense(3, kernel_constraint=FreezeEntries(values, mask))
    return keras.Sequential([keras.Input((5,)), dense])


def test_weights_file_carries_the_mask_and_the_frozen_values(tmp_path):
    values = np.random.default_rng(3).normal(size=(5, 3)).astype("float32")
    saved = _constrained_model(values, MASK)
    saved.save_weights(tmp_path / "m.weights.h5")
    other = _constrained_model(0.0, ~MASK)  # same architecture, other arrays
    other.load_weights(tmp_path / "m.weights.h5")
    constraint = other.layers[0].kernel_constraint
    np.testing.assert_array_equal(constraint.mask, MASK)
    np.testing.assert_array_equal(constraint.values, values)
    w = keras.Variable(np.full((5, 3), 9.0, "float32"))
    np.testing.assert_array_equal(constraint(w), np.where(MASK, 9.0, values))


def test_config_holds_only_the_shape_and_a_shell_refuses_until_loaded():
    values = np.float32([[0.1, 1 / 3], [np.pi, -2.5]])
    constraint = FreezeEntries(values, [[True, False], [False, False]])
    assert constraint.get_config() == {"shape": [2, 2]}
    config = keras.constraints.serialize(constraint)
    assert "values" not in json.dumps(config) and "mask" not in json.dumps(config)
    shell = keras.constraints.deserialize(config)
    assert isinstance(shell, FreezeEntries)
    assert shell.get_config() == constraint.get_config()
    w = keras.Variable(np.zeros((2, 2), "float32"))
    for use in (lambda: shell(w), lambda: shell.mask, lambda: shell.values):
        with pytest.raises(ValueError, match="rebuilt from a config"):
            use()


def test_scalar_values_pin_every_frozen_entry():
    w = keras.Variable(np.full((2, 3), 7.0, "float32"))
    mask = np.array([[True, False, False], [False, True, False]])
    out = keras.ops.convert_to_numpy(FreezeEntries(0.0, mask)(w))
    np.testing.assert_array_equal(out, np.where(mask, 7.0, 0.0))


def test_index_list_mask_takes_its_shape_from_values():
    constraint = FreezeEntries(np.zeros((2, 2)), [[0, 1]])
    np.testing.assert_array_equal(constraint.mask, [[False, True], [False, False]])


def test_from_variable_freezes_the_current_values():
    w = keras.Variable(np.float32([[1.0, 2.0], [3.0, 4.0]]))
    constraint = FreezeEntries.from_variable(w, [[True, False], [False, True]])
    np.testing.assert_array_equal(constraint.values, keras.ops.convert_to_numpy(w))
    w.assign(w * 10.0)
    np.testing.assert_array_equal(constraint(w), [[10.0, 2.0], [3.0, 40.0]])


@pytest.mark.tensorflow_only
def test_values_are_cast_to_the_variable_dtype():
    values = np.array([1.5, 2.25], ml_dtypes.bfloat16)
    w = tf.Variable(tf.constant([9.0, 9.0], tf.bfloat16))
    out = FreezeEntries(values, [True, False])(w)
    assert out.dtype == tf.bfloat16
    assert_frozen(tf.constant(values), out, [True, False])


def test_the_old_argument_order_fails_loudly():
    # 0.x took (mask, values); a boolean `values` is refused, not used silently.
    with pytest.raises(TypeError, match="`values`"):
        FreezeEntries(MASK, np.zeros((5, 3), "float32"))


@pytest.mark.parametrize(
    "values, mask, error, words",
    [
        pytest.param(np.zeros(3), [True, False], ValueError, "shape (3,)", id="shape"),
        pytest.param(0.0, [[0]], ValueError, "index list", id="indices_scalar"),
        pytest.param(["a"], [True], TypeError, "values", id="text_values"),
        pytest.param(
            [[1.0], [2.0, 3.0]], [True, False], TypeError, "values", id="ragged"
        ),
        pytest.param(np.zeros(3), [[3]], ValueError, "out of range", id="bad_index"),
        pytest.param(np.zeros(2), "ab", TypeError, "mask", id="text_mask"),
    ],
)
def test_bad_constructor_argument_raises(values, mask, error, words):
    with pytest.raises(error) as info:
        FreezeEntries(values, mask)
    assert words in str(info.value)


def test_bad_variable_shape_raises_when_applied():
    constraint = FreezeEntries([0.0, 0.0], [True, False])
    with pytest.raises(ValueError, match=r"\(2,\).*shape \(3,\)"):
        constraint(keras.Variable(np.zeros(3, "float32")))


@pytest.mark.tensorflow_only
@given(shape_and_mask())
def test_random_mask_frozen_entries_stay_bit_exact_under_adamw(case):
    shape, mask = case
    start = np.random.default_rng(0).normal(size=shape).astype("float32")
    w = keras.Variable(start)
    w.constraint = FreezeEntries(start, mask)
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.9)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(tf.convert_to_tensor(w)))
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    assert_frozen(start, w, mask)
