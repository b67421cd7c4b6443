"""A keras.applications model as a user converts it: train, save, reload, merge.

MobileNetV2 (random init, 32x32 inputs): every Conv2D and Dense trainable at
1% of its kernel entries. The converted model trains exactly under AdamW, its
``.keras`` file reloads in a fresh process with the same weights and outputs,
``merge`` gives plain Keras with the same outputs, and the merged file loads
in a process where ``refimpl`` cannot be imported.
"""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection
from refimpl.partial import partial_weights
from tests.processes import WITHOUT_REFIMPL, run_python

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow_only]

_RELOAD = """
import sys, numpy as np, keras, refimpl
d = sys.argv[1]
x, y = np.load(d + "/x.npy"), np.load(d + "/y.npy")
loaded = keras.saving.load_model(d + "/converted.keras")
saved = np.load(d + "/weights.npz")
for i, w in enumerate(loaded.weights):
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), saved[f"arr_{i}"])
np.testing.assert_array_equal(loaded.predict(x, verbose=0), y)
np.testing.assert_array_equal(refimpl.merge(loaded).predict(x, verbose=0), y)
print("reloaded")
"""

_WITHOUT_REFIMPL = (
    WITHOUT_REFIMPL
    + """
import sys, numpy as np
import keras
d = sys.argv[1]
merged = keras.saving.load_model(d + "/merged.keras")
np.testing.assert_array_equal(merged.predict(np.load(d + "/x.npy"), verbose=0),
                              np.load(d + "/y.npy"))
print(sorted({type(layer).__name__ for layer in merged.layers})[:3])
"""
)


def _run(code, folder):
    return run_python(code, folder)


def test_mobilenet_v2_converts_trains_reloads_and_merges(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), weights=None, classes=10
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 32, 32, 3)).astype("float32")
    y = np.eye(10, dtype="float32")[np.arange(8) % 10]
    chosen = {
        layer.name: lambda w: selection.random_mask(w.shape, fraction=0.01, seed=1)
        for layer in model.layers
        if type(layer) in (keras.layers.Conv2D, keras.layers.Dense)
    }
    converted = refimpl.partialize(model, chosen)
    np.testing.assert_array_equal(
        converted.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    weights = partial_weights(converted)
    assert len(weights) == len(chosen) > 30
    converted.compile(keras.optimizers.AdamW(1e-3), "categorical_crossentropy")
    partial = [layer for layer in converted.layers if hasattr(layer, "partial_weight")]
    before = [keras.ops.convert_to_numpy(layer.kernel) for layer in partial]
    converted.fit(x, y, epochs=1, verbose=0)
    for layer, start in zip(partial, before, strict=True):
        refimpl.testing.assert_frozen(start, layer.kernel, layer.partial_weight.mask)
    assert any(
        refimpl.testing.moved(start, layer.kernel)[layer.partial_weight.mask].any()
        for layer, start in zip(partial, before, strict=True)
    )
    converted.save(tmp_path / "converted.keras")
    np.savez(
        tmp_path / "weights.npz",
        *[keras.ops.convert_to_numpy(w) for w in converted.weights],
    )
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", converted.predict(x, verbose=0))
    refimpl.merge(converted).save(tmp_path / "merged.keras")
    assert "reloaded" in _run(_RELOAD, tmp_path)
    assert "Partial" not in _run(_WITHOUT_REFIMPL, tmp_path)
