"""The exactness matrix of refimpl's Keras-level techniques, on the active backend.

Each Keras backend has its own optimizer implementations (JAX's and
PyTorch's updates are not TensorFlow's), so the claim "frozen entries keep
their bits" is checked on each: every technique below trains a small model
with ``model.fit`` under every Keras optimizer, each with weight decay (the
update that moves entries whose gradient is zero), and the matrix records how
many frozen entries moved and how many free ones did.

Unlike :mod:`evidence.exactness`, which also covers the TensorFlow-level
techniques, everything here is ``keras.ops`` and ``fit``: it runs unchanged
under ``KERAS_BACKEND=tensorflow``, ``jax`` and ``torch``.

    KERAS_BACKEND=jax python -m evidence.backend_matrix
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np

import refimpl
from evidence import registry
from evidence.keras_cases import MASK, N_IN, N_OUT

__all__ = ["MASK", "N_IN", "N_OUT", "OPTIMIZERS", "TECHNIQUES", "Cell", "run"]


def _decayed(cls, **kwargs):
    return lambda: cls(learning_rate=0.05, weight_decay=0.05, **kwargs)


#: Every Keras optimizer, each with weight decay.
OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "SGD": _decayed(keras.optimizers.SGD),
    "Nesterov": _decayed(keras.optimizers.SGD, momentum=0.9, nesterov=True),
    "RMSprop": _decayed(keras.optimizers.RMSprop),
    "Adam": _decayed(keras.optimizers.Adam),
    "AdamW": _decayed(keras.optimizers.AdamW),
    "Adamax": _decayed(keras.optimizers.Adamax),
    "Nadam": _decayed(keras.optimizers.Nadam),
    "Adagrad": _decayed(keras.optimizers.Adagrad),
    "Adadelta": _decayed(keras.optimizers.Adadelta),
    "Adafactor": _decayed(keras.optimizers.Adafactor),
    "Ftrl": _decayed(keras.optimizers.Ftrl),
    "Lion": _decayed(keras.optimizers.Lion),
    "Lamb": _decayed(keras.optimizers.Lamb),
}


#: The registry's techniques that have a plain-Keras form, by id.
TECHNIQUES: dict[str, registry.Technique] = {
    t.id: t for t in registry.TECHNIQUES if t.keras_fit is not None
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One technique under one optimizer, on one backend."""

    backend: str
    technique: str
    optimizer: str
    #: the technique claims exactness
    exact: bool
    #: frozen entries whose bits changed (0 for an exact technique)
    frozen_moved: int
    frozen: int
    #: free entries that changed (all of them, for a working technique)
    free_moved: int
    free: int


def _kernel(model) -> np.ndarray:
    return np.array(keras.ops.convert_to_numpy(model.get_layer("dense").kernel))


def train_one(technique: str, optimizer: str, *, steps: int = 3) -> Cell:
    """Train ``technique`` with ``optimizer`` for ``steps`` batches of ``fit``."""
    entry = TECHNIQUES[technique]
    rng = np.random.default_rng(0)
    init = rng.normal(size=(N_IN, N_OUT)).astype("float32")
    keras.utils.set_random_seed(0)
    model, opt, mask = entry.keras_fit(init, OPTIMIZERS[optimizer]())
    units = mask.shape[1]
    x = rng.normal(size=(8 * steps, N_IN)).astype("float32")
    y = rng.normal(size=(8 * steps, units)).astype("float32")
    before = _kernel(model)
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    changed = refimpl.testing.moved(before, _kernel(model))
    return Cell(
        backend=keras.backend.backend(),
        technique=technique,
        optimizer=optimizer,
        exact=entry.exact,
        frozen_moved=int((changed & ~mask).sum()),
        frozen=int((~mask).sum()),
        free_moved=int((changed & mask).sum()),
        free=int(mask.sum()),
    )


def run(techniques=None, optimizers=None) -> list[Cell]:
    """The matrix: every technique under every optimizer, on this backend."""
    return [
        train_one(t, o)
        for t in techniques or TECHNIQUES
        for o in optimizers or OPTIMIZERS
    ]


def table(cells: list[Cell]) -> str:
    """Frozen entries moved, a row per technique and a column per optimizer."""
    techniques = list(dict.fromkeys(c.technique for c in cells))
    optimizers = list(dict.fromkeys(c.optimizer for c in cells))
    by = {(c.technique, c.optimizer): c for c in cells}
    width = max(len(TECHNIQUES[t].label) for t in techniques)
    lines = [
        f"frozen entries moved on {cells[0].backend} (of the frozen ones)",
        " " * width + " " + " ".join(f"{o[:9]:>9}" for o in optimizers),
    ]
    for t in techniques:
        row = [f"{by[t, o].frozen_moved:>4}/{by[t, o].frozen:<4}" for o in optimizers]
        lines.append(f"{TECHNIQUES[t].label:<{width}} " + " ".join(row))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run()))
