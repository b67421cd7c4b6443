"""One holder for every partial weight: ``PartialWeight``.

The partial layers (``partialize``, ``enable_partial``, ``PartialDense``) and a
``PartialVariable`` in a layer of your own hold the same object, so the tools
that walk a model (``partial_weights``, ``trainable_summary``, ``merge``) see
both, and one definition (the regularizer's penalty) holds in every form.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl.partial import PartialWeight, partial_weights

pytestmark = pytest.mark.every_backend

KERNEL = np.arange(1.0, 13.0, dtype="float32").reshape(4, 3) / 10
ROWS = np.zeros((4, 3), bool)
ROWS[1] = True  # a whole row: every form, "slices" included, can take it


class OwnLayer(keras.layers.Layer):
    """A layer of a user's own with a PartialVariable kernel."""

    def build(self, input_shape):
        self.w = refimpl.PartialVariable(KERNEL, ROWS, name="w")

    def call(self, x):
        return self.w.matmul(x)


def _model():
    inputs = keras.Input((4,))
    own = OwnLayer(name="own")(inputs)
    dense = keras.layers.Dense(3, name="d")(inputs)
    return keras.Model(inputs, keras.layers.Add()([own, dense]))


def test_partial_layers_and_a_partial_variable_hold_the_same_kind_of_object():
    model = refimpl.partialize(_model(), {"d": ROWS})
    found = partial_weights(model)
    assert [type(pw) for pw in found] == [PartialWeight, PartialWeight]
    by_owner = {type(pw.owner).__name__: pw for pw in found}
    assert set(by_owner) == {"PartialVariable", "PartialDense"}
    for pw in found:
        np.testing.assert_array_equal(pw.mask, ROWS)
        assert pw.num_free == ROWS.sum() == pw.free.shape[0]
        assert pw.shape == ROWS.shape and pw.mode == "delta"
        np.testing.assert_array_equal(
            pw.indices, np.argwhere(ROWS)
        )  # the free entries, row-major
    variable = model.get_layer("own").w
    assert variable.partial_weight is by_owner["PartialVariable"]
    assert variable.free is variable.partial_weight.free


def test_trainable_summary_lists_a_partial_variable_in_a_users_layer():
    rows = refimpl.trainable_summary(_model())
    partial = [row for row in rows if row["kind"] == "partial"]
    assert [row["trainable"] for row in partial] == [int(ROWS.sum())]
    assert partial[0]["path"].endswith("w/base")


def test_merge_refuses_a_partial_variable_before_changing_anything():
    model = refimpl.partialize(_model(), {"d": ROWS})
    with pytest.raises(ValueError, match="holds a PartialVariable"):
        refimpl.merge(model, in_place=True)
    assert type(model.get_layer("d")).__name__ == "PartialDense"  # not folded


@pytest.mark.parametrize("mode", ["delta", "select", "sparse", "slices"])
def test_a_kernel_regularizer_penalizes_the_free_entries_alone_in_every_form(mode):
    # One definition in every form: the regularizer of the free entries. In
    # the select form the free weight has the kernel's size; its entries
    # outside the mask are unused and must not be penalized.
    layer = keras.layers.Dense(
        3, use_bias=False, kernel_regularizer=keras.regularizers.L2(0.5)
    )
    layer.build((None, 4))
    layer.kernel.assign(KERNEL)
    refimpl.enable_partial(layer, ROWS, mode=mode)
    assert layer.partial_weight.mode == mode
    penalty = float(sum(keras.ops.convert_to_numpy(loss) for loss in layer.losses))
    expected = 0.5 * float(np.sum(np.square(KERNEL[ROWS], dtype=np.float64)))
    np.testing.assert_allclose(penalty, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("trainable_mask", "mask"),
        ("base_weight", "base"),
        ("num_free", "num_free"),
        ("partial_mode", "mode"),
        ("partial_free", "free"),
    ],
)
def test_a_layer_member_of_refimpl_2_says_where_it_moved(old, new):
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    refimpl.enable_partial(layer, ROWS)
    with pytest.raises(AttributeError, match=rf"use `layer\.partial_weight\.{new}"):
        getattr(layer, old)


def test_the_default_form_is_delta_and_auto_takes_whole_rows_as_slices():
    # The reason "delta" stays the default (partialize's docstring): "auto"
    # picks a form that computes the product in pieces for whole rows.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    default = refimpl.partialize(model, {"d": ROWS})
    auto = refimpl.partialize(model, {"d": ROWS}, mode="auto")
    assert default.get_layer("d").partial_weight.mode == "delta"
    assert auto.get_layer("d").partial_weight.mode == "slices"


def test_setting_trainable_again_keeps_the_base_and_the_rest_frozen():
    # `model.trainable = False` then `True` (keras-hub's enable_lora does the
    # same to each layer it targets) must not make the frozen base train.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")])
    converted = refimpl.partialize(model, {"d": ROWS})
    converted.trainable = False
    converted.trainable = True
    layer = converted.get_layer("d")
    assert [w.name for w in converted.trainable_weights] == ["partial_free"]
    base = keras.ops.convert_to_numpy(layer.partial_weight.base).copy()
    converted.compile(optimizer="sgd", loss="mse")
    converted.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer.partial_weight.base), base
    )


def _trained_own_model():
    keras.utils.set_random_seed(1)
    model = _model()
    model.get_layer("d").trainable = False
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    model.fit(x, np.ones((16, 3), "float32"), epochs=2, verbose=0)
    return model, x


def test_the_trained_entries_file_saves_and_loads_a_partial_variable(tmp_path):
    model, x = _trained_own_model()
    saved = refimpl.save_partial_weights(model, tmp_path / "own.npz")
    assert saved["partial"] == {"own/w/base": int(ROWS.sum())}
    fresh = _model()  # the same base, the free values at their start
    fresh.get_layer("d").set_weights(model.get_layer("d").get_weights())
    assert not np.array_equal(fresh.predict(x, verbose=0), model.predict(x, verbose=0))
    refimpl.load_partial_weights(fresh, tmp_path / "own.npz")
    np.testing.assert_array_equal(
        fresh.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def test_drop_and_grow_moves_a_partial_variable_in_a_users_layer():
    model, x = _trained_own_model()
    variable = model.get_layer("own").w
    before = variable.mask
    [record] = refimpl.callbacks.regrow(
        model, (x, np.ones((16, 3), "float32")), fraction=0.34
    )
    assert record["path"].endswith("w")
    assert len(record["grown"]) == 1 and variable.num_free == ROWS.sum()
    assert (variable.mask != before).sum() == 2  # one dropped, one grown


class Unnamed(keras.layers.Layer):
    """A layer of your own whose PartialVariable has no name of its own."""

    def build(self, input_shape):
        self.w = refimpl.PartialVariable(KERNEL, ROWS)

    def call(self, x):
        return self.w.matmul(x)


def test_the_file_of_an_unnamed_partial_variable_loads_onto_the_plain_model(
    tmp_path,
):
    # partialize's copy gives the PartialVariable another made-up name
    # (partial_variable_1): the file names it by the attribute that holds it.
    inputs = keras.Input((4,))
    model = keras.Model(inputs, Unnamed(name="mine")(inputs))
    tuned = refimpl.partialize(model, {}, train=["mine"])
    tuned.get_layer("mine").w.free.assign([2.0, 3.0, 4.0])
    saved = refimpl.save_partial_weights(tuned, tmp_path / "mine.npz")
    assert saved["partial"] == {"mine/w/base": 3}
    refimpl.load_partial_weights(model, tmp_path / "mine.npz")
    x = np.ones((2, 4), "float32")
    np.testing.assert_array_equal(
        model.predict(x, verbose=0), tuned.predict(x, verbose=0)
    )


@pytest.mark.parametrize("call", [refimpl.trainable_summary, partial_weights])
def test_a_model_that_is_not_a_keras_object_is_a_type_error(call):
    with pytest.raises(TypeError, match="`model` must be a Keras model"):
        call("model")
