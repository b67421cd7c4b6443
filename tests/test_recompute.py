"""Partial layers under ``keras.RematScope``: the product is recomputed, not kept.

A partial ``Dense`` or ``EinsumDense`` in the ``"delta"`` form that Keras
would rematerialize recomputes its own product (composition included) in the
backward pass through ``keras.remat``, on every backend; Keras' own wrapper
fails under TensorFlow in ``fit`` (keras#21207). Training is the same, bit for
bit, as without the scope.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
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


def test_a_layer_keras_does_not_rematerialize_keeps_the_plain_product(remat_calls):
    with keras.RematScope(mode="list_of_layers", layer_names=["d2"]):
        converted = refimpl.partialize(_model(), _masks())
    _trained(converted)
    # d2 alone: one traced training step and one traced forward of the fit.
    assert remat_calls and set(remat_calls) == {"composed_product"}
    assert len(remat_calls) < len(NAMES)
