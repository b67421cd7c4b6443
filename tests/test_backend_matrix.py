"""The Keras-level exactness matrix, on the backend this run uses.

`make test` runs it under TensorFlow and under JAX (and PyTorch if it is
installed): each backend has its own optimizer implementations.
"""

import keras
import pytest

from evidence import backend_matrix

pytestmark = [pytest.mark.every_backend, pytest.mark.slow]


@pytest.fixture(scope="module")
def cells():
    return backend_matrix.run()


def test_the_matrix_covers_every_technique_and_optimizer(cells):
    assert len(cells) == len(backend_matrix.TECHNIQUES) * len(backend_matrix.OPTIMIZERS)
    assert {c.backend for c in cells} == {keras.backend.backend()}


def test_exact_techniques_keep_every_frozen_bit_and_train_the_free_entries(cells):
    for cell in cells:
        if cell.exact:
            assert cell.frozen_moved == 0, cell
            assert cell.free_moved > 0, cell


def test_masking_alone_lets_weight_decay_move_the_frozen_entries(cells):
    # Every optimizer here decays every entry of the full kernel, masked or not.
    for cell in cells:
        if not cell.exact:
            assert cell.frozen_moved == cell.frozen, cell
