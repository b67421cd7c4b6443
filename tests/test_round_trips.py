"""Save and restore mid-training: frozen entries stay exact, training continues.

Each test trains twice from the same start: once without interruption, once
saving halfway, restoring into fresh objects and training on. The two runs
must end with the same bits (weights and optimizer state are both restored),
and the frozen entries must still hold their starting bits.
"""

import keras
import numpy as np
import pytest

import refimpl

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

N, HALF = 6, 3
RNG = np.random.default_rng(0)
INIT = RNG.normal(size=(N, N)).astype("float32")
MASK = RNG.random((N, N)) < 0.4
X = RNG.normal(size=(16, N)).astype("float32")
T = RNG.normal(size=(16, N)).astype("float32")


# --- tf.train.Checkpoint, custom training loop --------------------------------


def _partial_variable(mode="delta"):
    v = refimpl.PartialVariable(INIT, MASK, mode=mode)
    return v, v.trainable_variables, v.value, None


def _partial_variable_select():
    return _partial_variable("select")


def _masked_full_variable():
    w = tf.Variable(INIT)

    def apply(optimizer, grads):
        refimpl.optimizers.apply_masked_gradients(
            optimizer, [(grads[0], w)], [(w, MASK)], restore_frozen=True
        )

    return w, [w], lambda: tf.convert_to_tensor(w), apply


def _train(setup, optimizer, steps):
    _, variables, weight, apply = setup
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((X @ weight() - T) ** 2)
        grads = tape.gradient(loss, variables)
        if apply is None:
            optimizer.apply_gradients(zip(grads, variables))
        else:
            apply(optimizer, grads)


@pytest.mark.parametrize(
    "make",
    [_partial_variable, _partial_variable_select, _masked_full_variable],
    ids=["partial", "partial_select", "restore"],
)
@pytest.mark.tensorflow_only
def test_checkpoint_restore_mid_training_continues_identically(make, tmp_path):
    straight = make()
    _train(straight, keras.optimizers.AdamW(), 2 * HALF)

    first, opt = make(), keras.optimizers.AdamW()
    _train(first, opt, HALF)
    path = tf.train.Checkpoint(state=first[0], optimizer=opt).write(
        str(tmp_path / "ckpt")
    )

    second, opt2 = make(), keras.optimizers.AdamW()
    opt2.build(second[1])
    tf.train.Checkpoint(state=second[0], optimizer=opt2).read(path).assert_consumed()
    assert int(opt2.iterations) == HALF
    _train(second, opt2, HALF)

    resumed, uninterrupted = second[2]().numpy(), straight[2]().numpy()
    np.testing.assert_array_equal(resumed, uninterrupted)
    refimpl.testing.assert_frozen(INIT, resumed, MASK)
    assert refimpl.testing.moved(INIT, resumed)[MASK].all()  # the free entries trained


@pytest.mark.tensorflow_only
def test_checkpoint_restores_the_frozen_base_of_a_partial_variable(tmp_path):
    saved = refimpl.PartialVariable(INIT, MASK)
    path = tf.train.Checkpoint(v=saved).write(str(tmp_path / "ckpt"))
    other = refimpl.PartialVariable(np.zeros_like(INIT), MASK)
    tf.train.Checkpoint(v=other).read(path).assert_consumed()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(other.value()), INIT)


# --- .keras files, model.fit ---------------------------------------------------


def _partial_dense():
    layer = refimpl.PartialDense(N, MASK, use_bias=False)
    return layer, lambda: layer.kernel, MASK


def _banded_dense():
    layer = refimpl.BandedDense(1, 1, kernel_initializer="glorot_uniform")
    band = np.abs(np.subtract.outer(np.arange(N), np.arange(N))) <= 1
    return layer, lambda: layer.kernel, band


def _freeze_entries():
    layer = keras.layers.Dense(
        N,
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(INIT),
        kernel_constraint=refimpl.FreezeEntries(INIT, MASK),
    )
    return layer, lambda: layer.kernel, MASK


def _masked_optimizer():
    layer = keras.layers.Dense(
        N, use_bias=False, kernel_initializer=keras.initializers.Constant(INIT)
    )

    def wrap(optimizer):  # called once the layer is built
        return refimpl.MaskedOptimizer(
            optimizer, [(layer.kernel, MASK)], restore_frozen=True
        )

    return layer, lambda: layer.kernel, MASK, wrap


def _model(make):
    keras.utils.set_random_seed(0)
    layer, kernel, mask, *wrap = make()
    model = keras.Sequential([keras.Input((N,)), layer])
    optimizer = keras.optimizers.AdamW(0.01)
    model.compile(optimizer=wrap[0](optimizer) if wrap else optimizer, loss="mse")
    start = keras.ops.convert_to_numpy(kernel())
    return model, start, mask


def _fit(model, epochs):
    model.fit(X, T, batch_size=4, epochs=epochs, shuffle=False, verbose=0)


def _weights(model):
    """What the model holds and trains: every weight (a partial layer's frozen
    base included, which it saves as it is) and the optimizer state."""
    values = [w for layer in model.layers for w in layer.weights]
    values += model.optimizer.variables
    return [keras.ops.convert_to_numpy(v) for v in values]


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [_partial_dense, _banded_dense, _freeze_entries, _masked_optimizer],
    ids=["PartialDense", "BandedDense", "FreezeEntries", "MaskedOptimizer"],
)
def test_keras_file_round_trip_mid_fit_continues_identically(make, tmp_path):
    straight, start, mask = _model(make)
    _fit(straight, 4)

    first, _, _ = _model(make)
    _fit(first, 2)
    first.save(tmp_path / "half.keras")
    second = keras.models.load_model(tmp_path / "half.keras")
    assert int(second.optimizer.iterations) == int(first.optimizer.iterations)
    _fit(second, 2)

    resumed_weights, uninterrupted_weights = _weights(second), _weights(straight)
    assert len(resumed_weights) == len(uninterrupted_weights)
    for resumed, uninterrupted in zip(resumed_weights, uninterrupted_weights):
        np.testing.assert_array_equal(resumed, uninterrupted)
    kernel = keras.ops.convert_to_numpy(second.layers[0].kernel)
    refimpl.testing.assert_frozen(start, kernel, mask)
    assert refimpl.testing.moved(start, kernel)[mask].any()


def test_keras_file_round_trip_keeps_the_layer_and_its_outputs(tmp_path):
    model, _, _ = _model(_partial_dense)
    _fit(model, 1)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.layers[0], refimpl.PartialDense)
    assert refimpl.testing.count_free_parameters(loaded) == int(MASK.sum())
    np.testing.assert_array_equal(
        loaded.predict(X, verbose=0), model.predict(X, verbose=0)
    )
