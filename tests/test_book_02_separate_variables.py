"""Optimizer groups: what chapters/02_separate_variables.ipynb states without
showing it in a cell.

The chapter shows one optimizer per group, an ``OptimizerMap`` saved and loaded,
and three sharp bits. These tests keep the rest checked: a selector function on
plain ``tf.Variable`` objects, patterns that claim a variable twice, a selector
function that a ``.keras`` file cannot restore, the learning-rate callbacks on
every group (a ``MaskedOptimizer`` group included, and a schedule group), a
``MaskedOptimizer`` group whose mask names another group's variable (a pattern
anchored on the model's name is tests/test_masked_optimizer.py's).
Also two slice facts behind chapters/01_trainable_positions.ipynb: a slice
taken inside the tape has a gradient but is refused by an optimizer,
and ``assign`` on it writes into the variable.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import refimpl

RNG = np.random.default_rng(0)
X_DATA = RNG.normal(size=(32, 4)).astype("float32")
Y_DATA = np.sin(X_DATA @ np.float32([[1.0], [-2.0], [0.5], [1.5]]))


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh", name="body"),
            keras.layers.Dense(1, name="head"),
        ]
    )


def _two_groups(head_learning_rate):
    model = _model()
    groups = keras.optimizers.OptimizerMap(
        keras.optimizers.SGD(0.01, name="body_sgd"),
        {".*head/.*": keras.optimizers.Adam(head_learning_rate, name="head_adam")},
    )
    model.compile(optimizer=keras.optimizers.MultiOptimizer(groups), loss="mse")
    return model


def test_a_selector_function_groups_plain_tf_variables():
    # The running example split in two: SGD(0.1) for X[0], Adam for X[1].
    y = tf.constant([2.0, -3.0])
    x0, x1 = tf.Variable([1.0]), tf.Variable([2.0])
    sgd = keras.optimizers.SGD(0.1)
    adam = keras.optimizers.Adam(0.1)
    optimizer = keras.optimizers.MultiOptimizer(
        lambda variable: sgd if variable is x0 else adam
    )
    for _ in range(10):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((tf.concat([x0, x1], axis=0) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [x0, x1]), [x0, x1]))
    np.testing.assert_allclose(x0.numpy(), [2 - 0.8**10], rtol=1e-6)
    assert int(sgd.iterations) == int(adam.iterations) == 10
    assert x1.numpy()[0] < 2.0  # Adam trained it too
    assert not hasattr(x0, "path")  # why an OptimizerMap cannot place it


def test_a_variable_that_two_patterns_claim_is_refused_when_built():
    model = _model()
    overlapping = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(),
            {".*body/.*": keras.optimizers.SGD(), ".*kernel": keras.optimizers.Adam()},
        )
    )
    with pytest.raises(ValueError, match="Multiple optimizers assigned"):
        overlapping.build(model.trainable_variables)


def test_a_selector_function_trains_but_is_not_restored_from_a_keras_file(tmp_path):
    groups = {
        ".*body/.*": keras.optimizers.SGD(1e-4, name="body_sgd"),
        ".*head/.*": keras.optimizers.Adam(1e-2, name="head_adam"),
    }

    def select(variable):
        [owner] = [o for p, o in groups.items() if re.fullmatch(p, variable.path)]
        return owner

    model = _model()
    model.compile(optimizer=keras.optimizers.MultiOptimizer(select), loss="mse")
    model.fit(X_DATA, Y_DATA, epochs=1, batch_size=8, verbose=0)
    assert {o.name: int(o.iterations) for o in model.optimizer.optimizers} == {
        "body_sgd": 4,
        "head_adam": 4,
    }
    model.save(tmp_path / "selector.keras")
    with pytest.raises(TypeError, match="could not be deserialized"):
        keras.saving.load_model(tmp_path / "selector.keras")


def test_reduce_lr_on_plateau_sets_and_logs_every_group():
    # patience=0 and a huge min_delta: every epoch after the first reduces.
    always_reduce = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9
    )
    model = _two_groups(0.01)
    history = model.fit(
        X_DATA, Y_DATA, epochs=3, batch_size=8, verbose=0, callbacks=[always_reduce]
    )
    for inner in model.optimizer.optimizers:
        logged = history.history[f"learning_rate_{inner.name}"]
        np.testing.assert_allclose(logged, [0.01, 0.01, 0.005], rtol=1e-6)
        np.testing.assert_allclose(float(inner.learning_rate), 0.0025, rtol=1e-6)
    with pytest.raises(AttributeError, match="sub-optimizers"):
        _ = model.optimizer.learning_rate


def test_a_schedule_group_stops_reduce_lr_on_plateau_and_later_groups_keep_theirs():
    always_reduce = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, 10, decay_rate=0.5)
    model = _two_groups(schedule)
    with pytest.raises(TypeError, match="not settable"):
        model.fit(
            X_DATA, Y_DATA, epochs=3, batch_size=8, verbose=0, callbacks=[always_reduce]
        )
    # The mapped optimizers come first: the callback raised on Adam and never
    # reached the default SGD.
    assert [o.name for o in model.optimizer.optimizers] == ["head_adam", "body_sgd"]
    assert int(model.optimizer.iterations) == 8  # two epochs ran
    np.testing.assert_allclose(
        float(model.optimizer.optimizers[1].learning_rate), 0.01, rtol=1e-6
    )


def _masked_groups(mask_owner_pattern):
    model = _model()
    kernel = model.get_layer("body").kernel
    first_units = np.zeros((4, 8), bool)
    first_units[:, :4] = True
    masked = refimpl.MaskedOptimizer(
        keras.optimizers.Adam(1e-2, name="body_adam"), [(kernel, first_units)]
    )
    optimizer = keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            keras.optimizers.SGD(1e-2, name="other_sgd"), {mask_owner_pattern: masked}
        )
    )
    return model, kernel, first_units, optimizer


def test_a_masked_group_whose_mask_names_another_groups_variable_is_refused():
    model, _, _, optimizer = _masked_groups(".*head/.*")
    with pytest.raises(ValueError, match="not among the variables being trained"):
        optimizer.build(model.trainable_variables)


def test_callbacks_set_the_inner_learning_rate_of_a_masked_group():
    model, kernel, first_units, optimizer = _masked_groups(".*body/.*")
    before = kernel.numpy()
    model.compile(optimizer=optimizer, loss="mse")
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)
    model.fit(X_DATA, Y_DATA, epochs=2, batch_size=8, verbose=0, callbacks=[halve])
    for inner in model.optimizer.optimizers:
        rate = float(getattr(inner, "inner_optimizer", inner).learning_rate)
        np.testing.assert_allclose(rate, 0.01 / 4, rtol=1e-6)
    refimpl.testing.assert_frozen(before, kernel.numpy(), first_units)


def test_learning_rate_scheduler_sets_every_float_group_and_stops_on_a_schedule():
    # The chapter's sharp bit in one line each: float groups are set, a
    # schedule group stops fit with a TypeError.
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)
    floats = _two_groups(0.01)
    floats.fit(X_DATA, Y_DATA, epochs=3, batch_size=8, verbose=0, callbacks=[halve])
    assert {o.name for o in floats.optimizer.optimizers} == {"body_sgd", "head_adam"}
    for inner in floats.optimizer.optimizers:
        np.testing.assert_allclose(float(inner.learning_rate), 0.01 / 8, rtol=1e-6)

    schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, 10, decay_rate=0.5)
    scheduled = _two_groups(schedule)
    with pytest.raises(TypeError, match="not settable"):
        scheduled.fit(
            X_DATA, Y_DATA, epochs=3, batch_size=8, verbose=0, callbacks=[halve]
        )


def test_a_slice_taken_inside_the_tape_is_refused_and_assign_writes_into_x():
    x = tf.Variable([1.0, 2.0])
    y = tf.constant([2.0, -3.0])
    with tf.GradientTape() as tape:
        first = x[0]
        loss = (first - y[0]) ** 2 + (x[1] - y[1]) ** 2
    grad_first = tape.gradient(loss, first)
    np.testing.assert_allclose(grad_first, 2 * (1.0 - 2.0))  # 2 (X[0] - Y[0])
    assert not isinstance(first, tf.Variable)
    with pytest.raises(AttributeError):
        keras.optimizers.SGD(0.1).apply_gradients([(grad_first, first)])
    first.assign(5.0)
    assert first.numpy() == 1.0 and x.numpy()[0] == 5.0
