"""How each technique is built, for each instrument of :mod:`evidence`.

Private to :mod:`evidence`: :mod:`evidence.registry` names these functions in
its records, and the instruments reach them only through the records. Three
kinds of builder:

* a **setup** ``(initial, mask, compute) -> Setup``: the technique on one
  square weight, for the exactness matrix (:func:`evidence.exactness.frozen_drift`)
  and the custom loops of :mod:`evidence.distributed`. ``compute`` is the
  compute dtype (``"float32"``, ``"float16"`` or ``"bfloat16"``); the weights
  stay float32.
* a **fit setup** ``(initial, mask) -> FitSetup``: the technique as a Keras
  layer, and what wraps the optimizer, for ``model.compile``/``model.fit``.
* a **benchmark builder** ``(name, n, rng, density, bandwidth) -> Variant``:
  the parts of one training step for :mod:`evidence.benchmarks`.

The benchmark builders take every ``refimpl`` function through :func:`_lib`, so
a function the library lacks is reported (:class:`Unavailable`) rather than
re-implemented here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

import refimpl


class Setup(NamedTuple):
    """One technique on one square weight ``W``, acting as ``y = x @ W``."""

    variables: list  #: what the optimizer gets
    output: Callable  #: the forward pass ``x -> y``
    weight: Callable  #: returns the dense weight
    apply: Callable | None  #: ``apply(optimizer, grads)``, or None for apply_gradients


class FitSetup(NamedTuple):
    """One technique as a Keras layer, for ``model.fit``."""

    layer: keras.layers.Layer  #: built; ``layer.kernel`` is the dense weight
    optimizer: Callable  #: wraps the inner optimizer for ``model.compile``


class Unavailable(Exception):
    """The ``refimpl`` function a benchmark variant needs is not there."""


@dataclasses.dataclass
class Variant:
    """One benchmark variant at one size: its variables, forward pass and update."""

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


# --- masks ---------------------------------------------------------------------


def band_widths(mask: np.ndarray) -> tuple[int, int]:
    """``(lower, upper)`` of a mask that is a full band around the main diagonal."""
    offsets = np.subtract(*np.nonzero(mask)[::-1])  # column - row
    lower = int(max(0, -offsets.min())) if offsets.size else 0
    upper = int(max(0, offsets.max())) if offsets.size else 0
    n = mask.shape[0]
    band = np.tril(np.triu(np.ones((n, n), bool), -lower), upper)
    if not np.array_equal(mask, band):
        raise ValueError(
            "For the BandedDense layer, `mask` must be a full band around the "
            f"main diagonal. Received a mask with {int(mask.sum())} entries "
            f"that is not the band of widths lower={lower}, upper={upper}"
        )
    return lower, upper


def check_diagonal(mask: np.ndarray) -> None:
    """Raise unless ``mask`` is exactly the main diagonal."""
    if not np.array_equal(mask, np.eye(mask.shape[0], dtype=bool)):
        raise ValueError(
            "For the DiagonalDense layer, `mask` must be the main diagonal "
            f"(np.eye). Received a mask with {int(mask.sum())} entries that is "
            "not the diagonal"
        )


def random_mask(n: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """A boolean ``[n, n]`` mask with ``round(density * n * n)`` True entries."""
    k = max(1, int(round(density * n * n)))
    flat = np.zeros(n * n, dtype=bool)
    flat[rng.choice(n * n, size=k, replace=False)] = True
    return flat.reshape(n, n)


# --- setups: the exactness matrix and the distributed custom loops --------------


def _matmul(weight, compute):
    def output(x):
        return tf.matmul(tf.cast(x, compute), tf.cast(weight(), compute))

    return output


def full_blocked(wrap):
    """A full tf.Variable whose frozen entries get no gradient: ``wrap(w, mask)``."""

    def setup(init, mask, compute):
        w = tf.Variable(init)
        return Setup([w], _matmul(lambda: wrap(w, mask), compute), w.read_value, None)

    return setup


def full_masked(*, restore_frozen: bool):
    """A full tf.Variable whose gradient is masked when it is applied."""

    def setup(init, mask, compute):
        w = tf.Variable(init)

        def apply(optimizer, grads):
            refimpl.optimizers.apply_masked_gradients(
                optimizer, [(grads[0], w)], [(w, mask)], restore_frozen=restore_frozen
            )

        return Setup([w], _matmul(w.read_value, compute), w.read_value, apply)

    return setup


def separate(init, mask, compute):
    """The free values in one variable (the optimizer's), the frozen in another.

    ``tf.dynamic_stitch`` puts the two back together, copying values.
    """
    flat, at = init.reshape(-1), [np.flatnonzero(mask), np.flatnonzero(~mask)]
    free = tf.Variable(flat[at[0]], name="free")
    frozen = tf.Variable(flat[at[1]], trainable=False, name="frozen")

    def weight():
        return tf.reshape(tf.dynamic_stitch(at, [free, frozen]), init.shape)

    return Setup([free], _matmul(weight, compute), weight, None)


def partial_variable(init, mask, compute):
    """A :class:`refimpl.PartialVariable` in its default (delta) mode."""
    v = refimpl.PartialVariable(init, mask)
    return Setup(list(v.trainable_variables), _matmul(v.value, compute), v.value, None)


def layer_setup(make):
    """The setup of a Keras layer built by ``make(init, mask, policy)``."""

    def setup(init, mask, compute):
        policy = "float32" if compute == "float32" else f"mixed_{compute}"
        layer = make(init, mask, policy)
        return Setup(layer.trainable_weights, layer, lambda: layer.kernel, None)

    return setup


# --- Keras layers: the layer techniques, for setups and for fit -----------------


def _built(layer, n):
    if not layer.built:
        layer.build((None, n))
    return layer


def constraint_layer(init, mask, policy="float32"):
    """The Keras way: a ``Dense`` whose kernel constraint writes frozen values back."""
    return _built(
        keras.layers.Dense(
            init.shape[1],
            use_bias=False,
            kernel_initializer=keras.initializers.Constant(init),
            kernel_constraint=refimpl.FreezeEntries(values=init, mask=mask),
            dtype=policy,
        ),
        init.shape[0],
    )


def partial_dense_layer(init, mask, policy="float32", *, mode="delta"):
    constant = keras.initializers.Constant(init)
    layer = refimpl.PartialDense(
        init.shape[1],
        mask,
        use_bias=False,
        kernel_initializer=constant,
        dtype=policy,
        mode=mode,
    )
    return _built(layer, init.shape[0])


def sparse_dense_layer(init, mask, policy="float32"):
    """A :class:`refimpl.PartialDense` with ``mode="sparse"``: the sparse product."""
    return partial_dense_layer(init, mask, policy, mode="sparse")


def slices_dense_layer(init, mask, policy="float32"):
    """A :class:`refimpl.PartialDense` with ``mode="slices"`` (whole rows)."""
    check_rows(mask)
    return partial_dense_layer(init, mask, policy, mode="slices")


def rows_mask(n: int) -> np.ndarray:
    """Every third row of an ``n x n`` mask, whole, from row 1 (row 0 if ``n`` is 1)."""
    chosen = np.arange(n) % 3 == min(1, n - 1)
    return np.repeat(chosen[:, None], n, axis=1)


def check_rows(mask: np.ndarray) -> None:
    """Raise unless ``mask`` is whole rows (input features), at least one."""
    rows = mask.any(axis=1)
    if not rows.any() or not np.array_equal(
        mask, np.repeat(rows[:, None], mask.shape[1], 1)
    ):
        raise ValueError(
            "For the slices form, `mask` must be whole rows of the kernel. "
            f"Received a mask with {int(mask.sum())} entries that is not"
            " (every entry of a row, or none)"
        )


def diagonal_dense_layer(init, mask, policy="float32"):
    check_diagonal(mask)
    layer = _built(refimpl.DiagonalDense(dtype=policy), init.shape[0])
    layer.diagonal.assign(np.diagonal(init))
    return layer


def banded_dense_layer(init, mask, policy="float32"):
    lower, upper = band_widths(mask)
    layer = _built(refimpl.BandedDense(lower, upper, dtype=policy), init.shape[0])
    offsets = [k for k in range(-lower, upper + 1) if k != 0]
    if offsets:  # start from the band of `init`, lowest offset first
        layer.off_diagonals.assign(
            np.concatenate([np.diagonal(init, k) for k in offsets])
        )
    layer.diagonal.assign(np.diagonal(init))
    return layer


class PartialKernel(keras.layers.Layer):
    """``y = x @ W`` with ``W`` a :class:`refimpl.PartialVariable`.

    The smallest layer that holds one: Keras tracks the PartialVariable as a
    sub-layer, so ``model.fit`` trains its free values.
    """

    def __init__(self, init, mask, **kwargs):
        super().__init__(**kwargs)
        self.partial = refimpl.PartialVariable(init, mask)

    def call(self, x):
        return keras.ops.matmul(x, self.partial.value())

    @property
    def kernel(self):
        return self.partial.value()


# --- fit setups ----------------------------------------------------------------


def _unchanged(optimizer):
    return optimizer


def fit_layer(make):
    """The fit setup of a layer technique: the layer, the optimizer as it is."""

    def fit(init, mask):
        return FitSetup(make(init, mask), _unchanged)

    return fit


def fit_masked(*, restore_frozen: bool):
    """A plain ``Dense`` trained through :class:`refimpl.MaskedOptimizer`."""

    def fit(init, mask):
        layer = keras.layers.Dense(
            init.shape[1],
            use_bias=False,
            kernel_initializer=keras.initializers.Constant(init),
        )
        _built(layer, init.shape[0])

        def optimizer(inner):
            return refimpl.MaskedOptimizer(
                inner, [(layer.kernel, mask)], restore_frozen=restore_frozen
            )

        return FitSetup(layer, optimizer)

    return fit


def fit_partial_variable(init, mask):
    layer = PartialKernel(init, mask)
    return FitSetup(_built(layer, init.shape[0]), _unchanged)


# --- benchmark builders ----------------------------------------------------------


def _lib(name: str):
    """``refimpl.<name>``: the benchmark measures the library, never a copy.

    ``name`` is a dotted path below :mod:`refimpl` (``"structured.banded_matmul"``,
    ``"tf.one_hot_trainable"``): refimpl 2.0 keeps only what a model needs at
    the top level and the rest in submodules.
    """
    found = refimpl
    for part in name.split("."):
        if not hasattr(found, part):
            raise Unavailable(f"refimpl.{name} is not available")
        found = getattr(found, part)
    return found


def _matrix(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((n, n)) / np.sqrt(n)).astype("float32")


def _band_offsets(bandwidth: int) -> list[int]:
    half = bandwidth // 2
    return list(range(-half, half + 1))


def bench_dense(name, n, rng, density, bandwidth) -> Variant:
    """The baseline: every entry of a full variable trains."""
    w = tf.Variable(_matrix(n, rng), name="w")
    return Variant(name, n, [w], lambda x: x @ w, n * n)


def bench_blocked(function: str):
    """A full variable, the gradient blocked by ``refimpl.tf.<function>(w, mask)``."""

    def build(name, n, rng, density, bandwidth) -> Variant:
        w = tf.Variable(_matrix(n, rng), name="w")
        mask = random_mask(n, density, rng)
        wrap, k = _lib(f"tf.{function}"), int(mask.sum())
        if function == "one_hot_trainable":
            mask = np.argwhere(mask)  # its natural argument: an index list
        return Variant(name, n, [w], lambda x: x @ wrap(w, mask), k, density)

    return build


def bench_masked(*, restore_frozen: bool):
    """A full variable whose gradient is masked by ``apply_masked_gradients``."""

    def build(name, n, rng, density, bandwidth) -> Variant:
        w = tf.Variable(_matrix(n, rng), name="w")
        mask = random_mask(n, density, rng)
        apply_masked_gradients = _lib("optimizers.apply_masked_gradients")

        def update(optimizer, grads, params):
            apply_masked_gradients(
                optimizer,
                list(zip(grads, params)),
                [(w, mask)],
                restore_frozen=restore_frozen,
            )

        return Variant(
            name, n, [w], lambda x: x @ w, int(mask.sum()), density, update=update
        )

    return build


def bench_frozen_product(name, n, rng, density, bandwidth) -> Variant:
    """The floor of every form with a dense frozen base: ``x @ base`` alone.

    One trainable scalar (added to the output) keeps the step a training step;
    the time is that of the forward product (and, for a hidden layer, of the
    input's gradient through it), the part no exact form can skip.
    """
    base = tf.constant(_matrix(n, rng))
    shift = tf.Variable(0.0, name="shift")
    return Variant(name, n, [shift], lambda x: x @ base + shift, 1)


def bench_partial(mode: str):
    """A :class:`refimpl.PartialVariable` in ``mode``, multiplied by ``matmul``."""

    def build(name, n, rng, density, bandwidth) -> Variant:
        partial_variable_class = _lib("PartialVariable")
        mask = random_mask(n, density, rng)
        pv = partial_variable_class(_matrix(n, rng), mask, mode=mode)
        return Variant(
            name,
            n,
            list(pv.trainable_variables),
            pv.matmul,
            int(mask.sum()),
            density,
            mode=str(pv.mode),
            keep=[pv],
        )

    return build


def bench_diagonal(*, naive: bool):
    def build(name, n, rng, density, bandwidth) -> Variant:
        w = tf.Variable(rng.standard_normal(n).astype("float32"), name="w")
        if naive:
            forward = lambda x: x @ tf.linalg.diag(w)  # noqa: E731
        else:
            diagonal_matmul = _lib("structured.diagonal_matmul")
            forward = lambda x: diagonal_matmul(x, w)  # noqa: E731
        return Variant(name, n, [w], forward, n)

    return build


def bench_band(*, naive: bool):
    """A band of ``bandwidth`` diagonals whose main diagonal is fixed to ones."""

    def build(name, n, rng, density, bandwidth) -> Variant:
        offsets = _band_offsets(bandwidth)
        half = bandwidth // 2
        free = sum(n - abs(k) for k in offsets if k != 0)
        ones = tf.ones([n])
        if naive:
            # The TF 1 idiom: a full variable, cut to the band, diagonal overwritten.
            w = tf.Variable(_matrix(n, rng), name="w")

            def forward(x):
                return x @ tf.linalg.set_diag(tf.linalg.band_part(w, half, half), ones)

            return Variant(name, n, [w], forward, free, bandwidth=bandwidth)
        banded_matmul = _lib("structured.banded_matmul")
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

    return build


def bench_block(*, naive: bool):
    """The classic Q&A layout ``[[0, -0.2 I], [0.35 I, T]]`` with ``T`` trainable."""

    def build(name, n, rng, density, bandwidth) -> Variant:
        m = n // 2
        t = tf.Variable(_matrix(m, rng), name="t")
        upper = tf.constant(-0.2 * np.eye(m, dtype="float32"))
        lower = tf.constant(0.35 * np.eye(m, dtype="float32"))
        if naive:
            zeros = tf.zeros([m, m])

            def forward(x):
                top = tf.concat([zeros, upper], axis=1)
                bottom = tf.concat([lower, t], axis=1)
                return x @ tf.concat([top, bottom], axis=0)

        else:
            block_matmul = _lib("structured.block_matmul")

            def forward(x):
                return block_matmul(x, [[None, upper], [lower, t]])

        return Variant(name, n, [t], forward, m * m)

    return build
