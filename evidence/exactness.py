"""Measure whether frozen entries keep their bits: technique x optimizer.

:func:`frozen_drift` trains one 2-D weight for a few steps with one technique
and one optimizer, and counts the frozen entries whose stored bits changed.
The book's exactness chapter and the conformance tests both run it, so the
table the book prints and the assertions CI makes come from the same code.
The techniques are the records of :mod:`evidence.registry` that have a
``setup`` (:data:`TECHNIQUES`, the rows of the matrix);
:func:`keras_optimizers` lists every optimizer class ``keras.optimizers``
exports (the columns), so a class added to Keras joins the table without
anyone typing it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

import refimpl
from evidence import _cases, registry

__all__ = [
    "TECHNIQUES",
    "Drift",
    "OptimizerCase",
    "frozen_drift",
    "keras_optimizers",
    "mask_for",
]

#: The rows of the exactness matrix: every registry technique with a setup.
TECHNIQUES: tuple[registry.Technique, ...] = tuple(
    t for t in registry.TECHNIQUES if t.setup is not None
)
_DTYPES = ("float32", "mixed_float16", "mixed_bfloat16")
_EXECUTIONS = ("eager", "function", "xla")


class Drift(NamedTuple):
    """What :func:`frozen_drift` measured."""

    moved: int  #: frozen entries whose bits changed
    frozen: int  #: frozen entries in all
    nonfinite: int  #: entries (frozen or not) that ended NaN or infinite
    before: np.ndarray  #: the dense weight before training
    after: np.ndarray  #: the dense weight after training
    mask: np.ndarray  #: the trainable positions


@dataclasses.dataclass(frozen=True)
class OptimizerCase:
    """One column of the matrix: an optimizer, built fresh by calling it.

    >>> case = keras_optimizers()["Adam(weight_decay=0.004)"]
    >>> case.cls.__name__, case.weight_decay, case().weight_decay
    ('Adam', 0.004, 0.004)
    """

    #: the column label, e.g. ``"Adam"``, ``"AdamW(weight_decay=0)"``
    name: str
    #: the ``keras.optimizers`` class (for a wrapper, the wrapper's class)
    cls: type
    #: returns a fresh optimizer
    factory: Callable[[], keras.optimizers.Optimizer] = dataclasses.field(repr=False)
    #: the decoupled weight decay it applies; 0.0 for none
    weight_decay: float = 0.0

    def __call__(self) -> keras.optimizers.Optimizer:
        return self.factory()


def keras_optimizers(*, weight_decay: float = 0.004) -> dict[str, OptimizerCase]:
    """Return an :class:`OptimizerCase` for every class in ``keras.optimizers``.

    Each class is built with its defaults; a wrapper (``LossScaleOptimizer``,
    Keras' own ``MultiOptimizer``) wraps ``Adam``. Every class that takes
    ``weight_decay`` gets a second entry with the other choice: ``weight_decay``
    where the default is none, ``0`` where the default decays (AdamW, Muon).
    ``SGD(momentum=0.9)`` is added as well. A class that needs arguments this
    function does not know gets a factory that raises Keras' own error.

    Returns:
        The cases by name, in the order of the table's columns.

    >>> optimizers = keras_optimizers()
    >>> [optimizers[name].weight_decay for name in ("AdamW", "AdamW(weight_decay=0)")]
    [0.004, 0.0]
    """
    if isinstance(weight_decay, bool) or not (
        isinstance(weight_decay, (int, float)) and 0 < weight_decay < float("inf")
    ):
        raise ValueError(
            "`weight_decay` must be a positive, finite number. "
            f"Received: weight_decay={weight_decay!r}"
        )
    cases: list[OptimizerCase] = []
    for name in sorted(dir(keras.optimizers)):
        cls = getattr(keras.optimizers, name)
        if not (inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)):
            continue
        if cls is keras.optimizers.Optimizer:
            continue
        params = inspect.signature(cls.__init__).parameters
        if "inner_optimizer" in params:
            factory = lambda cls=cls: cls(keras.optimizers.Adam())  # noqa: E731
        elif "optimizer_map" in params:
            factory = lambda cls=cls: cls(  # noqa: E731
                keras.optimizers.OptimizerMap(keras.optimizers.Adam())
            )
        else:
            factory = cls
        default = params["weight_decay"].default if "weight_decay" in params else None
        cases.append(OptimizerCase(name, cls, factory, float(default or 0.0)))
        if name == "SGD":
            cases.append(
                OptimizerCase(
                    "SGD(momentum=0.9)", cls, lambda: keras.optimizers.SGD(momentum=0.9)
                )
            )
        if "weight_decay" in params:
            decay = 0 if default else weight_decay
            cases.append(
                OptimizerCase(
                    f"{name}(weight_decay={decay})",
                    cls,
                    lambda cls=cls, decay=decay: cls(weight_decay=decay),
                    float(decay),
                )
            )
    return {case.name: case for case in cases}


def mask_for(technique, mask) -> np.ndarray:
    """The mask :func:`frozen_drift` needs for ``technique``, in place of ``mask``.

    ``mask`` itself for a technique that takes any mask; for a structured
    layer, its own structure of the same size: the tridiagonal band
    (``mask="band"``), the main diagonal (``mask="diagonal"``) or every
    third row, whole (``mask="rows"``, the slices form).

    >>> mask_for("banded_dense", np.zeros((3, 3), bool)).astype(int)
    array([[1, 1, 0],
           [1, 1, 1],
           [0, 1, 1]])
    """
    technique = registry.get(technique)
    mask = np.asarray(mask)
    if technique.mask == "any":
        return mask
    n = mask.shape[0]
    if technique.mask == "band":
        return np.abs(np.subtract.outer(np.arange(n), np.arange(n))) <= 1
    if technique.mask == "rows":
        return _cases.rows_mask(n)
    return np.eye(n, dtype=bool)


def frozen_drift(
    technique,
    optimizer,
    mask,
    *,
    steps: int = 5,
    dtype: str = "float32",
    execution: str = "eager",
    seed: int = 0,
) -> Drift:
    """Train a square weight with ``technique`` and count the frozen entries moved.

    The weight ``W`` (random normal, from ``seed``) acts on a fixed random
    batch as ``y = x @ W``; the loss is the mean squared distance to a random
    target, so every entry of ``W`` has a non-zero gradient. After ``steps``
    optimizer steps the dense weight is compared with its starting value bit
    for bit (:func:`refimpl.testing.moved`). A structured layer holds only its free
    values, so its frozen entries start (and stay) at zero.

    Args:
        technique: the id of a technique of :data:`TECHNIQUES` (such as
            ``"grad_mask"``), or its :class:`evidence.registry.Technique`.
        optimizer: a fresh (unused) Keras optimizer, or a function of no
            arguments that returns one (such as an :class:`OptimizerCase`).
        mask: the trainable positions, a square boolean (or 0.0/1.0) mask;
            for a structured layer its band or diagonal (:func:`mask_for`).
        steps: the number of optimizer steps, ``>= 1``.
        dtype: ``"float32"``, ``"mixed_float16"`` (the forward pass in
            float16 and, as ``model.compile`` does, the optimizer wrapped in a
            ``LossScaleOptimizer``) or ``"mixed_bfloat16"``. Weights stay
            float32.
        execution: ``"eager"``, ``"function"`` (the step in ``tf.function``) or
            ``"xla"`` (``tf.function(jit_compile=True)``).
        seed: seeds the weight, the batch and the target.

    Returns:
        A :class:`Drift`.

    Raises:
        ValueError, TypeError: for an unknown technique, dtype or execution, a bad
            mask, or an optimizer that is not a fresh Keras optimizer; and
            whatever an optimizer raises when it cannot run the technique.

    >>> mask = np.eye(3, dtype=bool)
    >>> frozen_drift("grad_mask", keras.optimizers.Adam(), mask).moved
    0
    >>> frozen_drift("grad_mask", keras.optimizers.AdamW(), mask).moved
    6
    """
    technique, mask, optimizer = _check(
        technique, optimizer, mask, steps, dtype, execution
    )
    rng = np.random.default_rng(seed)
    n = mask.shape[0]
    init = rng.normal(size=(n, n)).astype("float32")
    x = tf.constant(rng.normal(size=(8, n)).astype("float32"))
    target = tf.constant(rng.normal(size=(8, n)).astype("float32"))
    variables, output, weight, apply = technique.setup(
        init, mask, dtype.removeprefix("mixed_")
    )
    if dtype == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(variables)
    before = _numpy(weight())

    def step():
        with tf.GradientTape() as tape:
            y = tf.cast(output(x), "float32")
            loss = optimizer.scale_loss(tf.reduce_mean(tf.square(y - target)))
        grads = tape.gradient(loss, variables)
        if apply is None:
            optimizer.apply_gradients(zip(grads, variables))
        else:
            apply(optimizer, grads)

    if execution != "eager":
        step = tf.function(step, jit_compile=execution == "xla", autograph=False)
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")  # each call traces a new step: no retracing warning
    try:
        for _ in range(steps):
            step()
    finally:
        logger.setLevel(level)
    after = _numpy(weight())
    return Drift(
        moved=int((refimpl.testing.moved(before, after) & ~mask).sum()),
        frozen=int((~mask).sum()),
        nonfinite=int((~np.isfinite(after)).sum()),
        before=before,
        after=after,
        mask=mask,
    )


def _numpy(value) -> np.ndarray:
    return np.array(keras.ops.convert_to_numpy(value))


def _check(technique, optimizer, mask, steps, dtype, execution):
    technique = registry.get(technique)
    if technique.setup is None:
        raise ValueError(
            f"`technique` must have a setup for the exactness matrix, one of "
            f"{[t.id for t in TECHNIQUES]}. Received: technique={technique.id!r}"
        )
    for name, value, known in (
        ("dtype", dtype, _DTYPES),
        ("execution", execution, _EXECUTIONS),
    ):
        if value not in known:
            raise ValueError(f"`{name}` must be one of {known}. Received: {value!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an int >= 1. Received: steps={steps!r}")
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = optimizer()
    if not isinstance(optimizer, keras.optimizers.Optimizer) or optimizer.built:
        raise TypeError(
            "`optimizer` must be a fresh (never applied) Keras optimizer, or a "
            f"function that returns one. Received: optimizer={optimizer!r}"
        )
    array = np.asarray(mask.numpy() if hasattr(mask, "numpy") else mask)
    if array.dtype != bool and not np.issubdtype(array.dtype, np.floating):
        raise TypeError(
            "`mask` must be a boolean (or 0.0/1.0) mask of the square weight. "
            f"Received dtype {array.dtype}: mask={mask!r}"
        )
    if array.ndim != 2 or array.shape[0] != array.shape[1] or not array.size:
        raise ValueError(
            "`mask` must be a square mask of a non-empty 2-D weight. "
            f"Received a mask of shape {array.shape}"
        )
    mask = refimpl.masks.to_mask(array, array.shape)
    if technique.mask == "band":
        _cases.band_widths(mask)
    elif technique.mask == "diagonal":
        _cases.check_diagonal(mask)
    elif technique.mask == "rows":
        _cases.check_rows(mask)
    return technique, mask, optimizer
