"""Regression: a PartialVariable inside a Keras layer is tracked, trained and saved.

Before 1.0, a PartialVariable held as an attribute of a custom Keras layer was
invisible to Keras: ``trainable_weights`` did not list it, so ``fit`` never
trained it, ``summary()`` did not count it and ``.keras`` files did not save
it, all without an error. Now it is a Keras layer that holds weights; these
tests use it the way the docstring says to (``self.w = PartialVariable(...)``
in ``build`` or ``__init__``, ``self.w.value()`` in ``call``).
"""

import inspect

import keras
import numpy as np
import pytest

import refimpl

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

N, UNITS = 5, 4
MASK = np.array(
    [
        [True, False, False, True],
        [False, False, True, False],
        [False, True, False, False],
        [True, False, False, False],
        [False, False, True, True],
    ]
)
K = int(MASK.sum())
X = np.random.default_rng(1).normal(size=(32, N)).astype("float32")
Y = np.random.default_rng(2).normal(size=(32, UNITS)).astype("float32")


def _start(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


@keras.saving.register_keras_serializable(package="tests_pv")
class BuildTime(keras.layers.Layer):
    """Creates its PartialVariable in ``build``; registered for saving."""

    def __init__(self, units, mask, *, mode="delta", seed=0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.mode, self.seed = units, mode, seed
        self.mask = np.asarray(mask, bool)
        self.value_dtype = None

    def build(self, input_shape):
        start = _start((input_shape[-1], self.units), self.seed)
        self.w = refimpl.PartialVariable(start, self.mask, mode=self.mode, name="w")

    def call(self, x):
        w = self.w.value()
        self.value_dtype = keras.backend.standardize_dtype(w.dtype)
        return keras.ops.matmul(x, w)

    def get_config(self):
        config = {"units": self.units, "mask": self.mask.tolist(), "mode": self.mode}
        return {**super().get_config(), **config, "seed": self.seed}


class InitTime(keras.layers.Layer):
    """Creates its PartialVariable in ``__init__``; not registered."""

    def __init__(self, n, units, mask, *, mode="delta", seed=0, **kwargs):
        super().__init__(**kwargs)
        self.n, self.units, self.mode, self.seed = n, units, mode, seed
        self.mask = np.asarray(mask, bool)
        self.value_dtype = None
        start = _start((n, units), seed)
        self.w = refimpl.PartialVariable(start, self.mask, mode=mode, name="w")

    def call(self, x):
        w = self.w.value()
        self.value_dtype = keras.backend.standardize_dtype(w.dtype)
        return keras.ops.matmul(x, w)

    def get_config(self):
        config = {"n": self.n, "units": self.units, "mask": self.mask.tolist()}
        return {**super().get_config(), **config, "mode": self.mode, "seed": self.seed}


def _layer(where, *, mode="delta", seed=0, mask=MASK):
    if where == "build":
        return BuildTime(UNITS, mask, mode=mode, seed=seed, name="custom")
    return InitTime(N, UNITS, mask, mode=mode, seed=seed, name="custom")


def _model(where, optimizer=None, **kwargs):
    layer = _layer(where, **kwargs)
    model = keras.Sequential([keras.Input((N,)), layer])
    model.compile(
        optimizer=optimizer or keras.optimizers.AdamW(0.05, weight_decay=0.5),
        loss="mse",
    )
    return model, layer


def _value(layer):
    return keras.ops.convert_to_numpy(layer.w.value())


def _fit(model, epochs=2):
    model.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)


WHERE = ["build", "init"]


@pytest.mark.parametrize("where", WHERE)
def test_trainable_weights_list_exactly_the_free_values(where):
    model, layer = _model(where)
    assert [id(w) for w in model.trainable_weights] == [id(layer.w.free)]
    assert [id(w) for w in layer.trainable_weights] == [id(layer.w.free)]
    assert layer.w.free.shape == (K,)
    assert {id(w) for w in model.non_trainable_weights} == {
        id(layer.w.base),
        id(layer.w.positions),
    }


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(
    "make_optimizer",
    [
        pytest.param(
            lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5), id="AdamW"
        ),
        pytest.param(lambda: keras.optimizers.Adafactor(0.1), id="Adafactor"),
    ],
)
def test_fit_moves_every_free_entry_and_no_frozen_one(where, make_optimizer):
    model, layer = _model(where, make_optimizer())
    start = _value(layer)
    _fit(model)
    after = _value(layer)
    refimpl.testing.assert_frozen(start, after, MASK)
    np.testing.assert_array_equal(refimpl.testing.moved(start, after), MASK)
    assert np.isfinite(after).all()


@pytest.mark.parametrize("where", WHERE)
def test_count_free_parameters_and_summary_report_the_free_count(where):
    model, layer = _model(where)
    assert refimpl.testing.count_free_parameters(model) == K
    assert refimpl.testing.count_free_parameters(layer) == K
    lines = []
    model.summary(print_fn=lambda line, *args, **kwargs: lines.append(line))
    text = "\n".join(lines)
    assert f"Trainable params: {K} " in text
    assert f"Non-trainable params: {N * UNITS + K} " in text


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_keras_file_round_trip_predicts_identically_and_trains_on_exactly(
    where, tmp_path
):
    model, layer = _model(where)
    start = _value(layer)
    _fit(model)
    model.save(tmp_path / "m.keras")
    # BuildTime is registered; InitTime is passed as a custom object.
    custom = {} if where == "build" else {"InitTime": InitTime}
    loaded = keras.saving.load_model(tmp_path / "m.keras", custom_objects=custom)
    np.testing.assert_array_equal(
        loaded.predict(X, verbose=0), model.predict(X, verbose=0)
    )
    loaded_layer = loaded.get_layer("custom")
    np.testing.assert_array_equal(loaded_layer.w.mask, MASK)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations)

    _fit(model)
    _fit(loaded)
    for resumed, uninterrupted in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(resumed, uninterrupted)
    refimpl.testing.assert_frozen(start, _value(loaded_layer), MASK)


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_weights_file_round_trip_into_a_fresh_model(where, tmp_path):
    model, layer = _model(where)
    _fit(model, epochs=1)
    model.save_weights(tmp_path / "m.weights.h5")
    fresh, fresh_layer = _model(where, seed=7)  # other starting values
    fresh.optimizer.build(fresh.trainable_variables)  # to load its state too
    assert not np.array_equal(_value(fresh_layer), _value(layer))
    fresh.load_weights(tmp_path / "m.weights.h5")
    np.testing.assert_array_equal(_value(fresh_layer), _value(layer))
    np.testing.assert_array_equal(
        fresh.predict(X, verbose=0), model.predict(X, verbose=0)
    )
    assert int(fresh.optimizer.iterations) == int(model.optimizer.iterations)


@pytest.mark.tensorflow_only
def test_checkpoint_of_a_bare_partial_variable_in_a_custom_loop(tmp_path):
    v = refimpl.PartialVariable(_start((N, UNITS)), MASK)
    optimizer = keras.optimizers.Adam(0.1)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((X @ v.value() - Y) ** 2)
        grads = tape.gradient(loss, v.trainable_variables)
        optimizer.apply_gradients(zip(grads, v.trainable_variables, strict=True))
    path = tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))

    # Other values and another mask with as many free entries: the positions
    # are a weight too, so the checkpoint restores the mask as well.
    other_mask = np.zeros((N, UNITS), bool)
    other_mask.flat[:K] = True
    other = refimpl.PartialVariable(np.zeros((N, UNITS), "float32"), other_mask)
    tf.train.Checkpoint(v=other).read(path).assert_consumed()
    np.testing.assert_array_equal(other.value(), v.value())
    np.testing.assert_array_equal(other.mask, MASK)


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_under_mixed_float16_the_value_is_float16_inside_call(where, mixed_float16):
    model, layer = _model(where)
    start = _value(layer)
    _fit(model, epochs=1)
    assert layer.value_dtype == "float16"
    assert keras.backend.standardize_dtype(model(X).dtype) == "float16"
    assert layer.w.free.dtype == layer.w.base.dtype == "float32"
    assert _value(layer).dtype == np.float32  # outside a call: the stored dtype
    refimpl.testing.assert_frozen(start, _value(layer), MASK)
    assert refimpl.testing.moved(start, _value(layer))[MASK].all()


# --- modes ---------------------------------------------------------------------


def _chapter_08_mask():
    """Chapter 14's mask: 6x6, about 28% free, a frozen last row and column."""
    mask = np.random.default_rng(0).random((6, 6)) < 0.5
    mask[-1, :] = mask[:, -1] = False
    return mask


def test_the_default_mode_is_delta():
    assert inspect.signature(refimpl.PartialVariable).parameters["mode"].default == (
        "delta"
    )
    assert refimpl.PartialVariable(_start((2, 2)), np.ones((2, 2), bool)).mode == (
        "delta"
    )


def test_partial_dense_and_partial_variable_default_to_the_same_mode():
    def default(cls):
        return inspect.signature(cls).parameters["mode"].default

    assert default(refimpl.PartialDense) == default(refimpl.PartialVariable)
    mask = _chapter_08_mask()
    dense = refimpl.PartialDense(6, mask)
    dense.build((None, 6))
    variable = refimpl.PartialVariable(_start((6, 6)), mask)
    assert dense.partial_weight.mode == variable.mode == "delta"


def _adafactor_steps(steps=5, **mode):
    mask = _chapter_08_mask()
    x, t = _start((8, 6), 1), _start((8, 6), 2)
    v = refimpl.PartialVariable(_start((6, 6)), mask, **mode)
    start = keras.ops.convert_to_numpy(v.value())
    optimizer = keras.optimizers.Adafactor()
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ v.value() - t) ** 2)
        grads = tape.gradient(loss, v.trainable_variables)
        optimizer.apply_gradients(zip(grads, v.trainable_variables, strict=True))
    return mask, start, keras.ops.convert_to_numpy(v.value())


@pytest.mark.tensorflow_only
def test_adafactor_gives_no_nan_with_the_default_mode_and_chapter_08_mask():
    mask = _chapter_08_mask()
    assert 0.25 < mask.mean() < 0.3
    assert not mask[-1].any() and not mask[:, -1].any()
    mask, start, after = _adafactor_steps()  # the default mode
    assert np.isfinite(after).all()
    refimpl.testing.assert_frozen(start, after, mask)
    assert refimpl.testing.moved(start, after)[mask].all()


@pytest.mark.tensorflow_only
def test_select_mode_under_adafactor_keeps_frozen_entries_exact_whatever_the_free():
    # Select mode hands Adafactor a full 6x6 variable whose frozen row and
    # column get zero gradients: its factored second moment can turn the free
    # values into NaN (what the docstring warns of). The frozen entries come
    # from the base and keep their bits regardless.
    mask, start, after = _adafactor_steps(mode="select")
    refimpl.testing.assert_frozen(start, after, mask)
    assert np.isfinite(after[~mask]).all()


def _slot_sizes(optimizer, variables):
    optimizer.build(variables)
    return sum(
        int(np.prod(s.shape))
        for s in optimizer.variables
        if s.path.endswith(("_momentum", "_velocity"))
    )


@pytest.mark.parametrize("where", WHERE)
def test_select_mode_is_opt_in_and_its_optimizer_state_is_full_size(where):
    sizes = {}
    for mode in ("delta", "select"):
        _, layer = _model(where, mode=mode)
        assert layer.w.mode == mode
        sizes[mode] = _slot_sizes(keras.optimizers.Adam(), layer.trainable_weights)
    assert sizes["delta"] == 2 * K  # momentum and velocity: k values each
    assert sizes["select"] == 2 * N * UNITS


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    ["build", "init"],
)
def test_select_mode_trains_in_fit_with_frozen_entries_bit_exact(where):
    model, layer = _model(where, mode="select")
    # The base holds the whole starting tensor in select mode. Reading it,
    # not value(), leaves fit to be the first to compose the tensor.
    start = keras.ops.convert_to_numpy(layer.w.base)
    _fit(model)
    after = _value(layer)
    refimpl.testing.assert_frozen(start, after, MASK)
    assert refimpl.testing.moved(start, after)[MASK].all()
