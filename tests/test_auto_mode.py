"""`mode="auto"` on layers without a sparse product: it picks the delta where
a Dense layer would get the sparse product (very few free entries)."""

import keras
import numpy as np
import pytest

import refimpl
from refimpl import selection

pytestmark = pytest.mark.every_backend


def _embedding_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(1000, 8, name="e")]
    )


def test_auto_on_new_embedding_rows_is_the_delta():
    model = _embedding_model()
    rows = selection.rows_mask((1000, 8), [999])  # 0.1 % free: sparse for a Dense
    assert refimpl.ops.choose_mode(rows) == "sparse"
    converted = refimpl.partialize(model, {"e": rows}, mode="auto")
    layer = converted.get_layer("e")
    assert layer.partial_weight.mode == "delta"
    assert layer.partial_weight.product_mode() == "delta"
    x = np.array([[1, 2, 999]], dtype="int32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(converted(x)), keras.ops.convert_to_numpy(model(x))
    )


def test_auto_on_an_einsum_dense_kernel_with_few_entries_is_the_delta():
    keras.utils.set_random_seed(0)
    layer = keras.layers.EinsumDense("ab,bc->ac", output_shape=(64,), name="p")
    model = keras.Sequential([keras.Input((64,)), layer])
    mask = np.zeros((64, 64), bool)
    mask[3, 5] = True  # one entry, not a whole row or column
    converted = refimpl.partialize(model, {"p": mask}, mode="auto")
    assert converted.get_layer("p").partial_weight.mode == "delta"


def test_auto_on_a_dense_kernel_with_few_entries_is_still_the_sparse_product():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, name="d")])
    mask = np.zeros((64, 64), bool)
    mask[3, 5] = True
    converted = refimpl.partialize(model, {"d": mask}, mode="auto")
    assert converted.get_layer("d").partial_weight.mode == "sparse"
