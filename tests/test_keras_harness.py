"""Every refimpl layer through Keras' own layer-test harness.

``keras.src.testing.TestCase.run_layer_test`` is how Keras tests ``Dense``:
it checks the config round trip, the weight counts, a call on symbolic and
eager inputs, a few steps of ``fit`` and a run under mixed precision.
"""

import numpy as np
import pytest

# Keras' harness is not public API; the tests import it here, and only here.
from keras.src import testing

import refimpl

pytestmark = pytest.mark.every_backend

EYE = np.eye(4, 3, dtype=bool)


class LayerHarnessTest(testing.TestCase):
    @pytest.mark.slow
    def test_partial_dense(self):
        for mode, trainable in (("delta", 2), ("sparse", 2), ("select", 2)):
            self.run_layer_test(
                refimpl.PartialDense,
                init_kwargs={"units": 3, "trainable_mask": EYE, "mode": mode},
                input_shape=(2, 4),
                expected_output_shape=(2, 3),
                # partial_free and the bias; the kernel (base) and positions
                expected_num_trainable_weights=trainable,
                expected_num_non_trainable_weights=2,
            )

    def test_diagonal_dense(self):
        self.run_layer_test(
            refimpl.DiagonalDense,
            init_kwargs={"use_bias": True},
            input_shape=(2, 4),
            expected_output_shape=(2, 4),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
        )

    @pytest.mark.slow
    def test_banded_dense(self):
        self.run_layer_test(
            refimpl.BandedDense,
            init_kwargs={"lower": 1, "upper": 1},
            input_shape=(2, 4),
            expected_output_shape=(2, 4),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
        )

    @pytest.mark.slow
    def test_block_dense(self):
        self.run_layer_test(
            refimpl.BlockDense,
            init_kwargs={
                "blocks": [["trainable", None], [None, "trainable"]],
                "row_sizes": [2, 2],
                "col_sizes": [1, 2],
            },
            input_shape=(2, 4),
            expected_output_shape=(2, 3),
            expected_num_trainable_weights=2,
            expected_num_non_trainable_weights=0,
        )
