"""The variants under test, each as the parts of one training step.

Every variant trains a weight matrix ``W`` of shape ``[n, n]`` that acts on a
batch from the right (``y = x @ W``, like a Dense kernel). A variant provides
the trainable variables, the forward pass and, where the technique changes it,
the update; :func:`make_step` wraps them into the same step for all.

The variants are the techniques of :mod:`evidence.registry` that have a
``benchmark`` (named by their id), the naive TF idiom each structured one
replaces (``diag(w) @``, ``band_part`` on a full variable, ``concat`` of
blocks: named in the technique's record), the dense baseline, and the floor
of every form that keeps a dense frozen base (``frozen_product``: the forward
product ``x @ base`` alone). These are comparisons, not techniques. A
variant whose ``refimpl`` function is not available is reported as such
(:class:`Unavailable`) rather than re-implemented.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import refimpl
from evidence import _cases, registry
from evidence._cases import Unavailable, Variant, random_mask

__all__ = [
    "ALL",
    "BANDWIDTH",
    "BASELINE",
    "DENSITIES",
    "FIXED",
    "FLOOR",
    "COMPARISONS",
    "GROUPS",
    "MASK_DENSITY",
    "SWEPT",
    "Unavailable",
    "Variant",
    "build",
    "label",
    "make_step",
    "optimizer_state_values",
    "random_mask",
    "technique",
]

# Densities of the free entries for the variants whose cost depends on it
# (the sparse deltas, the one-hot trick); the masked full variables run at
# MASK_DENSITY only (their cost does not depend on the mask).
DENSITIES = (0.001, 0.01, 0.1, 0.5)
MASK_DENSITY = 0.01
# Band of the classic Q&A example: one diagonal below, the main diagonal (fixed to
# ones, not trained) and one above.
BANDWIDTH = 3
#: The dense step every ratio is taken against: all n x n entries train.
BASELINE = "dense_adam"
#: The forward product with a frozen dense base, and nothing else to train.
FLOOR = "frozen_product"


def _catalogue() -> dict:
    """Variant name -> (builder, the benchmark record it belongs to, technique)."""
    found = {
        BASELINE: (_cases.bench_dense, None, None),
        FLOOR: (_cases.bench_frozen_product, None, None),
    }
    for t in registry.TECHNIQUES:
        spec = t.benchmark
        if spec is None:
            continue
        if spec.naive is not None:
            found[spec.naive] = (spec.build_naive, spec, None)
        found[t.id] = (spec.build, spec, t)
    return found


_CATALOGUE = _catalogue()
#: Every variant, in the order of the CSV: the baseline, then the techniques
#: in registry order, each after the naive idiom it replaces.
ALL: tuple[str, ...] = tuple(_CATALOGUE)
#: Timed at every density of the run.
SWEPT: tuple[str, ...] = tuple(
    name for name, (_, s, _) in _CATALOGUE.items() if s and s.density == "swept"
)
#: Timed at :data:`MASK_DENSITY` only.
FIXED: tuple[str, ...] = tuple(
    name for name, (_, s, _) in _CATALOGUE.items() if s and s.density == "fixed"
)
#: The plots, each with its variants: "restrict the update", "sparse delta",
#: "structured".
GROUPS: dict[str, tuple[str, ...]] = {
    group: tuple(
        name for name, (_, s, _) in _CATALOGUE.items() if s and s.group == group
    )
    for group in dict.fromkeys(s.group for _, s, _ in _CATALOGUE.values() if s)
}


def technique(name: str) -> registry.Technique | None:
    """The registry record variant ``name`` times; None for a comparison.

    >>> technique("partial_delta").label
    'PartialVariable (delta)'
    >>> technique("diag_naive") is None
    True
    """
    _check(name)
    return _CATALOGUE[name][2]


#: The variants that are not techniques, each with the name tables and plots
#: show for it.
COMPARISONS: dict[str, str] = {
    BASELINE: "dense step",
    FLOOR: "x @ base alone (the floor)",
    "diag_naive": "x @ tf.linalg.diag(w)",
    "band_naive": "band_part of a full variable",
    "block_naive": "tf.concat of blocks",
}


def label(name: str) -> str:
    """The name tables and plots show for variant ``name``.

    A technique's registry label, or the name of a comparison.

    >>> label("partial_delta"), label("frozen_product")
    ('PartialVariable (delta)', 'x @ base alone (the floor)')
    """
    technique_ = technique(name)
    return technique_.label if technique_ is not None else COMPARISONS[name]


def _check(name: str) -> None:
    if name not in _CATALOGUE:
        raise ValueError(f"Unknown variant: one of {list(ALL)}. Received: {name!r}")


def build(
    name: str,
    n: int,
    rng: np.random.Generator,
    *,
    density: float | None = None,
    bandwidth: int = BANDWIDTH,
) -> Variant:
    """Build variant ``name`` for an ``[n, n]`` weight.

    ``density`` is the fraction of free entries for the variants that take a
    mask (:data:`MASK_DENSITY` when ``None``); it is ignored by the others.

    Raises:
        ValueError: for an unknown name.
        Unavailable: if the ``refimpl`` function it needs is missing.
    """
    _check(name)
    builder, spec, _ = _CATALOGUE[name]
    if spec is None or spec.density is None:
        density = None
    elif density is None:
        density = MASK_DENSITY
    return builder(name, n, rng, density, bandwidth)


def optimizer_state_values(optimizer) -> int:
    """Count the values an optimizer keeps (``refimpl.testing.count_optimizer_state``).

    The benchmark's column of that name; one count for the book and the
    library.
    """
    return refimpl.testing.count_optimizer_state(optimizer)


def max_density(name: str) -> float | None:
    """The largest density variant ``name`` is timed at; None: no limit.

    >>> max_density("partial_sparse")
    0.1
    """
    _check(name)
    spec = _CATALOGUE[name][1]
    return None if spec is None else spec.max_density


def make_step(variant: Variant, optimizer, *, jit: bool, hidden: bool = False):
    """The training step of ``variant``: forward, loss, gradient, update.

    With ``hidden=True`` the step also computes the gradient with respect to
    the input ``x``, as the layer would need inside a network (a hidden
    layer); its sum joins the returned loss so that nothing prunes it.
    """

    def step(x, y):
        with tf.GradientTape() as tape:
            if hidden:
                tape.watch(x)
            loss = tf.reduce_mean(tf.square(variant.forward(x) - y))
        sources = list(variant.params) + ([x] if hidden else [])
        grads = tape.gradient(loss, sources)
        if hidden:
            grads, dx = grads[:-1], grads[-1]
            loss = loss + 1e-30 * tf.reduce_sum(dx)
        if variant.update is None:
            optimizer.apply_gradients(zip(grads, variant.params))
        else:
            variant.update(optimizer, grads, variant.params)
        return loss

    return tf.function(step, jit_compile=jit)


def cases(names, densities):
    """(variant, density) pairs in report order; density None where unused."""
    for name in names:
        if name in SWEPT:
            top = max_density(name)
            for d in densities:
                if top is None or d <= top:
                    yield name, d
        elif name in FIXED:
            yield name, MASK_DENSITY
        else:
            yield name, None
