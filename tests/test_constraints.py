import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given

from refimpl import FreezeEntries, assert_frozen, moved
from tests.strategies import shape_and_mask

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


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_frozen_entries_stay_bit_exact_with_fit_and_every_optimizer(name):
    model, dense = _dense_model(OPTIMIZERS[name]())
    start = dense.kernel.numpy()
    model.fit(X, Y, epochs=3, batch_size=8, verbose=0)
    assert_frozen(start, dense.kernel, MASK)
    assert (moved(start, dense.kernel) & MASK).any(), "no free entry moved"


def test_without_the_constraint_adamw_moves_frozen_entries():
    model, dense = _dense_model(OPTIMIZERS["adamw"](), freeze=False)
    start = dense.kernel.numpy()
    model.fit(X, Y, epochs=1, batch_size=8, verbose=0)
    with pytest.raises(AssertionError, match="frozen entries moved"):
        assert_frozen(start, dense.kernel, MASK)


def test_dense_with_the_constraint_saves_loads_and_trains_on_bit_exact(tmp_path):
    values = np.random.default_rng(3).normal(size=(5, 3)).astype("float32")
    dense = keras.layers.Dense(
        3,
        kernel_initializer=keras.initializers.Constant(1.0),
        kernel_constraint=FreezeEntries(MASK, values),
    )
    model = keras.Sequential([keras.Input((5,)), dense])
    model.compile(optimizer=OPTIMIZERS["adamw"](), loss="mse")
    model.fit(X, Y, epochs=2, verbose=0)
    expected = np.where(MASK, dense.kernel.numpy(), values)
    np.testing.assert_array_equal(dense.kernel, expected)

    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(
        loaded.predict(X, verbose=0), model.predict(X, verbose=0)
    )
    constraint = loaded.layers[0].kernel_constraint
    assert isinstance(constraint, FreezeEntries)
    np.testing.assert_array_equal(constraint.mask, MASK)
    loaded.fit(X, Y, epochs=2, verbose=0)
    assert_frozen(values, loaded.layers[0].kernel, MASK)


def test_get_config_round_trip_keeps_mask_and_values_exact():
    values = np.float32([[0.1, 1 / 3], [np.pi, -2.5]])
    constraint = FreezeEntries([[True, False], [False, False]], values)
    config = keras.constraints.serialize(constraint)
    clone = keras.constraints.deserialize(config)
    assert isinstance(clone, FreezeEntries)
    np.testing.assert_array_equal(clone.mask, constraint.mask)
    w = keras.Variable(np.zeros((2, 2), "float32"))
    np.testing.assert_array_equal(clone(w), constraint(w))
    assert clone.get_config() == constraint.get_config()


def test_scalar_values_pin_every_frozen_entry():
    w = keras.Variable(np.full((2, 3), 7.0, "float32"))
    mask = np.array([[True, False, False], [False, True, False]])
    out = FreezeEntries(mask, 0.0)(w).numpy()
    np.testing.assert_array_equal(out, np.where(mask, 7.0, 0.0))


def test_index_list_mask_takes_its_shape_from_values():
    constraint = FreezeEntries([[0, 1]], np.zeros((2, 2)))
    np.testing.assert_array_equal(constraint.mask, [[False, True], [False, False]])


def test_values_are_cast_to_the_variable_dtype():
    values = np.array([1.5, 2.25], ml_dtypes.bfloat16)
    w = tf.Variable(tf.constant([9.0, 9.0], tf.bfloat16))
    out = FreezeEntries([True, False], values)(w)
    assert out.dtype == tf.bfloat16
    assert_frozen(tf.constant(values), out, [True, False])


@pytest.mark.parametrize(
    "mask, values, error, words",
    [
        pytest.param([True, False], np.zeros(3), ValueError, "shape (3,)", id="shape"),
        pytest.param([[0]], 0.0, ValueError, "index list", id="indices_scalar"),
        pytest.param([True], ["a"], TypeError, "values", id="text_values"),
        pytest.param(
            [True, False], [[1.0], [2.0, 3.0]], TypeError, "values", id="ragged"
        ),
        pytest.param([[3]], np.zeros(3), ValueError, "out of range", id="bad_index"),
    ],
)
def test_bad_constructor_argument_raises(mask, values, error, words):
    with pytest.raises(error) as info:
        FreezeEntries(mask, values)
    assert words in str(info.value)


def test_bad_variable_shape_raises_when_applied():
    constraint = FreezeEntries([True, False], [0.0, 0.0])
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(3,\)"):
        constraint(keras.Variable(np.zeros(3, "float32")))


@given(shape_and_mask())
def test_random_mask_frozen_entries_stay_bit_exact_under_adamw(case):
    shape, mask = case
    start = np.random.default_rng(0).normal(size=shape).astype("float32")
    w = keras.Variable(start)
    w.constraint = FreezeEntries(mask, start)
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.9)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(tf.convert_to_tensor(w)))
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    assert_frozen(start, w, mask)
