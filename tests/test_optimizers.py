import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from refimpl import MultiOptimizer


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh", name="body"),
            keras.layers.Dense(1, name="head"),
        ]
    )


def _data():
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    return x, np.sin(x.sum(axis=1, keepdims=True))


def test_each_group_is_updated_by_its_own_optimizer():
    w, b = tf.Variable([1.0, 1.0]), tf.Variable(1.0)
    optimizer = MultiOptimizer(
        [(keras.optimizers.SGD(0.5), [w]), (keras.optimizers.SGD(0.25), b)]
    )
    optimizer.apply_gradients([(tf.constant([1.0, 2.0]), w), (tf.constant(4.0), b)])
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.5, 1.0 - 1.0])
    np.testing.assert_allclose(b.numpy(), 1.0 - 1.0)
    assert [int(o.iterations) for o in optimizer.optimizers] == [1, 1]
    assert int(optimizer.iterations) == 1


@given(st.lists(st.integers(0, 2), min_size=1, max_size=5))
def test_matches_running_each_optimizer_on_its_group(assignment):
    rates = [0.1, 0.2, 0.3]
    start = [np.float32([i + 1.0, -i]) for i in range(len(assignment))]
    grads = [tf.constant([1.0, 0.5]) * (i + 1) for i in range(len(assignment))]
    variables = [tf.Variable(s) for s in start]
    groups = []
    for g, rate in enumerate(rates):
        mine = [v for v, a in zip(variables, assignment, strict=True) if a == g]
        groups.append((keras.optimizers.Adam(rate), mine or "^$"))
    optimizer = MultiOptimizer(groups)
    for _ in range(2):
        optimizer.apply_gradients(zip(grads, variables, strict=True))
    for start_value, grad, group, variable in zip(
        start, grads, assignment, variables, strict=True
    ):
        alone = tf.Variable(start_value)
        reference = keras.optimizers.Adam(rates[group])
        for _ in range(2):
            reference.apply_gradients([(grad, alone)])
        np.testing.assert_array_equal(variable.numpy(), alone.numpy())


def test_a_variable_claimed_by_no_group_is_an_error():
    w, b = tf.Variable([1.0], name="w"), tf.Variable(0.0, name="b")
    optimizer = MultiOptimizer([("sgd", w)])
    with pytest.raises(ValueError, match="'b' of shape \\(\\) is claimed by 0"):
        optimizer.apply_gradients([(tf.ones(1), w), (tf.ones(()), b)])


def test_a_variable_claimed_by_two_groups_is_an_error():
    model = _model()
    optimizer = MultiOptimizer([("sgd", model.get_layer("head")), ("adam", ".*")])
    words = "'sequential[_0-9]*/head/kernel'.* by 2 groups"
    with pytest.raises(ValueError, match=words):
        optimizer.build(model.trainable_variables)


def test_patterns_match_any_trailing_part_of_the_path():
    model = _model()  # paths such as "sequential/body/kernel"
    optimizer = MultiOptimizer([("sgd", "body/.*"), ("adam", "head/.*")])
    assert [optimizer.group_of(v) for v in model.trainable_variables] == [0, 0, 1, 1]


def test_config_round_trips():
    model = _model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)
    optimizer = MultiOptimizer(
        [
            (keras.optimizers.SGD(0.05, momentum=0.9), model.get_layer("body")),
            (keras.optimizers.Adam(schedule), model.get_layer("head").kernel),
            ("rmsprop", ["head/bias"]),
        ],
        name="groups",
    )
    config = optimizer.get_config()
    restored = MultiOptimizer.from_config(config)
    assert restored.get_config() == config
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, MultiOptimizer)
    assert [o.get_config() for o in again.optimizers] == [
        o.get_config() for o in optimizer.optimizers
    ]


def test_fit_save_load_and_keep_training(tmp_path):
    x, y = _data()
    model = _model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 5, 0.5)
    model.compile(
        optimizer=MultiOptimizer(
            [
                (keras.optimizers.SGD(0.05), model.get_layer("body")),
                (keras.optimizers.Adam(schedule), model.get_layer("head")),
            ]
        ),
        loss="mse",
        metrics=["mae"],
    )
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    adam = model.optimizer.optimizers[1]
    np.testing.assert_allclose(
        adam.learning_rate.numpy(), schedule(adam.iterations).numpy(), rtol=1e-6
    )
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, MultiOptimizer)
    assert len(loaded.optimizer.variables) == len(model.optimizer.variables) > 4
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    model.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    loaded.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    for a, b in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_works_inside_tf_function():
    w, b = tf.Variable([1.0, 2.0]), tf.Variable(0.5)
    optimizer = MultiOptimizer([("sgd", w), (keras.optimizers.Adam(0.1), b)])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w**2) + b**2
        optimizer.apply_gradients(zip(tape.gradient(loss, [w, b]), [w, b]))

    for _ in range(3):
        step()
    np.testing.assert_allclose(w.numpy(), np.float32([1.0, 2.0]) * 0.98**3, rtol=1e-6)
    assert [int(o.iterations) for o in optimizer.optimizers] == [3, 3]


def test_learning_rate_lives_on_the_groups():
    optimizer = MultiOptimizer([("sgd", ".*")])
    with pytest.raises(AttributeError, match="optimizers\\[i\\]"):
        _ = optimizer.learning_rate
    with pytest.raises(AttributeError, match="optimizers\\[i\\]"):
        optimizer.learning_rate = 0.1


SGD = keras.optimizers.SGD(0.1)


@pytest.mark.parametrize(
    "groups, error, words",
    [
        pytest.param([], ValueError, "non-empty", id="empty"),
        pytest.param("sgd", ValueError, "non-empty", id="not_list"),
        pytest.param([SGD], TypeError, "pair", id="not_pair"),
        pytest.param([("sgd", 3)], TypeError, "a layer, a variable", id="selector"),
        pytest.param([("sgd", [])], ValueError, "empty", id="empty_selector"),
        pytest.param([("sgd", "(")], ValueError, "regular expression", id="regex"),
        pytest.param([("nope", ".*")], ValueError, "nope", id="unknown_optimizer"),
        pytest.param([(SGD, "a"), (SGD, "b")], ValueError, "reuses", id="reused"),
        pytest.param(
            [(MultiOptimizer([("sgd", ".*")]), ".*")],
            ValueError,
            "nesting",
            id="nested",
        ),
    ],
)
def test_bad_groups_raise(groups, error, words):
    with pytest.raises(error) as info:
        MultiOptimizer(groups)
    assert words in str(info.value)


def test_bad_apply_raises():
    w = tf.Variable([1.0])
    optimizer = MultiOptimizer([("sgd", w)])
    with pytest.raises(ValueError, match="1 gradients for 2 variables"):
        optimizer.apply([tf.ones(1)], [w, w])
    with pytest.raises(ValueError, match="build"):
        optimizer.apply([tf.ones(1)])
    optimizer.build([w])
    with pytest.raises(ValueError, match="was not among"):
        optimizer.apply([tf.ones(1)], [tf.Variable([2.0])])
