"""Write, read and plot benchmark results.

The CSV has one row per (``jit``, ``n``, ``variant``, ``density``). Its first
columns are the agreed schema that the book reads; later columns only add
detail (why a variant did not run, the mode a partial variable chose, ...).
Matplotlib is imported only by the plotting functions, and TensorFlow only
for ``GROUPS`` (which variants each overview plot shows, from
:mod:`evidence.registry` through :mod:`evidence.benchmarks.variants`).

Columns:

* ``device`` (``cpu`` or ``gpu``), ``tf_version``, ``jit`` (``True`` with
  ``jit_compile=True``), ``n`` (the weight is n x n), ``variant`` (a
  technique id of :mod:`evidence.registry`, or a comparison: ``dense_adam``
  and the naive idioms ``diag_naive``, ``band_naive``, ``block_naive``);
* ``density``: the fraction of free entries of the mask, blank for the dense
  step and the structured forms;
* ``free_params``: the values that can change the output (k for a mask, n for
  a diagonal, ...), whatever the variable's size;
* ``optimizer_state_values``: the size of Adam's variables, its scalar
  iteration counter and learning rate left out (2 per trained value);
* ``median_ms``, ``q25_ms``, ``q75_ms``: one step's time over the rounds;
* ``ratio_to_dense``, ``ratio_q25``, ``ratio_q75``: the per-round ratio to the
  dense step of the same ``n`` and ``jit``, its median and quartiles;
* ``repeats``: the number of rounds;
* ``status``: ``ok``, or why there is no timing (``unavailable: ...``,
  ``xla_unsupported: <op>``, or the error's last line);
* ``mode``: the form a ``PartialVariable`` used (``delta`` or ``select``);
* ``bandwidth``: the number of diagonals of a band; ``steps``: steps per
  timing sample; ``batch``: the batch size; ``machine``: CPU or GPU model.
"""

from __future__ import annotations

import csv
import pathlib
import platform

COLUMNS = (
    "device,tf_version,jit,n,variant,density,free_params,optimizer_state_values,"
    "median_ms,q25_ms,q75_ms,ratio_to_dense,ratio_q25,ratio_q75,repeats,"
    # Added after the agreed schema:
    "status,mode,bandwidth,steps,batch,machine"
).split(",")
_INT = {"n", "free_params", "optimizer_state_values", "repeats", "bandwidth"}
_INT |= {"steps", "batch"}
_FLOAT = {"density", "median_ms", "q25_ms", "q75_ms", "ratio_to_dense"}
_FLOAT |= {"ratio_q25", "ratio_q75"}
# The memory table's measurements (``evidence.benchmarks.memory``).
_FLOAT |= {"resident_mb", "peak_mb", "step_mb", "n2_mb"}
# The real-model tables' (``evidence.benchmarks.real_models``).
_INT |= {"trainable_values"}
_FLOAT |= {"step_ms", "compose_ms", "forward_ms", "gradient_ms", "update_ms"}
_FLOAT |= {f"vs_{to}{q}" for to in ("full", "floor") for q in ("", "_q25", "_q75")}


def __getattr__(name: str):
    # GROUPS (the plots, one idea each, and the variants in each) comes from
    # the registry, which imports TensorFlow: only when asked for, so that
    # reading a CSV stays light.
    if name == "GROUPS":
        from evidence.benchmarks import variants

        return variants.GROUPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def machine_description() -> tuple[str, str]:
    """Return ``(device, machine)``: ``"gpu"`` or ``"cpu"``, and its model."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return "gpu", str(details.get("device_name", "GPU"))
    model = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return "cpu", f"{model} ({os.cpu_count()} cores)"


def write_csv(rows: list[dict], path) -> None:
    """Write ``rows`` (dicts keyed by :data:`COLUMNS`) to ``path``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _format(row.get(c)) for c in COLUMNS})


def _format(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def read_csv(path) -> list[dict]:
    """Read any results CSV (timings, memory): numbers typed, blanks ``None``.

    The one reader of the benchmark's files: every column it writes has one
    type, whichever table it is in.
    """
    rows = []
    with pathlib.Path(path).open(newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for key, text in raw.items():
                if text == "" or text is None:
                    row[key] = None
                elif key in _INT:
                    row[key] = int(text)
                elif key in _FLOAT:
                    row[key] = float(text)
                elif key == "jit":
                    row[key] = text == "True"
                else:
                    row[key] = text
            rows.append(row)
    return rows


def select(rows, **where) -> list[dict]:
    """The rows whose fields equal every keyword, e.g. ``variant="dense_adam"``."""
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def one(rows, **where) -> dict:
    """The single row matching ``where``; an error if there is not exactly one."""
    found = select(rows, **where)
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows match {where}")
    return found[0]


def _plain_log_ticks(axis, ticks=None) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator

    if ticks is not None:
        # Label the ticks far enough apart on the log scale (a factor of 1.8)
        # to keep their labels apart; the others stay as unlabelled ticks.
        labelled = []
        for tick in sorted(ticks):
            if not labelled or tick / labelled[-1] >= 1.8:
                labelled.append(tick)
        axis.set_major_locator(FixedLocator(labelled))
        axis.set_minor_locator(FixedLocator(sorted(set(ticks) - set(labelled))))
    else:
        low, high = sorted(axis.get_view_interval())
        wide = low <= 0 or high / low > 10
        subs = (1.0, 2.0, 5.0) if wide else (1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0)
        axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _name(variant: str) -> str:
    """The label a plot shows for a variant id (:func:`variants.label`)."""
    from evidence.benchmarks.variants import label

    return label(variant)


def _series(rows, variant, jit, density):
    pts = [
        r
        for r in select(rows, variant=variant, jit=jit)
        if r["median_ms"] is not None
        and (r["density"] is None or r["density"] == density)
    ]
    return sorted(pts, key=lambda r: r["n"])


def plot_ratio_vs_n(rows, variants, *, jit=False, density=0.01, ax=None, title=None):
    """Step time / dense step time against n, log-log, with quartile bars."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    for variant in variants:
        pts = _series(rows, variant, jit, density)
        if not pts:
            continue
        n = [r["n"] for r in pts]
        mid = [r["ratio_to_dense"] for r in pts]
        err = [
            [m - r["ratio_q25"] for m, r in zip(mid, pts)],
            [r["ratio_q75"] - m for m, r in zip(mid, pts)],
        ]
        ax.errorbar(n, mid, yerr=err, marker="o", capsize=3, label=_name(variant))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="dense step")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, sorted({r["n"] for r in rows}))
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("n (weight is n x n, batch 64)")
    ax.set_ylabel("step time / dense step time")
    ax.set_title(title or ("XLA" if jit else "tf.function"), fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_ratio_vs_density(rows, variants, *, n, jit=False, crossover=None, ax=None):
    """Step time ratio against mask density at one n, log-log."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.6))
    for variant in variants:
        pts = sorted(
            (
                r
                for r in select(rows, variant=variant, jit=jit, n=n)
                if r["median_ms"] is not None and r["density"] is not None
            ),
            key=lambda r: r["density"],
        )
        if pts:
            ax.plot(
                [r["density"] for r in pts],
                [r["ratio_to_dense"] for r in pts],
                marker="o",
                label=_name(variant),
            )
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="dense step")
    if crossover is not None:
        ax.axvline(crossover, color="grey", linestyle=":", label="automatic switch")
    ax.set_xscale("log")
    ax.set_yscale("log")
    densities = {r["density"] for r in select(rows, jit=jit, n=n)}
    _plain_log_ticks(ax.xaxis, sorted(densities - {None}))
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("density of free entries")
    ax.set_ylabel("step time / dense step time")
    ax.set_title(f"n = {n}, {'XLA' if jit else 'tf.function'}", fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_optimizer_state(rows, *, n, density=0.01, ax=None):
    """Adam's stored values per variant at one n, next to the free values."""
    import matplotlib.pyplot as plt

    picked = [
        r
        for r in select(rows, n=n, jit=False)
        if r["density"] is None or r["density"] == density
    ]
    picked = [r for r in picked if r["optimizer_state_values"] is not None]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.3 * len(picked) + 1))
    names = [_name(r["variant"]) for r in picked]
    y = range(len(picked))
    ax.barh(y, [r["optimizer_state_values"] for r in picked], label="Adam state")
    ax.scatter(
        [2 * r["free_params"] for r in picked],
        y,
        color="black",
        marker="|",
        s=200,
        zorder=3,
        label="2 x free values",
    )
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"values stored by Adam (n = {n}, density {density:g})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def save_plots(rows, outdir, device: str) -> list[pathlib.Path]:
    """Write the overview plots of ``rows`` as PNG files into ``outdir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evidence.benchmarks.variants import GROUPS, SWEPT

    outdir = pathlib.Path(outdir)
    written = []
    sizes = sorted({r["n"] for r in rows})
    jits = sorted({r["jit"] for r in rows})
    fig, axes = plt.subplots(
        len(jits), len(GROUPS), figsize=(5 * len(GROUPS), 3.8 * len(jits))
    )
    for i, jit in enumerate(jits):
        for j, (group, names) in enumerate(GROUPS.items()):
            ax = axes[i][j] if len(jits) > 1 else axes[j]
            title = f"{group}, {'XLA' if jit else 'tf.function'}"
            plot_ratio_vs_n(rows, names, jit=jit, ax=ax, title=title)
    fig.tight_layout()
    written.append(outdir / f"{device}_ratio_vs_n.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(jits), figsize=(5.5 * len(jits), 3.8))
    for i, jit in enumerate(jits):
        ax = axes[i] if len(jits) > 1 else axes
        plot_ratio_vs_density(rows, SWEPT, n=sizes[-1], jit=jit, ax=ax)
    fig.tight_layout()
    written.append(outdir / f"{device}_ratio_vs_density.png")
    fig.savefig(written[-1], dpi=90)
    plt.close(fig)

    ax = plot_optimizer_state(rows, n=sizes[-1])
    ax.figure.tight_layout()
    written.append(outdir / f"{device}_optimizer_state.png")
    ax.figure.savefig(written[-1], dpi=90)
    plt.close(ax.figure)
    return written


# --- scaling, crossover and memory (the extra runs of a full benchmark) ---------


def fit_slope(x, y) -> float:
    """The least-squares slope of ``log y`` against ``log x``.

    >>> round(fit_slope([1, 2, 4], [3, 12, 48]), 6)
    2.0
    """
    import numpy as np

    x, y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    if len(x) < 2:
        raise ValueError(f"A slope needs two points or more. Received: {len(x)}")
    return float(np.polyfit(x, y, 1)[0])


def scaling_series(rows, variant, *, density=None, min_n=1024, column="median_ms"):
    """``(n, column)`` of one variant without XLA, for n >= ``min_n``, sorted."""
    pts = sorted(
        (r["n"], r[column])
        for r in select(rows, variant=variant, jit=False, status="ok")
        if r["n"] >= min_n and (density is None or r["density"] == density)
    )
    return [p[0] for p in pts], [p[1] for p in pts]


def slopes(rows, cases, *, min_n=1024) -> dict:
    """Fitted log-log slopes against n of step time and of the ratio to dense.

    ``cases`` is a list of ``(variant, density)``; the result maps each to
    ``{"time": slope, "ratio": slope, "sizes": [n, ...]}``.
    """
    out = {}
    for variant, density in cases:
        n, ms = scaling_series(rows, variant, density=density, min_n=min_n)
        _, ratio = scaling_series(
            rows, variant, density=density, min_n=min_n, column="ratio_to_dense"
        )
        out[(variant, density)] = {
            "time": fit_slope(n, ms),
            "ratio": fit_slope(n, ratio),
            "sizes": n,
        }
    return out


#: The forms of the scaling plot: (variant, density), and what the chapter
#: says their cost grows as.
SCALING_CASES = (
    ("dense_adam", None),
    ("frozen_product", None),
    ("diag_refimpl", None),
    ("band_refimpl", None),
    ("block_refimpl", None),
    ("partial_sparse", 0.001),
    ("partial_delta", 0.001),
)


def plot_scaling(rows, cases=SCALING_CASES, *, min_n=1024, ax=None):
    """Step time against n without XLA, log-log, with the fitted slopes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    fitted = slopes(rows, cases, min_n=min_n)
    for (variant, density), fit in fitted.items():
        n, ms = scaling_series(rows, variant, density=density, min_n=0)
        label = _name(variant) + ("" if density is None else f" at {density:g}")
        ax.loglog(n, ms, marker="o", label=f"{label}: slope {fit['time']:.2f}")
    ax.set_xscale("log", base=2)
    _plain_log_ticks(ax.xaxis, sorted({r["n"] for r in rows}))
    ax.set_xlabel("n (weight is n x n, batch 64)")
    ax.set_ylabel("ms per training step")
    ax.set_title(f"tf.function; slopes fitted for n >= {min_n}", fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_memory(memory_rows, *, ax=None):
    """Peak memory of one step's temporaries per variant, beside Adam's state."""
    import matplotlib.pyplot as plt

    picked = [r for r in memory_rows if r["status"] == "ok"]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.3 * len(picked) + 1.2))
    names = [
        _name(r["variant"]) + ("" if r["density"] is None else f" at {r['density']:g}")
        for r in picked
    ]
    y = range(len(picked))
    ax.barh(y, [r["step_mb"] for r in picked], label="step temporaries (MiB)")
    ax.scatter(
        [r["optimizer_state_values"] * 4 / 2**20 for r in picked],
        y,
        color="black",
        marker="|",
        s=200,
        zorder=3,
        label="Adam state (MiB)",
    )
    n2 = picked[0]["n2_mb"] if picked else 0
    ax.axvline(n2, color="grey", linestyle=":", label="one n x n float32")
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel(f"MiB (n = {picked[0]['n'] if picked else '?'}, one process each)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def save_extra_plots(rows, extra, outdir, device: str) -> list[pathlib.Path]:
    """The plots of the extra runs: scaling, crossover, hidden layer, memory.

    ``extra`` maps ``"scaling"``, ``"crossover"``, ``"hidden"`` and
    ``"memory"`` to their rows (any may be missing).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = pathlib.Path(outdir)
    written = []
    top = max(r["n"] for r in rows)
    partial = ("partial_sparse", "partial_delta", "partial_select", "partial_auto")
    if "scaling" in extra:
        ax = plot_scaling(rows + extra["scaling"])
        written.append(outdir / f"{device}_scaling.png")
        ax.figure.tight_layout()
        ax.figure.savefig(written[-1], dpi=90)
        plt.close(ax.figure)
    for name in ("crossover", "hidden"):
        if name not in extra:
            continue
        table = extra[name] + (rows if name == "crossover" else [])
        jits = sorted({r["jit"] for r in table})
        fig, axes = plt.subplots(1, len(jits), figsize=(5.5 * len(jits), 3.8))
        for i, jit in enumerate(jits):
            ax = axes[i] if len(jits) > 1 else axes
            plot_ratio_vs_density(table, partial, n=top, jit=jit, ax=ax)
            if name == "hidden":
                ax.set_title(f"hidden layer, {ax.get_title()}", fontsize=10)
        fig.tight_layout()
        written.append(outdir / f"{device}_{name}.png")
        fig.savefig(written[-1], dpi=90)
        plt.close(fig)
    if "memory" in extra:
        ax = plot_memory(extra["memory"])
        ax.figure.tight_layout()
        written.append(outdir / f"{device}_memory.png")
        ax.figure.savefig(written[-1], dpi=90)
        plt.close(ax.figure)
    return written


def plots_from_results(outdir, device: str) -> list[pathlib.Path]:
    """Draw every plot again from the CSVs in ``outdir`` (no measuring)."""
    outdir = pathlib.Path(outdir)
    rows = read_csv(outdir / f"{device}.csv")
    extra = {}
    for name in ("scaling", "crossover", "hidden"):
        path = outdir / f"{device}_{name}.csv"
        if path.exists():
            extra[name] = read_csv(path)
    if (outdir / f"{device}_memory.csv").exists():
        extra["memory"] = read_csv(outdir / f"{device}_memory.csv")
    return save_plots(rows, outdir, device) + save_extra_plots(
        rows, extra, outdir, device
    )
