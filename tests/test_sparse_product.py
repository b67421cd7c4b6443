"""The sparse product of PartialVariable (mode="sparse") and PartialDense.

``x @ base + x @ S`` with ``S`` the sparse matrix of the free values'
differences from the base: equal to ``x @ value()`` up to rounding, its
gradient equal to the dense reference's at the free positions, and the frozen
entries bit-exact after training, under every execution this project runs
(eager, tf.function, XLA, mixed precision, MirroredStrategy) and after a
``.keras`` round trip. The automatic choice between the three modes is
checked against its thresholds.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import refimpl
from refimpl import backend
from refimpl.ops import (
    SELECT_ABOVE_DENSITY,
    SPARSE_BELOW_DENSITY,
    SPARSE_BELOW_DENSITY_XLA,
    sparse_matmul,
    xla_enabled,
)

pytestmark = pytest.mark.every_backend

BACKEND = keras.backend.backend()
tensorflow_only = [
    pytest.mark.tensorflow_only,
    pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow-level test"),
]

N_IN, N_OUT = 12, 10


def _case(seed=0, density=0.1):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(N_IN, N_OUT)).astype("float32")
    mask = rng.random((N_IN, N_OUT)) < density
    mask[0, 0] = mask[N_IN - 1, N_OUT - 1] = True  # the corners, always
    x = rng.normal(size=(8, N_IN)).astype("float32")
    y = rng.normal(size=(8, N_OUT)).astype("float32")
    return w, mask, x, y


def _numpy(value):
    return keras.ops.convert_to_numpy(value)


def _model(w, mask, mode="sparse", **kwargs):
    layer = refimpl.PartialDense(
        N_OUT,
        mask,
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(w),
        mode=mode,
        **kwargs,
    )
    return keras.Sequential([keras.Input((N_IN,)), layer])


def _trained_free(free, rng):
    """Give the free values (a variable) new ones, different from the base's."""
    free.assign(rng.normal(size=tuple(free.shape)).astype("float32"))


# --- the product -----------------------------------------------------------------


def test_sparse_matmul_equals_the_composed_product_whatever_the_base_holds():
    w, mask, x, _ = _case()
    rng = np.random.default_rng(1)
    positions = np.flatnonzero(mask).astype("int32")
    free = rng.normal(size=len(positions)).astype("float32")
    composed = w.reshape(-1).copy()
    composed[positions] = free
    composed = composed.reshape(w.shape)
    zeroed = w.reshape(-1).copy()
    zeroed[positions] = 0.0  # a base with zeros at the free positions
    for base in (w, zeroed.reshape(w.shape)):
        y = _numpy(sparse_matmul(x, base, positions, free))
        np.testing.assert_allclose(y, x @ composed, rtol=1e-5, atol=1e-5)
    x3 = np.stack([x, 2 * x])  # leading axes are kept
    y3 = _numpy(sparse_matmul(x3, w, positions, free))
    assert y3.shape == (2, 8, N_OUT)
    np.testing.assert_allclose(y3[1], 2 * x @ composed, rtol=1e-5, atol=1e-5)
    y1 = _numpy(sparse_matmul(x[0], w, positions, free))  # one input vector
    assert y1.shape == (N_OUT,)
    np.testing.assert_allclose(y1, x[0] @ composed, rtol=1e-5, atol=1e-5)


def test_sparse_matmul_takes_an_index_list_or_a_mask_as_compose_does():
    w, mask, x, _ = _case()
    positions = np.flatnonzero(mask).astype("int32")
    free = np.random.default_rng(2).normal(size=len(positions)).astype("float32")
    expected = _numpy(sparse_matmul(x, w, positions, free))
    for spelling in (np.argwhere(mask).tolist(), mask):
        np.testing.assert_array_equal(
            _numpy(sparse_matmul(x, w, spelling, free)), expected
        )
    composed = refimpl.ops.compose(w, positions, free)
    select = refimpl.ops.compose(
        w,
        positions,
        keras.ops.convert_to_numpy(composed),
        mode="select",
        mask=np.argwhere(mask).tolist(),
    )
    np.testing.assert_array_equal(_numpy(select), _numpy(composed))


@pytest.mark.parametrize("mode", ["sparse", "delta", "select", "auto"])
def test_matmul_equals_x_times_value_in_every_mode(mode):
    w, mask, x, _ = _case()
    pv = refimpl.PartialVariable(w, mask, mode=mode)
    _trained_free(pv.free, np.random.default_rng(2))
    expected = x @ _numpy(pv.value())
    np.testing.assert_allclose(_numpy(pv.matmul(x)), expected, rtol=1e-5, atol=1e-5)
    if pv.product_mode() != "sparse":  # the same product, bit for bit
        np.testing.assert_array_equal(
            _numpy(pv.matmul(x)), _numpy(keras.ops.matmul(x, pv.value()))
        )


def test_sparse_value_composes_like_delta_bit_for_bit():
    w, mask, _, _ = _case()
    sparse = refimpl.PartialVariable(w, mask, mode="sparse")
    delta = refimpl.PartialVariable(w, mask, mode="delta")
    assert [tuple(v.shape) for v in sparse.weights] == [
        tuple(v.shape) for v in delta.weights
    ]
    np.testing.assert_array_equal(_numpy(sparse.value()), w)
    _trained_free(sparse.free, np.random.default_rng(3))
    delta.free.assign(sparse.free)
    np.testing.assert_array_equal(_numpy(sparse.value()), _numpy(delta.value()))


def _loss(outputs):
    return keras.ops.sum(
        keras.ops.sin(outputs) * (1.0 + keras.ops.arange(N_OUT, dtype="float32"))
    )


def test_gradient_of_the_free_values_equals_the_dense_reference():
    w, mask, x, _ = _case()
    model = _model(w, mask)
    layer = model.layers[0]
    _trained_free(layer.partial_weight.free, np.random.default_rng(4))
    dense = keras.Sequential(
        [keras.Input((N_IN,)), keras.layers.Dense(N_OUT, use_bias=False)]
    )
    dense.layers[0].kernel.assign(layer.kernel)
    (grad_free,) = backend.batch_gradients(model, _loss, x)
    (grad_dense,) = backend.batch_gradients(dense, _loss, x)
    assert grad_free.shape == (int(mask.sum()),)
    np.testing.assert_allclose(grad_free, grad_dense[mask], rtol=1e-5, atol=1e-5)
    assert np.abs(grad_free).min() > 0  # every free entry gets a gradient


# --- training: frozen entries bit-exact --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.Adam(0.05),
        lambda: keras.optimizers.AdamW(0.05, weight_decay=0.5),
    ],
    ids=["adam", "adamw_decay"],
)
def test_fit_leaves_frozen_entries_bit_exact_and_moves_every_free_one(optimizer):
    w, mask, x, y = _case()
    model = _model(w, mask)
    model.compile(optimizer=optimizer(), loss="mse")
    model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    after = _numpy(model.layers[0].kernel)
    refimpl.testing.assert_frozen(w, after, mask)
    np.testing.assert_array_equal(refimpl.testing.moved(w, after), mask)


@pytest.mark.slow
def test_sparse_and_delta_train_the_same_values():
    w, mask, x, y = _case()
    kernels = []
    for mode in ("sparse", "delta"):
        keras.utils.set_random_seed(0)
        model = _model(w, mask, mode=mode)
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        model.fit(x, y, epochs=3, batch_size=4, shuffle=False, verbose=0)
        kernels.append(_numpy(model.layers[0].kernel))
    np.testing.assert_allclose(kernels[0], kernels[1], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_mixed_precision_computes_in_float16_and_keeps_frozen_entries():
    w, mask, x, y = _case()
    model = _model(w, mask, dtype="mixed_float16")
    layer = model.layers[0]
    out = model(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    np.testing.assert_allclose(
        _numpy(out).astype("float32"), x @ w, rtol=2e-2, atol=2e-2
    )
    model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5), loss="mse")
    model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    assert layer.partial_weight.free.dtype == "float32"
    assert layer.partial_weight.base.dtype == "float32"
    refimpl.testing.assert_frozen(w, _numpy(layer.kernel), mask)
    np.testing.assert_array_equal(refimpl.testing.moved(w, _numpy(layer.kernel)), mask)


# --- saving ---------------------------------------------------------------------


@pytest.mark.slow
def test_keras_round_trip_keeps_mode_values_and_outputs(tmp_path):
    w, mask, x, y = _case()
    model = _model(w, mask)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    model.fit(x, y, epochs=2, verbose=0)
    path = tmp_path / "sparse.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    layer = loaded.layers[0]
    assert (
        layer.partial_weight.mode == "sparse"
        and layer.partial_weight.product_mode() == "sparse"
    )
    np.testing.assert_array_equal(_numpy(layer.kernel), _numpy(model.layers[0].kernel))
    np.testing.assert_array_equal(layer.partial_weight.mask, mask)
    # The file holds every variable as it was: the same base, free values and
    # positions, so the sparse product gives the trained model's outputs, bit
    # for bit.
    for before, after in zip(model.layers[0].weights, layer.weights, strict=True):
        np.testing.assert_array_equal(_numpy(after), _numpy(before))
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def test_auto_round_trip_keeps_the_trace_time_choice(tmp_path):
    rng = np.random.default_rng(5)
    n = 40
    mask = np.zeros((n, n), bool)
    # Between the two sparse thresholds: sparse without XLA, delta with it.
    k = int(np.ceil((SPARSE_BELOW_DENSITY + SPARSE_BELOW_DENSITY_XLA) / 2 * n * n))
    mask.flat[rng.choice(n * n, k, replace=False)] = True
    layer = refimpl.PartialDense(n, mask, mode="auto")
    model = keras.Sequential([keras.Input((n,)), layer])
    assert layer.partial_weight.mode == "sparse" and layer.get_config()["auto"] is True
    path = tmp_path / "auto.keras"
    model.save(path)
    loaded = keras.saving.load_model(path).layers[0]
    assert (
        loaded.partial_weight.mode == "sparse" and loaded.get_config()["auto"] is True
    )
    # Outside a traced step the product follows the backend's XLA use.
    for each in (layer, loaded):
        assert each.partial_weight.product_mode() == refimpl.ops.choose_mode(
            mask, jit_compile=xla_enabled()
        )


@pytest.mark.slow
def test_weights_saved_in_delta_mode_load_into_a_sparse_layer(tmp_path):
    w, mask, x, y = _case()
    delta = _model(w, mask, mode="delta")
    delta.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    delta.fit(x, y, epochs=2, verbose=0)
    path = tmp_path / "delta.weights.h5"
    delta.save_weights(path)
    sparse = _model(np.zeros_like(w), mask, mode="sparse")
    sparse.load_weights(path)
    # The two modes have the same weights: the sparse layer takes the delta
    # layer's base (not the zeros it started from) and its free values.
    layer = sparse.layers[0]
    np.testing.assert_array_equal(_numpy(layer.partial_weight.base), w)
    np.testing.assert_array_equal(
        _numpy(layer.partial_weight.free), _numpy(delta.layers[0].partial_weight.free)
    )
    trained = _numpy(delta.layers[0].kernel)
    np.testing.assert_array_equal(_numpy(layer.kernel), trained)
    refimpl.testing.assert_frozen(w, trained, mask)
    np.testing.assert_allclose(
        sparse.predict(x, verbose=0), delta.predict(x, verbose=0), rtol=1e-5, atol=1e-5
    )


# --- the automatic choice -----------------------------------------------------------


def _mask_of_density(density, shape=(100, 100)):
    mask = np.zeros(int(np.prod(shape)), bool)
    mask[: int(np.ceil(density * mask.size))] = True
    return mask.reshape(shape)


def test_choose_mode_has_three_ranges_and_xla_moves_the_sparse_one():
    assert SPARSE_BELOW_DENSITY_XLA <= SPARSE_BELOW_DENSITY < SELECT_ABOVE_DENSITY
    below_xla = _mask_of_density(SPARSE_BELOW_DENSITY_XLA / 2)
    between = _mask_of_density((SPARSE_BELOW_DENSITY_XLA + SPARSE_BELOW_DENSITY) / 2)
    middle = _mask_of_density((SPARSE_BELOW_DENSITY + SELECT_ABOVE_DENSITY) / 2)
    high = _mask_of_density(SELECT_ABOVE_DENSITY)
    assert refimpl.ops.choose_mode(below_xla) == "sparse"
    assert refimpl.ops.choose_mode(below_xla, jit_compile=True) == "sparse"
    assert refimpl.ops.choose_mode(between) == "sparse"
    expected = "sparse" if SPARSE_BELOW_DENSITY_XLA == SPARSE_BELOW_DENSITY else "delta"
    assert refimpl.ops.choose_mode(between, jit_compile=True) == expected
    assert refimpl.ops.choose_mode(middle) == refimpl.ops.choose_mode(
        middle, jit_compile=True
    )
    assert refimpl.ops.choose_mode(middle) == "delta"
    assert refimpl.ops.choose_mode(high) == refimpl.ops.choose_mode(
        high, jit_compile=True
    )
    assert refimpl.ops.choose_mode(high) == "select"
    # Only a matrix has a sparse product.
    assert refimpl.ops.choose_mode(below_xla.reshape(-1)) == "delta"
    assert refimpl.ops.choose_mode(below_xla.reshape(10, 10, 100)) == "delta"


def test_auto_picks_the_mode_of_choose_mode():
    for density in (0.001, 0.05, 0.5):
        mask = _mask_of_density(density, (40, 50))
        pv = refimpl.PartialVariable(np.zeros((40, 50), "float32"), mask, mode="auto")
        assert pv.mode == refimpl.ops.choose_mode(mask)
        assert pv.auto == (pv.mode != "select")


def test_xla_enabled_follows_the_backend_outside_a_traced_function():
    assert xla_enabled() == (BACKEND == "jax")


# --- TensorFlow: tf.function, XLA, tf.distribute ------------------------------------


def _tf_gradients(pv, x, *, jit_compile):
    import tensorflow as tf

    @tf.function(jit_compile=jit_compile)
    def grads(x):
        with tf.GradientTape() as tape:
            loss = _loss(pv.matmul(x))
        return tape.gradient(loss, pv.free), pv.matmul(x)

    return grads(tf.constant(x))


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf_function", "xla"])
@pytest.mark.parametrize("mode", ["sparse", "auto"])
@pytest.mark.tensorflow_only
@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow-level test")
def test_tf_function_and_xla_give_the_dense_reference_gradient(mode, jit_compile):
    import tensorflow as tf

    w, mask, x, _ = _case()
    pv = refimpl.PartialVariable(w, mask, mode=mode)
    _trained_free(pv.free, np.random.default_rng(6))
    grad, y = _tf_gradients(pv, x, jit_compile=jit_compile)
    kernel = tf.Variable(pv.value())
    with tf.GradientTape() as tape:
        loss = _loss(tf.constant(x) @ kernel)
    reference = tape.gradient(loss, kernel).numpy()[mask]
    np.testing.assert_allclose(grad.numpy(), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), x @ pv.value().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.tensorflow_only
@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow-level test")
def test_auto_chooses_the_product_when_traced_by_xla_or_not():
    import tensorflow as tf

    n = 40
    between = _mask_of_density(
        (SPARSE_BELOW_DENSITY_XLA + SPARSE_BELOW_DENSITY) / 2, (n, n)
    )
    pv = refimpl.PartialVariable(np.ones((n, n), "float32"), between, mode="auto")
    seen = {}

    def record(jit):
        def f(x):
            seen[jit] = pv.product_mode()
            return pv.matmul(x)

        return tf.function(f, jit_compile=jit)

    for jit in (False, True):
        record(jit)(tf.ones((2, n)))
    assert seen == {
        False: refimpl.ops.choose_mode(between),
        True: refimpl.ops.choose_mode(between, jit_compile=True),
    }
    assert pv.product_mode() == pv.mode  # eagerly: no XLA


@pytest.mark.slow
@pytest.mark.tensorflow_only
@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow-level test")
def test_fit_under_xla_leaves_frozen_entries_bit_exact():
    w, mask, x, y = _case()
    model = _model(w, mask)
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5),
        loss="mse",
        jit_compile=True,
    )
    model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    after = _numpy(model.layers[0].kernel)
    refimpl.testing.assert_frozen(w, after, mask)
    np.testing.assert_array_equal(refimpl.testing.moved(w, after), mask)


_MIRRORED_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    import keras
    import refimpl
    rng = np.random.default_rng(0)
    w = rng.normal(size=(12, 10)).astype("float32")
    mask = rng.random((12, 10)) < 0.1
    mask[0, 0] = True
    x = rng.normal(size=(16, 12)).astype("float32")
    y = rng.normal(size=(16, 10)).astype("float32")

    def trained(strategy):
        with strategy.scope():
            layer = refimpl.PartialDense(
                10, mask, use_bias=False, mode="sparse",
                kernel_initializer=keras.initializers.Constant(w),
            )
            model = keras.Sequential([keras.Input((12,)), layer])
            model.compile(optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.5),
                          loss="mse")
        model.fit(x, y, epochs=3, batch_size=8, shuffle=False, verbose=0)
        return keras.ops.convert_to_numpy(layer.kernel)

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    np.savez(sys.argv[1], w=w, mask=mask,
             mirrored=trained(mirrored),
             single=trained(tf.distribute.get_strategy()))
    """
)


@pytest.mark.slow
@pytest.mark.tensorflow_only
@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow-level test")
def test_mirrored_strategy_trains_like_one_device_and_keeps_frozen_entries(tmp_path):
    path = tmp_path / "mirrored.npz"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    done = subprocess.run(
        [sys.executable, "-c", _MIRRORED_SCRIPT, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(path) as saved:
        w, mask = saved["w"], saved["mask"]
        mirrored, single = saved["mirrored"], saved["single"]
    refimpl.testing.assert_frozen(w, mirrored, mask)
    np.testing.assert_array_equal(refimpl.testing.moved(w, mirrored), mask)
    np.testing.assert_allclose(mirrored, single, rtol=1e-5, atol=1e-6)


# --- bad inputs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, words",
    [
        pytest.param(
            lambda: refimpl.PartialVariable(
                np.zeros(4, "float32"), [True] * 4, mode="sparse"
            ),
            ValueError,
            "mode='sparse'",
            id="sparse_vector",
        ),
        pytest.param(
            lambda: refimpl.PartialVariable(np.zeros(4, "float32"), [True] * 4).matmul(
                np.ones((1, 4), "float32")
            ),
            ValueError,
            "`matmul`",
            id="matmul_of_a_vector",
        ),
        pytest.param(
            lambda: refimpl.PartialVariable(
                np.zeros((3, 2), "float32"), np.eye(3, 2, dtype=bool), mode="sparse"
            ).matmul(np.ones((1, 2), "float32")),
            ValueError,
            "`x`",
            id="matmul_x_shape",
        ),
        pytest.param(
            lambda: refimpl.ops.choose_mode(np.eye(3, dtype=bool), jit_compile="yes"),
            TypeError,
            "`jit_compile`",
            id="choose_mode_jit_compile",
        ),
        pytest.param(
            lambda: refimpl.PartialVariable(
                np.zeros((2, 2), "float32"), np.eye(2), auto=1
            ),
            TypeError,
            "`auto`",
            id="auto_type",
        ),
        pytest.param(
            lambda: refimpl.PartialVariable(
                np.zeros((2, 2), "float32"), np.eye(2), mode="select", auto=True
            ),
            ValueError,
            "`auto`",
            id="auto_with_select",
        ),
        pytest.param(
            lambda: sparse_matmul(
                np.ones((1, 2), "float32"), np.eye(2), [[0, 5]], np.ones(1)
            ),
            ValueError,
            "`positions`",
            id="sparse_matmul_index_out_of_range",
        ),
        pytest.param(
            lambda: sparse_matmul(
                np.ones((1, 2), "float32"), np.eye(2), [[0, 1]], np.ones(2)
            ),
            ValueError,
            "`free`",
            id="sparse_matmul_free_length",
        ),
        pytest.param(
            lambda: sparse_matmul(np.ones(2, "float32"), np.ones(2), [0], np.ones(1)),
            ValueError,
            "`base`",
            id="sparse_matmul_base_not_a_matrix",
        ),
        pytest.param(
            lambda: refimpl.ops.compose(
                np.eye(2, dtype="float32"),
                [[0, 1]],
                np.eye(2, dtype="float32"),
                mode="select",
                mask=[[0, 5]],
            ),
            ValueError,
            "`mask`",
            id="compose_select_mask_out_of_range",
        ),
        pytest.param(
            lambda: refimpl.PartialDense(2, np.eye(2, dtype=bool), mode="sparce"),
            ValueError,
            "`mode`",
            id="dense_mode",
        ),
    ],
)
def test_bad_inputs_raise_naming_the_argument(call, error, words):
    with pytest.raises(
        error, match=words.replace("(", r"\(").replace(")", r"\)")
    ) as info:
        call()
    assert "Received" in str(info.value) or "shape" in str(info.value)
