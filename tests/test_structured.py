import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refimpl.ops import compose
from refimpl.structured import (
    banded,
    banded_matmul,
    block,
    block_matmul,
    diagonal,
    diagonal_matmul,
)
from refimpl.testing import assert_frozen
from refimpl.testing import moved as refimpl_moved

pytestmark = pytest.mark.every_backend

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf  # the tests marked tensorflow_only

floats = st.floats(-10, 10, width=32)


@pytest.fixture(autouse=True, scope="module")
def full_float32_matmul():
    """GPUs multiply float32 in TF32 by default; compare at float32 precision."""
    if keras.backend.backend() != "tensorflow":
        yield  # JAX: tests/conftest.py sets full float32 products
        return
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(enabled)


@st.composite
def band_case(draw):
    """An n, a set of distinct offsets, their diagonals and a batch x."""
    n = draw(st.integers(1, 7))
    offsets = draw(st.lists(st.integers(-(n - 1), n - 1), min_size=1, unique=True))
    diagonals = [
        draw(hnp.arrays(np.float32, n - abs(k), elements=floats)) for k in offsets
    ]
    x = draw(hnp.arrays(np.float32, (draw(st.integers(1, 3)), n), elements=floats))
    return n, offsets, diagonals, x


@given(band_case())
def test_banded_equals_sum_of_numpy_diagonals(case):
    n, offsets, diagonals, _ = case
    expected = sum(np.diag(d, k) for d, k in zip(diagonals, offsets, strict=True))
    np.testing.assert_array_equal(banded(diagonals, offsets), expected)


@pytest.mark.tensorflow_only
@given(band_case())
def test_banded_matmul_equals_dense_product(case):
    n, offsets, diagonals, x = case
    dense = x @ keras.ops.convert_to_numpy(banded(diagonals, offsets))
    got = banded_matmul(tf.constant(x), diagonals, offsets)
    np.testing.assert_allclose(got, dense, rtol=1e-5, atol=1e-4)


@given(hnp.arrays(np.float32, st.integers(1, 8), elements=floats))
def test_diagonal_matmul_equals_product_with_diag(w):
    x = np.arange(2 * len(w), dtype=np.float32).reshape(2, len(w))
    np.testing.assert_array_equal(diagonal(w), np.diag(w))
    np.testing.assert_allclose(diagonal_matmul(x, w), x @ np.diag(w), rtol=1e-6)


@pytest.mark.tensorflow_only
def test_banded_gradient_reaches_only_the_free_diagonals():
    free = tf.Variable([1.0, 2.0])
    fixed = tf.ones(3)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(
            banded([fixed, free], [0, 1]) * np.arange(9.0).reshape(3, 3)
        )
    # d loss / d A = arange(9); the superdiagonal of that is [1, 5].
    np.testing.assert_array_equal(tape.gradient(loss, free), [1.0, 5.0])


@pytest.mark.slow
@pytest.mark.tensorflow_only
@given(st.integers(2, 8), st.integers(1, 3), st.integers(0, 3))
def test_adamw_keeps_fixed_diagonal_and_outside_of_band_bit_exact(n, above, below):
    above, below = min(above, n - 1), min(below, n - 1)
    free = [tf.Variable(tf.fill([n - k], 0.5)) for k in range(1, above + 1)]
    free += [tf.Variable(tf.fill([n - k], -0.5)) for k in range(1, below + 1)]
    offsets = [0, *range(1, above + 1), *range(-1, -below - 1, -1)]
    diagonals = [tf.fill([n], 0.1), *free]
    before = keras.ops.convert_to_numpy(banded(diagonals, offsets))
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((banded(diagonals, offsets) - 1.0) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, free), free, strict=True))
    i, j = np.indices((n, n))
    trainable = (j - i <= above) & (i - j <= below) & (i != j)
    assert_frozen(before, banded(diagonals, offsets), trainable)
    assert refimpl_moved(before, banded(diagonals, offsets)).any()


@pytest.mark.tensorflow_only
def test_banded_keeps_a_fixed_diagonal_bit_exact():
    fixed = tf.constant([-0.0, 1e-30, 3.0])
    got = banded([fixed, tf.constant([1.0, 1.0])], [0, -1])
    raw = np.diag(keras.ops.convert_to_numpy(got)).view(np.uint32)
    np.testing.assert_array_equal(
        raw, keras.ops.convert_to_numpy(fixed).view(np.uint32)
    )


def seed_rows(n, trainable):
    return [
        [None, tf.linalg.diag(tf.fill([n], -0.2))],
        [tf.linalg.diag(tf.fill([n], 0.35)), trainable],
    ]


@pytest.mark.tensorflow_only
def test_block_reproduces_the_two_by_two_layout():
    n = 3
    w = tf.reshape(tf.range(9, dtype=tf.float32), (3, 3))
    got = block(seed_rows(n, w)).numpy()
    expected = np.block(
        [
            [np.zeros((n, n)), -0.2 * np.eye(n)],
            [0.35 * np.eye(n), np.arange(9).reshape(3, 3)],
        ]
    ).astype(np.float32)
    np.testing.assert_array_equal(got, expected)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_block_matmul_equals_concat_product(h, w1, w2, batch):
    rng = np.random.default_rng(h * 100 + w1 * 10 + w2)
    a = rng.standard_normal((h, w1)).astype(np.float32)
    b = rng.standard_normal((3, w2)).astype(np.float32)
    rows = [[a, None], [None, b]]
    x = rng.standard_normal((batch, h + 3)).astype(np.float32)
    np.testing.assert_allclose(
        block_matmul(x, rows),
        x @ keras.ops.convert_to_numpy(block(rows)),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.tensorflow_only
def test_block_matmul_fills_an_all_none_column_with_zeros():
    rows = [[tf.ones((1, 2)), None], [tf.ones((2, 2)), tf.zeros((2, 1))]]
    rows[1][1] = None
    with pytest.raises(ValueError, match="column 1"):
        block(rows)
    rows[1][1] = tf.ones((2, 1))
    out = block_matmul(tf.ones((1, 3)), [[tf.ones((1, 2)), None], [None, rows[1][1]]])
    np.testing.assert_array_equal(out, [[1.0, 1.0, 2.0]])


@pytest.mark.tensorflow_only
def test_block_gradient_reaches_only_the_trainable_block():
    w = tf.Variable(tf.ones((3, 3)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(block(seed_rows(3, w)) ** 2)
    np.testing.assert_allclose(tape.gradient(loss, w), 2 * np.ones((3, 3)))


@pytest.mark.tensorflow_only
def test_compose_writes_values_in_index_order():
    got = compose(tf.zeros((2, 2)), [[1, 1], [0, 0]], tf.constant([1.0, 2.0]))
    np.testing.assert_array_equal(got, [[2.0, 0.0], [0.0, 1.0]])
    by_mask = compose(tf.zeros((2, 2)), np.eye(2, dtype=bool), [1.0, 2.0])
    np.testing.assert_array_equal(by_mask, [[1.0, 0.0], [0.0, 2.0]])


@pytest.mark.slow
@pytest.mark.tensorflow_only
def test_products_work_inside_tf_function():
    @tf.function
    def f(x):
        return banded_matmul(x, [tf.ones(2)], [0]) + block_matmul(x, [[tf.eye(2)]])

    np.testing.assert_array_equal(f(tf.ones((1, 2))), [[2.0, 2.0]])


# (On every backend: the structured rows of tests/test_bad_inputs.py.)
@pytest.mark.tensorflow_only
@pytest.mark.parametrize(
    "call, error, words",
    [
        pytest.param(
            lambda: diagonal(tf.ones((2, 2))), ValueError, "`w`", id="diag_2d"
        ),
        pytest.param(
            lambda: diagonal_matmul(tf.ones((1, 3)), tf.ones(2)),
            ValueError,
            "x.shape",
            id="diag_x_shape",
        ),
        pytest.param(
            lambda: diagonal_matmul(tf.ones((1, 2), tf.float64), tf.ones(2)),
            TypeError,
            "float64",
            id="diag_dtype",
        ),
        pytest.param(
            lambda: banded([tf.ones(3), tf.ones(3)], [0, 1]),
            ValueError,
            "n - |k|",
            id="band_length",
        ),
        pytest.param(
            lambda: banded([tf.ones(3), tf.ones(3)], [0, 0]),
            ValueError,
            "distinct",
            id="band_repeat",
        ),
        pytest.param(
            lambda: banded([tf.ones(0)], [2]), ValueError, "|k| < n", id="band_empty"
        ),
        pytest.param(
            lambda: banded([tf.ones(3)], [0.5]),
            TypeError,
            "`offsets` must be an int",
            id="band_float",
        ),
        pytest.param(
            lambda: banded([tf.ones(3)], [0, 1]), ValueError, "same", id="band_count"
        ),
        pytest.param(
            lambda: banded(tf.ones(3), [0]), TypeError, "list", id="band_not_list"
        ),
        pytest.param(
            lambda: banded([tf.ones(3), tf.ones(2, tf.float64)], [0, 1]),
            TypeError,
            "dtype",
            id="band_dtype",
        ),
        pytest.param(
            lambda: banded_matmul(tf.ones((1, 2)), [tf.ones(3)], [0]),
            ValueError,
            "x.shape",
            id="band_x_shape",
        ),
        pytest.param(lambda: block([]), ValueError, "non-empty", id="block_empty"),
        pytest.param(
            lambda: block([[tf.ones(2)]]), ValueError, "2-D", id="block_not_2d"
        ),
        pytest.param(
            lambda: block([[tf.ones((1, 1)), tf.ones((2, 1))]]),
            ValueError,
            "height",
            id="block_heights",
        ),
        pytest.param(
            lambda: block([[tf.ones((1, 1))], [tf.ones((1, 2))]]),
            ValueError,
            "width",
            id="block_widths",
        ),
        pytest.param(
            lambda: block([[tf.ones((1, 1))], [tf.ones((1, 1)), None]]),
            ValueError,
            "rectangular",
            id="block_ragged",
        ),
        pytest.param(
            lambda: block([[None, None], [tf.ones((1, 1)), tf.ones((1, 1))]]),
            ValueError,
            "cannot be inferred",
            id="block_none_row",
        ),
        pytest.param(
            lambda: block([[tf.ones((1, 1)), tf.ones((1, 1), tf.float64)]]),
            TypeError,
            "dtype",
            id="block_dtype",
        ),
        pytest.param(
            lambda: block_matmul(tf.ones((1, 3)), [[tf.ones((2, 2))]]),
            ValueError,
            "x.shape",
            id="block_x_shape",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[3]], tf.ones(1)),
            ValueError,
            "out of range",
            id="scatter_range",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[1], [1]], tf.ones(2)),
            ValueError,
            "more than once",
            id="scatter_duplicate",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[1]], tf.ones(2)),
            ValueError,
            "`free` must have shape (1,)",
            id="scatter_count",
        ),
        pytest.param(
            lambda: compose(tf.zeros(3), [[1]], tf.ones(1, tf.float64)),
            TypeError,
            "`free` must have the base's dtype",
            id="scatter_dtype",
        ),
    ],
)
def test_bad_arguments_raise(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
