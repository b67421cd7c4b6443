"""Facts that chapters/05_partial_weights states in a sentence and no longer shows.

The page keeps one demonstration per fact; these checks hold the rest of what
the old Keras chapters showed in cells: what Keras does not track, where a
FreezeEntries constraint must be set on a built layer, how the constraint
trains compared with PartialDense, the select form's full-size free weight,
and a weights file carrying the mask into a layer made with another mask.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import refimpl
from refimpl.testing import assert_frozen, moved

MASK = np.zeros((8, 4), bool)
MASK[[0, 2, 3, 5, 7], [1, 0, 3, 2, 1]] = True
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8)).astype("float32")
Y = RNG.normal(size=(64, 4)).astype("float32")


def _adamw():
    return keras.optimizers.AdamW(0.01, weight_decay=0.5)


def _holding(value):
    layer = keras.layers.Layer()
    layer.thing = value
    return layer


@pytest.mark.tensorflow_only
def test_a_tf_variable_or_tf_module_attribute_is_invisible_to_keras():
    module = tf.Module()
    module.v = tf.Variable(np.ones(3, "float32"))
    for value in (tf.Variable(np.ones(3, "float32")), module):
        assert _holding(value).weights == []
    partial = _holding(
        refimpl.PartialVariable(np.ones(3, "float32"), [True, False, True])
    )
    assert [w.name for w in partial.trainable_weights] == ["free"]
    assert [w.name for w in partial.weights] == ["free", "base", "positions"]
    assert len(_holding(keras.Variable(np.ones(3, "float32"))).trainable_weights) == 1


class _HiddenScale(keras.layers.Layer):
    def build(self, input_shape):
        self.scale = tf.Variable(tf.ones(input_shape[-1]))  # not a Keras weight

    def call(self, x):
        return x * self.scale


@pytest.mark.tensorflow_only
def test_fit_never_trains_a_tf_variable_attribute_and_keras_only_warns():
    model = keras.Sequential([keras.Input((8,)), _HiddenScale()])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, 2 * X, epochs=2, verbose=0)
    assert any("does not have any trainable weights" in str(w.message) for w in caught)
    assert model.count_params() == 0
    np.testing.assert_array_equal(model.layers[0].scale, np.ones(8))


def _constrained_in(place, tmp_path):
    """Train and reload a built Dense layer whose FreezeEntries is set in `place`."""
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dense(4)
    model = keras.Sequential([keras.Input((8,)), layer])
    constraint = refimpl.FreezeEntries.from_variable(layer.kernel, MASK)
    if place in ("variable", "both"):
        layer.kernel.constraint = constraint
    if place in ("layer", "both"):
        layer.kernel_constraint = constraint
    model.compile(optimizer=_adamw(), loss="mse")
    start = keras.ops.convert_to_numpy(layer.kernel)
    model.fit(X, Y, epochs=2, verbose=0)
    frozen_moved = int((moved(start, layer.kernel) & ~MASK).sum())
    model.save(tmp_path / f"{place}.keras")
    loaded = keras.models.load_model(tmp_path / f"{place}.keras")
    return frozen_moved, loaded.layers[0].kernel.constraint is not None


@pytest.mark.slow
def test_freeze_entries_on_a_built_layer_must_be_set_in_both_places(tmp_path):
    assert _constrained_in("variable", tmp_path) == (0, False)  # lost on reload
    moved_count, kept = _constrained_in("layer", tmp_path)  # saved, never applied
    assert moved_count > 0 and kept
    assert _constrained_in("both", tmp_path) == (0, True)


def _free_entries_apart(make_optimizer):
    """Largest gap on a free entry: Dense + FreezeEntries vs a PartialDense copy."""
    keras.utils.set_random_seed(0)
    dense = keras.layers.Dense(4)
    dense.build((None, 8))
    copy = refimpl.PartialDense.from_dense(dense, MASK)
    dense.kernel.constraint = refimpl.FreezeEntries.from_variable(dense.kernel, MASK)
    for layer in (dense, copy):
        model = keras.Sequential([keras.Input((8,)), layer])
        model.compile(optimizer=make_optimizer(), loss="mse")
        model.fit(X, Y, epochs=3, shuffle=False, verbose=0)
    kernels = [keras.ops.convert_to_numpy(layer.kernel) for layer in (dense, copy)]
    return float(np.abs(kernels[0] - kernels[1])[MASK].max())


@pytest.mark.slow
def test_the_constraint_trains_like_partial_dense_only_under_elementwise_optimizers():
    assert _free_entries_apart(_adamw) == 0.0
    assert _free_entries_apart(lambda: keras.optimizers.Lamb(0.01)) > 0
    assert _free_entries_apart(lambda: keras.optimizers.Adafactor(0.01)) > 0


@pytest.mark.slow
def test_the_select_form_decays_the_copies_outside_the_mask_but_not_the_tensor():
    w = RNG.normal(size=(8, 4)).astype("float32")
    variable = refimpl.PartialVariable.from_dense(w, MASK, mode="select")
    optimizer = _adamw()
    for _ in range(5):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((X @ variable.value() - Y) ** 2)
        grads = tape.gradient(loss, variable.trainable_variables)
        optimizer.apply_gradients(zip(grads, variable.trainable_variables))
    assert_frozen(w, variable.value(), MASK)
    assert moved(w, variable.free).all()  # all 32 entries of the full-size weight
    assert refimpl.testing.count_optimizer_state(optimizer) == 2 * w.size


@pytest.mark.parametrize("make", ["variable", "dense"])
def test_a_weights_file_carries_the_mask_into_a_layer_made_with_another(make, tmp_path):
    trained = RNG.normal(size=(8, 4)).astype("float32")
    other = np.arange(32).reshape(8, 4) < int(MASK.sum())  # as many free entries

    def model(values, mask):
        if make == "dense":
            layer = refimpl.PartialDense(
                4, mask, kernel_initializer=keras.initializers.Constant(values)
            )
        else:
            layer = _Linear(refimpl.PartialVariable.from_dense(values, mask))
        return keras.Sequential([keras.Input((8,)), layer]), layer

    saved, saved_layer = model(trained, MASK)
    saved.save_weights(tmp_path / "m.weights.h5")
    fresh, fresh_layer = model(np.zeros((8, 4), "float32"), other)
    fresh.load_weights(tmp_path / "m.weights.h5")
    np.testing.assert_array_equal(fresh_layer.partial_weight.mask, MASK)
    np.testing.assert_array_equal(fresh(X), saved(X))


class _Linear(keras.layers.Layer):
    def __init__(self, w, **kwargs):
        super().__init__(**kwargs)
        self.w = w

    @property
    def partial_weight(self):  # the PartialVariable's holder, as a partial layer's
        return self.w.partial_weight

    def call(self, x):
        return x @ self.w.value()
