"""The Keras-level API on the active Keras backend: TensorFlow, JAX or PyTorch.

`make test` runs this module (with the other `every_backend` modules) once per
backend: under TensorFlow with the rest of the suite, then again with
``KERAS_BACKEND=jax`` (and ``torch`` where PyTorch is installed). Everything
here goes through ``keras.ops`` and ``model.fit``, so each backend's own
trainer, optimizers and saving are what is tested.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection

pytestmark = pytest.mark.every_backend

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 6)).astype("float32")
Y = RNG.normal(size=(32, 4)).astype("float32")


def numpy(value) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def fit(model, x=X, y=Y, optimizer=None, epochs=2):
    keras.utils.set_random_seed(0)
    model.compile(optimizer or keras.optimizers.AdamW(0.05, weight_decay=0.1), "mse")
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False)
    return model


def dense_model(units=4, name="dense"):
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(units, name=name)], name="model"
    )


MASK = selection.random_mask((6, 4), fraction=0.25, seed=3)


def test_the_backend_is_the_one_asked_for():
    assert refimpl.backend.name == BACKEND == os.environ.get("KERAS_BACKEND", BACKEND)


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer",
    ["adamw", "adafactor", "lion", "sgd_momentum", "ftrl"],
)
def test_partialize_trains_only_the_mask_under_fit(optimizer):
    optimizers = {
        "adamw": keras.optimizers.AdamW(0.05, weight_decay=0.1),
        "adafactor": keras.optimizers.Adafactor(0.05),
        "lion": keras.optimizers.Lion(0.01, weight_decay=0.1),
        "sgd_momentum": keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.1),
        "ftrl": keras.optimizers.Ftrl(0.05, l2_regularization_strength=0.1),
    }
    model = refimpl.partialize(dense_model(), {"dense": MASK})
    before = numpy(model.get_layer("dense").kernel)
    bias = numpy(model.get_layer("dense").bias)
    fit(model, optimizer=optimizers[optimizer])
    after = numpy(model.get_layer("dense").kernel)
    refimpl.testing.assert_frozen(before, after, MASK)
    assert refimpl.testing.moved(before, after)[MASK].all()
    # The rest is frozen by default: the bias too, bit for bit.
    assert refimpl.testing.count_free_parameters(model) == MASK.sum()
    np.testing.assert_array_equal(numpy(model.get_layer("dense").bias), bias)


def test_every_supported_layer_converts_and_keeps_its_outputs():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(5, name="dense")(h)
    tokens = keras.Input((3,), dtype="int32")
    e = keras.layers.Embedding(10, 5, name="embed")(tokens)
    e = keras.layers.EinsumDense("btd,de->be", output_shape=5, name="einsum")(e)
    model = keras.Model([inputs, tokens], keras.layers.Add()([h, e]))
    x = [RNG.normal(size=(16, 8, 8, 3)).astype("float32"), RNG.integers(0, 10, (16, 3))]
    y = RNG.normal(size=(16, 5)).astype("float32")
    masks = {
        name: selection.random_mask(tuple(w.shape), fraction=0.2, seed=i)
        for i, (name, w) in enumerate(
            (n, model.get_layer(n).weights[0])
            for n in ("conv", "dense", "embed", "einsum")
        )
    }
    converted = refimpl.partialize(model, masks)
    np.testing.assert_array_equal(numpy(converted(x)), numpy(model(x)))

    def composed(name):
        layer = converted.get_layer(name)
        return numpy(layer.embeddings if name == "embed" else layer.kernel)

    before = {n: composed(n) for n in masks}
    # Adam from a zero state: a frozen entry's update is 0 / (0 + eps) = 0.
    fit(converted, x, y, optimizer=keras.optimizers.Adam(0.05))
    for name, mask in masks.items():
        after = numpy(converted.get_layer(name).partial_weight.base)
        refimpl.testing.assert_frozen(before[name], after, mask)
        assert refimpl.testing.moved(before[name], composed(name))[mask].any(), name
    merged = refimpl.merge(converted)
    np.testing.assert_array_equal(numpy(merged(x)), numpy(converted(x)))


@pytest.mark.slow
def test_the_structured_layers_train_and_keep_their_structure():
    # A fixed block is given by its values; the string "fixed" is the shell
    # `from_config` builds, which refuses to run until its weights are loaded.
    fixed = RNG.normal(size=(4, 3)).astype("float32")
    grid = [["trainable", None], [fixed, "trainable"]]
    shell = refimpl.BlockDense(
        [["trainable", None], ["fixed", "trainable"]],
        row_sizes=[2, 4],
        col_sizes=[3, 3],
    )
    shell.build((None, 6))
    with pytest.raises(refimpl._compat.NotLoadedError, match="without its weights"):
        shell(X)
    layers = {
        "diagonal": refimpl.DiagonalDense(),
        "band": refimpl.BandedDense(1, 1),
        "block": refimpl.BlockDense(grid, row_sizes=[2, 4], col_sizes=[3, 3]),
        "partial": refimpl.PartialDense(6, np.eye(6, dtype=bool), use_bias=False),
    }
    x = X
    for name, layer in layers.items():
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((6,)), layer])
        model.build((None, 6))
        before = numpy(layer.kernel)
        fit(model, x, x[:, ::-1].copy())
        after = numpy(layer.kernel)
        structure = {
            "diagonal": np.eye(6, dtype=bool),
            "band": selection.band_mask((6, 6), 1, 1),
            "block": selection.block_mask((6, 6), [2, 4], [3, 3], [(0, 0), (1, 1)]),
            "partial": np.eye(6, dtype=bool),
        }[name]
        refimpl.testing.assert_frozen(before, after, structure)
        assert refimpl.testing.moved(before, after)[structure].any(), name
        if name == "block":  # the fixed block keeps the values it was given
            np.testing.assert_array_equal(after[2:, :3], fixed)
        np.testing.assert_allclose(
            numpy(model(x)), x @ after, rtol=1e-5, atol=1e-5, err_msg=name
        )


class Scaled(keras.layers.Layer):
    """A custom layer whose kernel is a PartialVariable."""

    def __init__(self, mask=None, **kwargs):
        super().__init__(**kwargs)
        self.mask = mask

    def build(self, input_shape):
        init = RNG.normal(size=(input_shape[-1], 4)).astype("float32")
        self.w = refimpl.PartialVariable(init, self.mask, name="w")

    def call(self, x):
        return keras.ops.matmul(x, self.w.value())


@pytest.mark.slow
def test_a_partial_variable_inside_a_custom_layer_trains_under_fit():
    layer = Scaled(MASK)
    model = keras.Sequential([keras.Input((6,)), layer])
    before = numpy(layer.w.value())
    fit(model)
    after = numpy(layer.w.value())
    refimpl.testing.assert_frozen(before, after, MASK)
    assert refimpl.testing.moved(before, after)[MASK].all()
    assert refimpl.testing.count_free_parameters(model) == MASK.sum()


@pytest.mark.slow
def test_freeze_entries_keeps_the_frozen_bits_under_adamw():
    init = RNG.normal(size=(6, 4)).astype("float32")
    layer = keras.layers.Dense(
        4,
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(init),
        kernel_constraint=refimpl.FreezeEntries(init, MASK),
    )
    model = keras.Sequential([keras.Input((6,)), layer])
    before = numpy(layer.kernel)
    fit(model)
    refimpl.testing.assert_frozen(before, numpy(layer.kernel), MASK)


@pytest.mark.slow
@pytest.mark.parametrize("restore_frozen", [False, True])
def test_masked_optimizer_under_fit(restore_frozen):
    model = dense_model()
    kernel = model.get_layer("dense").kernel
    inner = (
        keras.optimizers.AdamW(0.05, weight_decay=0.1)
        if restore_frozen
        else keras.optimizers.Adam(0.05)
    )
    optimizer = refimpl.MaskedOptimizer(
        inner, [(kernel, MASK)], restore_frozen=restore_frozen
    )
    before = numpy(kernel)
    fit(model, optimizer=optimizer)
    refimpl.testing.assert_frozen(before, numpy(kernel), MASK)
    assert refimpl.testing.moved(before, numpy(kernel))[MASK].all()
    assert int(numpy(optimizer.iterations)) == 8


@pytest.mark.slow
def test_masked_optimizer_without_restore_lets_weight_decay_move_frozen_entries():
    # The "restrict the update" caveat, on this backend's AdamW too.
    model = dense_model()
    kernel = model.get_layer("dense").kernel
    optimizer = refimpl.MaskedOptimizer(
        keras.optimizers.AdamW(0.05, weight_decay=0.1), [(kernel, MASK)]
    )
    before = numpy(kernel)
    fit(model, optimizer=optimizer)
    assert refimpl.testing.moved(before, numpy(kernel))[~MASK].all()


def test_apply_masked_gradients_in_a_custom_step():
    w = keras.Variable(np.ones((2, 3), "float32"))
    mask = np.array([[True, False, True], [False, True, False]])
    grad = keras.ops.convert_to_tensor(np.full((2, 3), 2.0, "float32"))
    refimpl.optimizers.apply_masked_gradients(
        keras.optimizers.SGD(0.1), [(grad, w)], [(w, mask)]
    )
    np.testing.assert_array_equal(numpy(w), np.where(mask, 0.8, 1.0).astype("float32"))
    [(masked, _)] = refimpl.optimizers.mask_gradients([(grad, w)], [(w, mask)])
    np.testing.assert_array_equal(numpy(masked), np.where(mask, 2.0, 0.0))


def test_fisher_scores_are_squared_batch_gradients():
    model = dense_model()
    scores = selection.fisher_scores(model, X, Y, loss="mse", batch_size=8, batches=2)
    kernel = numpy(model.get_layer("dense").kernel)
    bias = numpy(model.get_layer("dense").bias)
    expected = np.zeros_like(kernel, dtype=np.float64)
    for start in (0, 8):
        xb, yb = X[start : start + 8], Y[start : start + 8]
        residual = xb @ kernel + bias - yb  # d mean((xW + b - y)^2) / dW
        expected += np.square(xb.T @ residual * 2 / residual.size)
    path = model.get_layer("dense").kernel.path
    np.testing.assert_allclose(scores[path], expected, rtol=1e-4)
    mask = selection.fisher_mask(scores[path], k=5)
    assert mask.sum() == 5


def test_structured_builders_and_products():
    d = np.array([1.0, -2.0, 3.0], "float32")
    np.testing.assert_array_equal(numpy(refimpl.structured.diagonal(d)), np.diag(d))
    diagonals, offsets = [d, np.float32([4.0, 5.0])], [0, -1]
    dense = np.diag(d) + np.diag([4.0, 5.0], -1)
    np.testing.assert_array_equal(
        numpy(refimpl.structured.banded(diagonals, offsets)), dense
    )
    x = RNG.normal(size=(5, 3)).astype("float32")
    np.testing.assert_allclose(
        numpy(refimpl.structured.banded_matmul(x, diagonals, offsets)),
        x @ dense,
        rtol=1e-6,
    )
    rows = [[None, np.eye(1, dtype="float32")], [np.ones((2, 1), "float32"), None]]
    np.testing.assert_array_equal(
        numpy(refimpl.structured.block(rows)),
        np.block([[np.zeros((1, 1)), 1], [np.ones((2, 1)), np.zeros((2, 1))]]),
    )
    np.testing.assert_allclose(
        numpy(refimpl.structured.block_matmul(x, rows)),
        x @ numpy(refimpl.structured.block(rows)),
        rtol=1e-6,
    )


@pytest.mark.slow
def test_keras_round_trip_keeps_training_exactly(tmp_path):
    model = refimpl.partialize(dense_model(), {"dense": MASK})
    fit(model, epochs=1)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert_same_partial_state(
        {_key(w): numpy(w) for w in model.weights},
        numpy(model.get_layer("dense").kernel),
        loaded,
    )
    np.testing.assert_array_equal(numpy(loaded(X)), numpy(model(X)))
    before = numpy(loaded.get_layer("dense").kernel)
    # Both go on from the same state (the optimizer's included): the same steps.
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    loaded.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    after = numpy(loaded.get_layer("dense").kernel)
    refimpl.testing.assert_frozen(before, after, MASK)
    assert refimpl.testing.moved(before, after)[MASK].all()
    np.testing.assert_array_equal(after, numpy(model.get_layer("dense").kernel))


def _key(variable) -> str:
    """``layer/variable``: the path without the model's name (which loading changes)."""
    return "/".join(variable.path.split("/")[-2:])


def assert_same_partial_state(weights: dict, kernel, loaded, layer="dense"):
    """``loaded`` holds the state ``weights`` (by path) and ``kernel`` describe.

    A partial layer saves every variable as it is, so every weight, the base
    included, and the composed kernel come back bit for bit.
    """
    partial = loaded.get_layer(layer)
    assert (~partial.partial_weight.mask).sum() == (~MASK).sum()
    assert [_key(w) for w in loaded.weights] == list(weights)
    for w in loaded.weights:
        np.testing.assert_array_equal(numpy(w), weights[_key(w)], err_msg=w.path)
    np.testing.assert_array_equal(numpy(partial.kernel), kernel)


# --- across backends: a .keras file saved under one loads under another --------

_SAVE = """
import keras, numpy as np, refimpl
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 6)).astype("float32")
y = rng.normal(size=(32, 4)).astype("float32")
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="dense"),
                          refimpl.DiagonalDense(name="diag")])
mask = refimpl.selection.random_mask((6, 4), fraction=0.25, seed=3)
model = refimpl.partialize(model, {"dense": mask})
model.compile(refimpl.MaskedOptimizer(keras.optimizers.AdamW(0.05, weight_decay=0.1),
              [], restore_frozen=True), "mse")
model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
kernel = model.get_layer("dense").kernel
model.save(PATH)
np.savez(PATH + ".npz", composed_kernel=keras.ops.convert_to_numpy(kernel),
         **{"/".join(w.path.split("/")[-2:]): keras.ops.convert_to_numpy(w)
            for w in model.weights})
"""


def _other_backend() -> str:
    return "jax" if BACKEND != "jax" else "tensorflow"


def _run_under(backend: str, code: str, path) -> None:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = f"PATH = {str(path)!r}\n" + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_a_model_saved_under_another_backend_loads_and_trains_exactly_here(tmp_path):
    if importlib.util.find_spec(_other_backend()) is None:
        pytest.skip(f"{_other_backend()} is not installed (a JAX-only GPU machine)")
    path = tmp_path / "other.keras"
    _run_under(_other_backend(), _SAVE, path)
    saved = np.load(str(path) + ".npz")
    loaded = keras.saving.load_model(path)
    weights = {name: saved[name] for name in saved.files if name != "composed_kernel"}
    assert_same_partial_state(weights, saved["composed_kernel"], loaded)
    assert isinstance(loaded.optimizer, refimpl.MaskedOptimizer)
    mask = selection.random_mask((6, 4), fraction=0.25, seed=3)
    before = numpy(loaded.get_layer("dense").kernel)
    loaded.fit(X, Y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    after = numpy(loaded.get_layer("dense").kernel)
    refimpl.testing.assert_frozen(before, after, mask)
    assert refimpl.testing.moved(before, after)[mask].all()


@pytest.mark.slow
@pytest.mark.tensorflow_only
def test_tensorflow_level_code_says_which_backend_it_needs():
    # Run under JAX in a subprocess: the clear error names the backend.
    code = """
    import refimpl
    try:
        refimpl.tf.partially_trainable
    except ImportError as err:
        assert "KERAS_BACKEND=tensorflow" in str(err), err
    else:
        raise SystemExit("no ImportError")
    try:
        import refimpl.tf.stop_gradient
    except ImportError as err:
        assert "TensorFlow backend" in str(err), err
    else:
        raise SystemExit("no ImportError")
    """
    _run_under("jax", code, "unused")


def test_masked_optimizer_stateless_apply_keeps_the_frozen_entries():
    # JAX's trainer calls stateless_apply (Keras refuses it on TensorFlow).
    if BACKEND == "tensorflow":
        pytest.skip("Keras: stateless_apply is not supported with TensorFlow")
    w = keras.Variable(np.ones((2, 3), "float32"), name="w")
    mask = np.array([[True, False, True], [False, True, False]])
    optimizer = refimpl.MaskedOptimizer(
        keras.optimizers.AdamW(0.1, weight_decay=0.5), [(w, mask)], restore_frozen=True
    )
    optimizer.build([w])
    grads = [keras.ops.convert_to_tensor(np.full((2, 3), 3.0, "float32"))]
    state = [v.value for v in optimizer.variables]
    new_weights, new_state = optimizer.stateless_apply(state, grads, [w.value])
    new = numpy(new_weights[0])
    refimpl.testing.assert_frozen(np.ones((2, 3), "float32"), new, mask)
    assert refimpl.testing.moved(np.ones((2, 3), "float32"), new)[mask].all()
    if BACKEND == "jax":  # (Keras' torch optimizers update in place even here)
        np.testing.assert_array_equal(numpy(w), np.ones((2, 3)))
    assert len(new_state) == len(optimizer.variables)
