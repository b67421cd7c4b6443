"""The techniques under test, each as the parts of one training step.

Every variant trains a weight matrix ``W`` of shape ``[n, n]`` that acts on a
batch from the right (``y = x @ W``, like a Dense kernel). A variant provides
the trainable variables, the forward pass and, where the technique changes it,
the update; :func:`make_step` wraps them into the same step for all.

The techniques come from ``refimpl``; only the *naive* forms that the book
warns against (``diag(w) @``, ``band_part`` on a full variable, ``concat`` of
blocks) and the dense baseline are written here, since they are the TF idioms
being measured. A variant whose ``refimpl`` function is not available is
reported as such rather than re-implemented.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import refimpl
from evidence.benchmarks.report import GROUPS

# Densities of the free entries for the sparse-delta variants and the one-hot
# trick, whose cost depends on it; the dense masked forms run at MASK_DENSITY
# (their cost does not depend on the mask).
DENSITIES = (0.001, 0.01, 0.1, 0.5)
MASK_DENSITY = 0.01
# Band of the classic Q&A example: one diagonal below, the main diagonal (fixed to
# ones, not trained) and one above.
BANDWIDTH = 3

MASKED = ("grad_mask", "grad_mask_restore", "stop_gradient_mask")
BY_DENSITY = ("one_hot_scatter", "partial_delta", "partial_select", "partial_auto")
STRUCTURED = GROUPS["structured"]
ALL = ("dense_adam", *MASKED, *BY_DENSITY, *STRUCTURED)


class Unavailable(Exception):
    """The ``refimpl`` function a variant needs is not there."""


@dataclasses.dataclass
class Variant:
    """One technique at one size: its variables, forward pass and update."""

    name: str
    n: int
    params: list
    forward: Callable
    free_params: int
    density: float | None = None
    update: Callable | None = None
    mode: str = ""
    bandwidth: int | None = None
    keep: list = dataclasses.field(default_factory=list)


def _lib(name: str):
    """``refimpl.<name>``: the benchmark measures the library, never a copy."""
    if not hasattr(refimpl, name):
        raise Unavailable(f"refimpl.{name} is not available")
    return getattr(refimpl, name)


def random_mask(n: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """A boolean ``[n, n]`` mask with ``round(density * n * n)`` True entries."""
    k = max(1, int(round(density * n * n)))
    flat = np.zeros(n * n, dtype=bool)
    flat[rng.choice(n * n, size=k, replace=False)] = True
    return flat.reshape(n, n)


def _matrix(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((n, n)) / np.sqrt(n)).astype("float32")


def _band_offsets(bandwidth: int) -> list[int]:
    half = bandwidth // 2
    return list(range(-half, half + 1))


def build(
    name: str,
    n: int,
    rng: np.random.Generator,
    *,
    density: float | None = None,
    bandwidth: int = BANDWIDTH,
) -> Variant:
    """Build variant ``name`` for an ``[n, n]`` weight.

    Raises:
        Unavailable: if the ``refimpl`` function it needs is missing.
    """
    if name == "dense_adam":
        w = tf.Variable(_matrix(n, rng), name="w")
        return Variant(name, n, [w], lambda x: x @ w, n * n)
    if name in MASKED or name == "one_hot_scatter":
        return _masked(name, n, rng, MASK_DENSITY if density is None else density)
    if name.startswith("partial_"):
        return _partial(name, n, rng, density)
    if name.startswith("diag_"):
        return _diagonal(name, n, rng)
    if name.startswith("band_"):
        return _band(name, n, rng, bandwidth)
    if name.startswith("block_"):
        return _block(name, n, rng)
    raise ValueError(f"Unknown variant. Received: name={name!r}")


def _masked(name: str, n: int, rng, density: float) -> Variant:
    w = tf.Variable(_matrix(n, rng), name="w")
    mask = random_mask(n, density, rng)
    k = int(mask.sum())
    if name == "stop_gradient_mask":
        partially_trainable = _lib("partially_trainable")
        return Variant(
            name, n, [w], lambda x: x @ partially_trainable(w, mask), k, density
        )
    if name == "one_hot_scatter":
        one_hot_trainable = _lib("one_hot_trainable")
        idx = np.argwhere(mask)
        return Variant(
            name, n, [w], lambda x: x @ one_hot_trainable(w, idx), k, density
        )
    apply_masked_gradients = _lib("apply_masked_gradients")
    restore = name == "grad_mask_restore"

    def update(optimizer, grads, params):
        apply_masked_gradients(
            optimizer, list(zip(grads, params)), [mask], restore_frozen=restore
        )

    return Variant(name, n, [w], lambda x: x @ w, k, density, update=update)


def _partial(name: str, n: int, rng, density: float) -> Variant:
    partial_variable = _lib("PartialVariable")
    mask = random_mask(n, density, rng)
    mode = name.removeprefix("partial_")
    pv = partial_variable(_matrix(n, rng), mask, mode=mode)
    return Variant(
        name,
        n,
        [pv.free],
        lambda x: x @ pv.value(),
        int(mask.sum()),
        density,
        mode=str(pv.mode),
        keep=[pv],
    )


def _diagonal(name: str, n: int, rng) -> Variant:
    w = tf.Variable(rng.standard_normal(n).astype("float32"), name="w")
    if name == "diag_naive":
        forward = lambda x: x @ tf.linalg.diag(w)  # noqa: E731
    else:
        diagonal_matmul = _lib("diagonal_matmul")
        forward = lambda x: diagonal_matmul(x, w)  # noqa: E731
    return Variant(name, n, [w], forward, n)


def _band(name: str, n: int, rng, bandwidth: int) -> Variant:
    """A band of ``bandwidth`` diagonals whose main diagonal is fixed to ones."""
    offsets = _band_offsets(bandwidth)
    half = bandwidth // 2
    free = sum(n - abs(k) for k in offsets if k != 0)
    ones = tf.ones([n])
    if name == "band_naive":
        # The TF 1 idiom: a full variable, cut to the band, diagonal overwritten.
        w = tf.Variable(_matrix(n, rng), name="w")

        def forward(x):
            return x @ tf.linalg.set_diag(tf.linalg.band_part(w, half, half), ones)

        return Variant(name, n, [w], forward, free, bandwidth=bandwidth)
    banded_matmul = _lib("banded_matmul")
    diags = {
        k: tf.Variable(rng.standard_normal(n - abs(k)).astype("float32"))
        for k in offsets
        if k != 0
    }
    parts = [ones if k == 0 else diags[k] for k in offsets]
    return Variant(
        name,
        n,
        list(diags.values()),
        lambda x: banded_matmul(x, parts, offsets),
        free,
        bandwidth=bandwidth,
    )


def _block(name: str, n: int, rng) -> Variant:
    """The classic Q&A layout ``[[0, -0.2 I], [0.35 I, T]]`` with ``T`` trainable."""
    m = n // 2
    t = tf.Variable(_matrix(m, rng), name="t")
    upper = tf.constant(-0.2 * np.eye(m, dtype="float32"))
    lower = tf.constant(0.35 * np.eye(m, dtype="float32"))
    if name == "block_naive":
        zeros = tf.zeros([m, m])

        def forward(x):
            top = tf.concat([zeros, upper], axis=1)
            bottom = tf.concat([lower, t], axis=1)
            return x @ tf.concat([top, bottom], axis=0)

    else:
        block_matmul = _lib("block_matmul")

        def forward(x):
            return block_matmul(x, [[None, upper], [lower, t]])

    return Variant(name, n, [t], forward, m * m)


def optimizer_state_values(optimizer) -> int:
    """Count the values an optimizer keeps per trainable value.

    Sums the sizes of the optimizer's variables, leaving out its scalar
    bookkeeping (the iteration counter and the learning rate).
    """
    total = 0
    for v in optimizer.variables:
        leaf = v.path.rsplit("/", 1)[-1] if hasattr(v, "path") else v.name
        if leaf.split(":")[0] in ("iteration", "iterations", "learning_rate"):
            continue
        total += int(np.prod(v.shape))
    return total


def make_step(variant: Variant, optimizer, *, jit: bool):
    """The training step of ``variant``: forward, loss, gradient, update."""

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(variant.forward(x) - y))
        grads = tape.gradient(loss, variant.params)
        if variant.update is None:
            optimizer.apply_gradients(zip(grads, variant.params))
        else:
            variant.update(optimizer, grads, variant.params)
        return loss

    return tf.function(step, jit_compile=jit)
