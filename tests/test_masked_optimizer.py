import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from refimpl import (
    MaskedGradientModel,
    apply_masked_gradients,
    assert_frozen,
    mask_gradients,
    moved,
)
from tests.strategies import shape_and_mask

EXACT = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.1),
}
DRIFTING = {
    "adamw": lambda: keras.optimizers.AdamW(0.1),
    "adam_weight_decay": lambda: keras.optimizers.Adam(0.1, weight_decay=0.1),
    "sgd_weight_decay": lambda: keras.optimizers.SGD(0.1, weight_decay=0.1),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1),
}


def _train(variable, optimizer, mask, steps=3, restore_frozen=False):
    target = tf.ones_like(variable) * 5.0
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((variable - target) ** 2)
        grad = tape.gradient(loss, variable)
        apply_masked_gradients(
            optimizer, [(grad, variable)], [mask], restore_frozen=restore_frozen
        )


def test_masked_sgd_matches_the_closed_form_of_the_two_entry_example():
    # loss = sum((x - y)^2), SGD(0.1): the free entry's distance to y[0]
    # shrinks by a factor 0.8 per step; the frozen entry never moves.
    x = tf.Variable([3.0, 2.0])
    y = tf.constant([2.0, -3.0])
    optimizer = keras.optimizers.SGD(0.1)
    for _ in range(10):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((x - y) ** 2)
        apply_masked_gradients(
            optimizer, [(tape.gradient(loss, x), x)], [[True, False]]
        )
    np.testing.assert_allclose(x.numpy()[0], 2.0 + 0.8**10, rtol=1e-6)
    assert x.numpy()[1] == np.float32(2.0)


def test_mask_gradients_zeroes_frozen_entries_even_when_they_are_nan():
    grad = tf.constant([np.nan, np.inf, 3.0])
    (out,) = mask_gradients([grad], [[False, False, True]])
    np.testing.assert_array_equal(out.numpy(), [0.0, 0.0, 3.0])


def test_mask_gradients_leaves_a_gradient_without_mask_untouched():
    grad = tf.constant([1.0, 2.0])
    out = mask_gradients([grad, grad], [None, [False, True]])
    np.testing.assert_array_equal(out[0].numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out[1].numpy(), [0.0, 2.0])


def test_mask_gradients_masks_indexed_slices_by_row():
    table = tf.Variable(tf.ones((4, 2)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [0, 2, 3]))
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    mask = np.array([[True, True], [True, True], [False, False], [True, False]])
    (out,) = mask_gradients([grad], [mask])
    dense = tf.convert_to_tensor(out).numpy()
    np.testing.assert_array_equal(dense, [[1, 1], [0, 0], [0, 0], [1, 0]])


@given(shape_and_mask(), st.sampled_from(sorted(EXACT)))
def test_masking_is_exact_for_sgd_adam_and_rmsprop(case, name):
    shape, mask = case
    initial = np.arange(np.prod(shape), dtype="float32").reshape(shape)
    variable = tf.Variable(initial)
    _train(variable, EXACT[name](), mask)
    assert_frozen(initial, variable.numpy(), mask)


@pytest.mark.parametrize("name", sorted(DRIFTING))
def test_masking_alone_lets_decay_and_ftrl_move_frozen_entries(name):
    initial = np.full((3, 3), 2.0, "float32")
    variable = tf.Variable(initial)
    mask = np.eye(3, dtype=bool)
    _train(variable, DRIFTING[name](), mask)
    assert (moved(initial, variable.numpy()) & ~mask).any()


@given(shape_and_mask(), st.sampled_from(sorted(DRIFTING)))
def test_restore_frozen_is_exact_under_any_optimizer(case, name):
    shape, mask = case
    initial = np.linspace(-1, 1, np.prod(shape), dtype="float32").reshape(shape)
    variable = tf.Variable(initial)
    _train(variable, DRIFTING[name](), mask, restore_frozen=True)
    assert_frozen(initial, variable.numpy(), mask)


def test_restore_frozen_keeps_the_trainable_update():
    mask = np.array([True, False, True])
    plain, restored = tf.Variable(tf.ones(3)), tf.Variable(tf.ones(3))
    _train(plain, keras.optimizers.AdamW(0.1), mask)
    _train(restored, keras.optimizers.AdamW(0.1), mask, restore_frozen=True)
    np.testing.assert_array_equal(plain.numpy()[mask], restored.numpy()[mask])


def test_restore_frozen_works_inside_tf_function_and_with_keras_variables():
    variable = keras.Variable(np.ones((2, 2), "float32"))
    optimizer = keras.optimizers.AdamW(0.1)
    mask = np.array([[True, False], [False, True]])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable.value**2)
        grad = tape.gradient(loss, variable.value)
        apply_masked_gradients(
            optimizer, [(grad, variable)], [mask], restore_frozen=True
        )

    for _ in range(3):
        step()
    assert_frozen(np.ones((2, 2), "float32"), variable.numpy(), mask)
    assert moved(np.ones((2, 2), "float32"), variable.numpy())[mask].all()


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def test_masked_gradient_model_fits_with_metrics_and_callbacks():
    inner = _model()
    kernel = inner.layers[0].kernel
    before = kernel.numpy()
    mask = np.array([[True, False], [False, True], [True, True]])
    model = MaskedGradientModel(inner, [(kernel, mask)], restore_frozen=True)
    model.compile(optimizer=keras.optimizers.AdamW(0.1), loss="mse", metrics=["mae"])
    epochs = []
    callback = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: epochs.append(e)
    )
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    history = model.fit(x, x[:, :2], epochs=3, verbose=0, callbacks=[callback])
    assert epochs == [0, 1, 2]
    assert set(history.history) == {"loss", "mae"}
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert_frozen(before, kernel.numpy(), mask)
    loss, _ = model.evaluate(x, x[:, :2], verbose=0)
    expected = np.mean((inner.predict(x, verbose=0) - x[:, :2]) ** 2)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_masked_gradient_model_reports_the_same_loss_as_fit_on_the_inner_model():
    x = np.random.default_rng(1).normal(size=(8, 3)).astype("float32")
    plain, wrapped_inner = _model(), _model()
    wrapped = MaskedGradientModel(wrapped_inner, [])
    for model in (plain, wrapped):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    a = plain.fit(x, x[:, :2], epochs=2, verbose=0, shuffle=False).history["loss"]
    b = wrapped.fit(x, x[:, :2], epochs=2, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize(
    "grads, masks, error, words",
    [
        pytest.param(tf.ones(2), [None], TypeError, "`grads`", id="grads_not_list"),
        pytest.param([tf.ones(2)], None, TypeError, "`masks`", id="masks_not_list"),
        pytest.param([tf.ones(2)], [], ValueError, "same length", id="lengths"),
        pytest.param([None], [[True]], ValueError, "grads[0]` is None", id="none"),
        pytest.param([tf.ones(2)], [[True]], ValueError, "masks[0]", id="shape"),
    ],
)
def test_bad_mask_gradients_raises(grads, masks, error, words):
    with pytest.raises(error) as info:
        mask_gradients(grads, masks)
    assert words in str(info.value)


def _sgd():
    return keras.optimizers.SGD(0.1)


X = tf.Variable([1.0, 2.0], name="x")
G = tf.constant([1.0, 1.0])


@pytest.mark.parametrize(
    "optimizer, pairs, masks, error, words",
    [
        pytest.param("sgd", [(G, X)], [None], TypeError, "`optimizer`", id="opt_str"),
        pytest.param(_sgd(), 3, [None], TypeError, "grads_and_vars", id="not_list"),
        pytest.param(_sgd(), [(G, X)], [], ValueError, "one mask per", id="lengths"),
        pytest.param(_sgd(), [(G,)], [None], TypeError, "pair", id="not_pair"),
        pytest.param(_sgd(), [(G, X[0])], [None], TypeError, "slice", id="slice"),
        pytest.param(_sgd(), [(None, X)], [None], ValueError, "'x'", id="none_grad"),
        pytest.param(_sgd(), [(G, X)], [[True]], ValueError, "masks[0]", id="shape"),
        pytest.param(_sgd(), [(G, X)], [[1, 0]], TypeError, "masks[0]", id="int"),
    ],
)
def test_bad_apply_masked_gradients_raises(optimizer, pairs, masks, error, words):
    with pytest.raises(error) as info:
        apply_masked_gradients(optimizer, pairs, masks)
    assert words in str(info.value)


def test_bad_restore_frozen_raises():
    with pytest.raises(TypeError, match="restore_frozen"):
        apply_masked_gradients(_sgd(), [(G, X)], [None], restore_frozen="yes")


def test_bad_masked_gradient_model_raises():
    inner = _model()
    kernel = inner.layers[0].kernel
    with pytest.raises(TypeError, match="`model`"):
        MaskedGradientModel("dense", [])
    with pytest.raises(ValueError, match="must be built"):
        MaskedGradientModel(keras.Sequential([keras.layers.Dense(1)]), [])
    with pytest.raises(ValueError, match="not one of the model's"):
        MaskedGradientModel(inner, [(X, [True, False])])
    with pytest.raises(ValueError, match="second mask"):
        MaskedGradientModel(inner, [(kernel, None), (kernel, None)])
    with pytest.raises(ValueError, match="masks\\[0\\]"):
        MaskedGradientModel(inner, [(kernel, [True])])
    with pytest.raises(TypeError, match="pair"):
        MaskedGradientModel(inner, [kernel])
