"""Every technique the evidence measures: one record each, one name each.

The exactness matrix (:mod:`evidence.exactness`), the distributed runs
(:mod:`evidence.distributed`) and the benchmarks (:mod:`evidence.benchmarks`)
all read their techniques from :data:`TECHNIQUES`, so a technique has one id
(``"partial_delta"``), one label for tables (``"PartialVariable (delta)"``)
and one family everywhere. The id is also the ``variant`` column of the
benchmark CSV.

What each instrument does with a record:

* ``setup`` is not None: a row of the exactness matrix, and (when ``exact``)
  a custom loop of the distributed runs;
* ``fit`` is not None: the technique also trains with ``model.fit`` in the
  distributed runs (when ``exact``);
* ``benchmark`` is not None: a variant of the benchmark, timed against the
  dense step (and beside the naive TF idiom it replaces, if any).

>>> get("partial_delta").label
'PartialVariable (delta)'
>>> [t.id for t in select(family=RESTRICT, exact=True)]
['grad_mask_restore', 'freeze_entries']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from evidence import keras_cases

__all__ = [
    "FAMILIES",
    "MASK_KINDS",
    "REPARAMETRIZE",
    "RESTRICT",
    "TECHNIQUES",
    "Benchmark",
    "Technique",
    "get",
    "select",
]

#: The forward pass builds the tensor from free and fixed values.
REPARAMETRIZE = "reparametrize"
#: One full variable; its gradient or its update is filtered.
RESTRICT = "restrict the update"
FAMILIES = (RESTRICT, REPARAMETRIZE)
#: The masks a technique accepts: any, a band around the diagonal, the diagonal.
MASK_KINDS = ("any", "band", "diagonal", "rows")
_DENSITY_KINDS = ("swept", "fixed", None)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """How the benchmark times a technique.

    ``build(name, n, rng, density, bandwidth)`` returns the parts of one
    training step (an :class:`evidence.benchmarks.variants.Variant`).
    """

    build: Callable = dataclasses.field(repr=False)
    #: the plot it is drawn in: "restrict the update", "sparse delta", "structured"
    group: str
    #: "swept": timed at every density of the run, since its cost depends on
    #: it; "fixed": at the mask density only; None: it takes no mask.
    density: str | None
    #: the benchmark name of the naive TF idiom it replaces, timed beside it
    naive: str | None = None
    build_naive: Callable | None = dataclasses.field(default=None, repr=False)
    #: the largest density it is timed at (a swept technique whose cost
    #: outgrows the dense step's above it); None: every density of the run
    max_density: float | None = None

    def __post_init__(self):
        if self.density not in _DENSITY_KINDS:
            raise ValueError(
                f"`density` must be one of {_DENSITY_KINDS}. Received: {self.density!r}"
            )
        if (self.naive is None) != (self.build_naive is None):
            raise ValueError("`naive` and `build_naive` go together")


@dataclasses.dataclass(frozen=True)
class Technique:
    """One way to train only some entries of a weight."""

    #: the one name: a Python identifier, the benchmark's ``variant`` column
    id: str
    #: the name in tables and figures
    label: str
    #: :data:`REPARAMETRIZE` or :data:`RESTRICT`
    family: str
    #: frozen entries keep their bits under every optimizer (the exactness
    #: matrix checks it for every technique with a ``setup``)
    exact: bool
    #: ``(initial, mask, compute dtype) -> Setup``; None: not in the matrix
    setup: Callable | None = dataclasses.field(default=None, repr=False)
    #: the masks ``setup`` and ``fit`` accept, one of :data:`MASK_KINDS`
    mask: str = "any"
    #: ``(initial, mask) -> FitSetup`` for ``model.fit``; None: no fit form
    fit: Callable | None = dataclasses.field(default=None, repr=False)
    #: how the benchmark times it; None: not benchmarked
    benchmark: Benchmark | None = None
    #: ``(initial kernel, optimizer) -> (model, optimizer, mask)`` in plain
    #: Keras, for the exactness matrix on every backend
    #: (:mod:`evidence.backend_matrix`); None: not in it
    keras_fit: Callable | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if not self.id.isidentifier():
            raise ValueError(f"`id` must be an identifier. Received: {self.id!r}")
        if self.family not in FAMILIES:
            raise ValueError(
                f"`family` must be one of {FAMILIES}. Received: {self.family!r}"
            )
        if self.mask not in MASK_KINDS:
            raise ValueError(
                f"`mask` must be one of {MASK_KINDS}. Received: {self.mask!r}"
            )

    @property
    def distributed(self) -> bool:
        """Trained by :mod:`evidence.distributed`: exact, and with a setup."""
        return self.exact and self.setup is not None


class _Lazy:
    """A builder of :mod:`evidence._cases`, imported (with TensorFlow) on first use.

    ``_Lazy("name")`` stands for ``_cases.name``; ``_Lazy("name", *args)``
    for ``_cases.name(*args)``, a builder made by a factory. An argument that
    is itself a ``_Lazy`` (or a ``"refimpl.…"`` path in ``_Ref``) is resolved
    first. So the registry, and the Keras-level matrix that reads it, import
    no TensorFlow.
    """

    def __init__(self, name, *args, **kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs

    def resolve(self):
        from evidence import _cases

        target = getattr(_cases, self.name)
        if not (self.args or self.kwargs):
            return target
        args = [a.resolve() if isinstance(a, (_Lazy, _Ref)) else a for a in self.args]
        return target(*args, **self.kwargs)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


class _Ref:
    """A name of refimpl's TensorFlow level, looked up on first use."""

    def __init__(self, path):
        self.path = path

    def resolve(self):
        import importlib

        module, _, name = self.path.rpartition(".")
        return getattr(importlib.import_module(module), name)


TECHNIQUES: tuple[Technique, ...] = (
    # --- restrict the update: one full variable -----------------------------------
    Technique(
        id="stop_gradient_mask",
        label="mask stop_gradient",
        family=RESTRICT,
        exact=False,
        setup=_Lazy("full_blocked", _Ref("refimpl.tf.partially_trainable")),
        benchmark=Benchmark(
            _Lazy("bench_blocked", "partially_trainable"), RESTRICT, "fixed"
        ),
    ),
    Technique(
        id="one_hot_scatter",
        label="one-hot stop_gradient",
        family=RESTRICT,
        exact=False,
        setup=_Lazy("full_blocked", _Ref("refimpl.tf.one_hot_trainable")),
        benchmark=Benchmark(
            _Lazy("bench_blocked", "one_hot_trainable"), RESTRICT, "swept"
        ),
    ),
    Technique(
        id="grad_mask",
        label="gradient masking",
        family=RESTRICT,
        exact=False,
        setup=_Lazy("full_masked", restore_frozen=False),
        fit=_Lazy("fit_masked", restore_frozen=False),
        benchmark=Benchmark(
            _Lazy("bench_masked", restore_frozen=False), RESTRICT, "fixed"
        ),
        keras_fit=keras_cases.masked_optimizer(restore_frozen=False),
    ),
    Technique(
        id="grad_mask_restore",
        label="gradient masking + restore_frozen",
        family=RESTRICT,
        exact=True,
        setup=_Lazy("full_masked", restore_frozen=True),
        fit=_Lazy("fit_masked", restore_frozen=True),
        benchmark=Benchmark(
            _Lazy("bench_masked", restore_frozen=True), RESTRICT, "fixed"
        ),
        keras_fit=keras_cases.masked_optimizer(restore_frozen=True),
    ),
    Technique(
        id="freeze_entries",
        label="FreezeEntries constraint",
        family=RESTRICT,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("constraint_layer")),
        fit=_Lazy("fit_layer", _Lazy("constraint_layer")),
        keras_fit=keras_cases.freeze_entries,
    ),
    # --- reparametrize: only the free values are variables the optimizer sees -----
    Technique(
        id="separate_variables",
        label="separate variables",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("separate"),
    ),
    Technique(
        id="partial_delta",
        label="PartialVariable (delta)",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("partial_variable"),
        fit=_Lazy("fit_partial_variable"),
        benchmark=Benchmark(_Lazy("bench_partial", "delta"), "sparse delta", "swept"),
    ),
    # The select mode hands the optimizer a full-size variable (only where()
    # keeps the frozen entries), so an optimizer that is not elementwise still
    # sees them: under Adafactor its free entries turn NaN where a frozen row
    # meets a frozen column. Its frozen entries stay exact; it is measured for
    # speed only.
    # The sparse product: the delta's weights, and y = x @ base + x @ S with S
    # the sparse matrix of the free values' differences from the base; the
    # matrix is never composed. Above 10% free its [k, batch] temporaries
    # outgrow the kernel, so it is timed up to there.
    Technique(
        id="partial_sparse",
        label="sparse form",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("sparse_dense_layer")),
        fit=_Lazy("fit_layer", _Lazy("sparse_dense_layer")),
        benchmark=Benchmark(
            _Lazy("bench_partial", "sparse"), "sparse delta", "swept", max_density=0.1
        ),
        keras_fit=keras_cases.partial_dense("sparse"),
    ),
    Technique(
        id="partial_select",
        label="select form",
        family=REPARAMETRIZE,
        exact=True,
        benchmark=Benchmark(_Lazy("bench_partial", "select"), "sparse delta", "swept"),
        keras_fit=keras_cases.partial_dense("select"),
    ),
    Technique(
        id="partial_auto",
        label="PartialVariable (auto)",
        family=REPARAMETRIZE,
        exact=True,
        benchmark=Benchmark(_Lazy("bench_partial", "auto"), "sparse delta", "swept"),
    ),
    Technique(
        id="partial_dense",
        label="PartialDense layer",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("partial_dense_layer")),
        fit=_Lazy("fit_layer", _Lazy("partial_dense_layer")),
        keras_fit=keras_cases.partial_dense("delta"),
    ),
    # The slices form: whole rows of the kernel, through a dense sub-product
    # (refimpl.ops); the kernel is never composed.
    Technique(
        id="partial_slices",
        label="slices form",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("slices_dense_layer")),
        mask="rows",
        fit=_Lazy("fit_layer", _Lazy("slices_dense_layer")),
        keras_fit=keras_cases.slices,
    ),
    Technique(
        id="partialize",
        label="partialize (Dense)",
        family=REPARAMETRIZE,
        exact=True,
        keras_fit=keras_cases.partialize,
    ),
    Technique(
        id="diagonal_dense",
        label="DiagonalDense layer",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("diagonal_dense_layer")),
        mask="diagonal",
        fit=_Lazy("fit_layer", _Lazy("diagonal_dense_layer")),
        keras_fit=keras_cases.diagonal,
    ),
    Technique(
        id="banded_dense",
        label="BandedDense layer",
        family=REPARAMETRIZE,
        exact=True,
        setup=_Lazy("layer_setup", _Lazy("banded_dense_layer")),
        mask="band",
        fit=_Lazy("fit_layer", _Lazy("banded_dense_layer")),
        keras_fit=keras_cases.banded,
    ),
    # The structured products, as functions (the layers above call them).
    Technique(
        id="diag_refimpl",
        label="diagonal_matmul",
        family=REPARAMETRIZE,
        exact=True,
        benchmark=Benchmark(
            _Lazy("bench_diagonal", naive=False),
            "structured",
            None,
            naive="diag_naive",
            build_naive=_Lazy("bench_diagonal", naive=True),
        ),
    ),
    Technique(
        id="band_refimpl",
        label="banded_matmul",
        family=REPARAMETRIZE,
        exact=True,
        benchmark=Benchmark(
            _Lazy("bench_band", naive=False),
            "structured",
            None,
            naive="band_naive",
            build_naive=_Lazy("bench_band", naive=True),
        ),
    ),
    Technique(
        id="block_refimpl",
        label="block_matmul",
        family=REPARAMETRIZE,
        exact=True,
        benchmark=Benchmark(
            _Lazy("bench_block", naive=False),
            "structured",
            None,
            naive="block_naive",
            build_naive=_Lazy("bench_block", naive=True),
        ),
    ),
)

_BY_ID = {t.id: t for t in TECHNIQUES}
assert len(_BY_ID) == len(TECHNIQUES), "technique ids must be unique"


def get(technique) -> Technique:
    """The record of ``technique``: an id such as ``"grad_mask"``, or a record.

    Raises:
        ValueError: for anything else, listing the ids.

    >>> get("grad_mask").family
    'restrict the update'
    """
    if isinstance(technique, Technique):
        if _BY_ID.get(technique.id) is not technique:
            raise ValueError(
                f"`technique` must be a record of evidence.registry.TECHNIQUES. "
                f"Received: technique={technique!r}"
            )
        return technique
    if isinstance(technique, str) and technique in _BY_ID:
        return _BY_ID[technique]
    raise ValueError(
        f"`technique` must be one of {list(_BY_ID)}. Received: technique={technique!r}"
    )


def select(**where) -> tuple[Technique, ...]:
    """The techniques whose attributes equal every keyword, in registry order.

    >>> [t.id for t in select(mask="band")]
    ['banded_dense']
    """
    fields = {f.name for f in dataclasses.fields(Technique)} | {"distributed"}
    unknown = sorted(set(where) - fields)
    if unknown:
        raise TypeError(f"Unknown technique attributes: {unknown}")
    return tuple(
        t for t in TECHNIQUES if all(getattr(t, k) == v for k, v in where.items())
    )
