"""Facts that appendices/exactness and appendices/distributed state and no longer show.

The reference pages keep the matrix, the failures and the sharp bits in cells;
these checks hold what the old exactness chapter showed in a cell of its own:
which weights of the refimpl layers Muon hands to its inner AdamW.
"""

import keras
import numpy as np

import refimpl

MASK = np.random.default_rng(0).random((6, 6)) < 0.5


def _routes(layer, muon):
    layer.build((None, 6))
    return {w.name: muon._should_use_adamw(w) for w in layer.trainable_weights}


def test_muon_hands_the_vector_weights_of_refimpl_layers_to_its_adamw():
    muon = keras.optimizers.Muon()
    for layer in [
        refimpl.PartialDense(3, MASK[:, :3]),
        refimpl.DiagonalDense(),
        refimpl.BandedDense(1, 1),
    ]:
        routes = _routes(layer, muon)
        assert routes and all(routes.values()), (type(layer).__name__, routes)
    assert muon._should_use_adamw(
        refimpl.PartialVariable(MASK * 1.0, MASK).trainable_variables[0]
    )


def test_muon_runs_its_own_update_on_full_matrices_and_blockdense_blocks():
    muon = keras.optimizers.Muon()
    block = refimpl.BlockDense(
        [[None, -0.2 * np.eye(3)], [0.35 * np.eye(3), "trainable"]]
    )
    assert _routes(block, muon) == {"block_1_1": False}
    assert not muon._should_use_adamw(keras.Variable(np.ones((6, 6), "float32")))
