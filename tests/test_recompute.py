"""Partial layers under ``keras.RematScope``: the product is recomputed, not kept.

A partial ``Dense`` or ``EinsumDense`` in the ``"delta"`` form that Keras
would rematerialize recomputes its own product (composition included) in the
backward pass through ``keras.remat``, on every backend; Keras' own wrapper
fails under TensorFlow in ``fit`` (keras#21207). Training is the same, bit for
bit, as without the scope.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.layers import partial as _partial_layers
from refimpl.testing import assert_frozen
from tests.models import X, Y
from tests.models import attention_model as _model
from tests.models import partial_layers as _partial

pytestmark = pytest.mark.every_backend

NAMES = ["d1", "d2", "query", "attention_output"]


def _masks():
    return {
        name: (lambda w, i=i: selection.random_mask(w.shape, fraction=0.1, seed=i))
        for i, name in enumerate(NAMES)
    }


def _trained(model):
    model.compile(optimizer=keras.optimizers.AdamW(0.01), loss="mse")
    model.fit(X, Y, batch_size=3, epochs=2, shuffle=False, verbose=0)
    return [np.array(keras.ops.convert_to_numpy(p.kernel)) for p in _partial(model)]


@pytest.fixture
def remat_calls(monkeypatch):
    calls = []
    original = keras.remat

    def counting(function):
        calls.append(function.__name__)
        return original(function)

    monkeypatch.setattr(keras, "remat", counting)
    return calls


# Under TensorFlow, mode "full" rematerializes the functional model itself
# through Keras' wrapper, which fails in `fit` (keras#21207) for any model.
FULL = pytest.param(
    "full",
    marks=pytest.mark.skipif(
        keras.backend.backend() == "tensorflow",
        reason="keras#21207: Keras' remat of a functional model fails in fit",
    ),
)


@pytest.mark.parametrize("scope", [FULL, "list_of_layers"])
def test_training_under_remat_is_the_same_and_recomputes_the_product(
    scope, remat_calls
):
    model = _model()
    plain = refimpl.partialize(model, _masks())
    kwargs = {"layer_names": NAMES} if scope == "list_of_layers" else {}
    with keras.RematScope(mode=scope, **kwargs):
        recomputed = refimpl.partialize(model, _masks())
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(recomputed(X)), keras.ops.convert_to_numpy(model(X))
    )
    assert remat_calls  # the direct call too
    remat_calls.clear()
    start = [np.array(keras.ops.convert_to_numpy(p.kernel)) for p in _partial(plain)]
    expected = _trained(plain)
    assert not remat_calls
    got = _trained(recomputed)
    assert remat_calls.count("composed_product") >= len(NAMES)
    for before, a, b, layer in zip(start, got, expected, _partial(recomputed)):
        np.testing.assert_array_equal(a, b)
        assert_frozen(before, a, layer.partial_weight.mask)


@pytest.fixture
def recomputed(monkeypatch):
    """The names of the layers that compute their own product, call by call."""
    names = []
    original = _partial_layers._output

    def recording(layer, inputs):
        names.append(layer.name)
        return original(layer, inputs)

    monkeypatch.setattr(_partial_layers, "_output", recording)
    return names


def test_a_layer_keras_does_not_rematerialize_keeps_the_plain_product(
    remat_calls, recomputed
):
    with keras.RematScope(mode="list_of_layers", layer_names=["d2"]):
        converted = refimpl.partialize(_model(), _masks())
    _trained(converted)
    # d2 alone, in every step (traced once, or each step under PyTorch).
    assert set(recomputed) == {"d2"}
    assert remat_calls == ["composed_product"] * len(recomputed)


def test_a_keras_that_wraps_every_call_with_training_recomputes_the_listed_layer_only(
    monkeypatch, recomputed
):
    # Keras 3.16 wraps the call of every layer that gets `training`, to keep it
    # static, and returns that wrapper for a layer it does not recompute.
    plain_rematerialized_call = keras.layers.Layer.rematerialized_call

    def wrapping(self, layer_call, *args, **kwargs):
        training = kwargs.get("training")
        if isinstance(training, bool):
            call = layer_call

            @functools.wraps(call)
            def layer_call(*args, **kwargs):
                return call(*args, **{**kwargs, "training": training})

        return plain_rematerialized_call(self, layer_call, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Layer, "rematerialized_call", wrapping)
    with keras.RematScope(mode="list_of_layers", layer_names=["d2"]):
        converted = refimpl.partialize(_model(), _masks())
    expected = _trained(refimpl.partialize(_model(), _masks()))
    got = _trained(converted)
    assert set(recomputed) == {"d2"}
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


# One example of 8 steps: d1 gives 8 x 32 outputs, d2 8 x 4; the attention
# projections (EinsumDense) 4 x 8 and 32 per step, over steps it may leave
# unknown (counted as 1, as Keras counts them).
@pytest.mark.parametrize(
    ("threshold", "recomputes", "keeps"),
    [
        (8 * 32, set(), set(NAMES)),
        (8 * 4, {"d1"}, {"d2"}),
        (4 * 8 - 1, set(NAMES), set()),
    ],
)
def test_larger_than_recomputes_the_layers_whose_outputs_pass_the_threshold(
    threshold, recomputes, keeps, recomputed
):
    with keras.RematScope(mode="larger_than", output_size_threshold=threshold):
        converted = refimpl.partialize(_model(), _masks())
    converted(keras.ops.convert_to_tensor(X[:1]), training=True)
    assert recomputes <= set(recomputed)
    assert not keeps & set(recomputed)
