"""Serving many sparse adapters on one base: a mixed batch in one pass.

    python -m evidence.benchmarks.adapters  # results/real/cpu_adapters.csv
    python -m evidence.benchmarks.adapters --quick

The model is the real-model benchmark's plain-Keras transformer
(:func:`evidence.benchmarks.real_models.build`, width 512, 4 blocks, 128
tokens), TensorFlow. Eight adapters, each 1 % random entries of every kernel
(a mask of its own per adapter), are made the way a user makes them:
``refimpl.partialize`` of the pretrained model, the free entries moved (by
random values, as training would move them), ``save_partial_weights`` to a
file; then ``refimpl.adapters.load`` attaches the eight files to one model.

``rows`` rows are served, ``batch_size`` at a time, each row with its own
adapter: a ninth of them with the base (``None``), the rest spread evenly
over the eight adapters, in a shuffled order. Timed in interleaved rounds
(:mod:`.timing`), the same rows each time:

* ``base``: the pretrained model alone, a plain copy never converted, with
  ``model.predict``;
* ``base (use None)``: the model holding the adapters, with
  ``adapters.use(model, None)`` and ``model.predict``;
* ``mixed``: ``adapters.predict(model, x, adapters=[name per row])``, the
  whole mixed batch at once;
* ``mixed (all base)``: ``adapters.predict`` with ``None`` for every row: its
  passes without any correction, so that ``mixed`` less this is what the
  adapters' corrections cost;
* ``mixed (one adapter)``: ``adapters.predict`` with one adapter for every
  row: as many corrected rows as ``mixed``, in one slice per batch;
* ``switching``: ``adapters.use`` per adapter, then ``model.predict`` of that
  adapter's rows, group after group (the rows put back in order).

Each row of ``results/real/cpu_adapters.csv`` gives the median seconds of
one serving, its rows per second, and its throughput as a ratio to
``base``'s within each round (median and quartiles). The target:
``mixed`` at least 0.8x ``base``, printed at the end.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

RESULTS = pathlib.Path(__file__).parent / "results" / "real"
#: The servings timed, in the CSV's order.
SERVINGS = (
    "base",
    "base (use None)",
    "mixed",
    "mixed (all base)",
    "mixed (one adapter)",
    "switching",
)
ADAPTERS = 8
DENSITY = 0.01


def _sizes(quick: bool) -> dict:
    from evidence.benchmarks import real_models

    sizes = real_models._sizes(quick)
    if quick:
        return dict(sizes, rows=18, batch_size=6)
    return dict(sizes, rows=72, batch_size=24)


def _masks(keras, model, seed: int) -> dict:
    """1 % random entries of every kernel of ``model``, drawn from ``seed``."""
    from evidence.benchmarks import real_models
    from refimpl import selection

    return {
        layer.path: selection.random_mask(
            tuple(layer.kernel.shape), fraction=DENSITY, seed=seed * 1000 + i
        )
        for i, layer in enumerate(real_models._kernel_layers(keras, model))
    }


def make_adapter(keras, np, sizes, seed: int, path) -> None:
    """Write the trained-entries file of one adapter: the pretrained model
    partialized with its own 1 % masks, its free entries moved by random
    values (about a tenth of the kernels' own spread), saved to ``path``."""
    import refimpl
    from refimpl.partial import partial_weights

    pretrained = _pretrained(keras, sizes)
    model = refimpl.partialize(pretrained, _masks(keras, pretrained, seed))
    rng = np.random.default_rng(seed)
    for pw in partial_weights(model):
        free = keras.ops.convert_to_numpy(pw.free)
        spread = float(np.std(keras.ops.convert_to_numpy(pw.base))) or 1.0
        move = rng.normal(scale=0.1 * spread, size=free.shape)
        pw.free.assign((free + move).astype(free.dtype))
    refimpl.save_partial_weights(model, path)


def _pretrained(keras, sizes):
    from evidence.benchmarks import real_models

    return real_models.build(keras, sizes)


def _assignment(np, rows: int) -> list:
    """The adapter of each row: a ninth the base, the rest spread over the
    eight adapters, shuffled."""
    names = [None] + [f"task{i}" for i in range(ADAPTERS)]
    assigned = [names[i % len(names)] for i in range(rows)]
    order = np.random.default_rng(0).permutation(rows)
    return [assigned[i] for i in order]


def servings(keras, np, sizes, folder) -> tuple[dict, object, list]:
    """The serving functions of :data:`SERVINGS`, each of ``(x, _)``, and the
    batch and the adapter of each row."""
    from refimpl import adapters

    for i in range(ADAPTERS):
        make_adapter(keras, np, sizes, i + 1, pathlib.Path(folder) / f"task{i}.npz")
    plain = _pretrained(keras, sizes)
    model = _pretrained(keras, sizes)
    for i in range(ADAPTERS):
        adapters.load(model, str(pathlib.Path(folder) / f"task{i}.npz"), f"task{i}")
    rng = np.random.default_rng(1)
    x = rng.integers(0, sizes["vocab"], (sizes["rows"], sizes["tokens"]))
    x = x.astype("int32")
    per_row = _assignment(np, sizes["rows"])
    batch_size = sizes["batch_size"]
    groups = {}
    for row, name in enumerate(per_row):
        groups.setdefault(name, []).append(row)
    groups = {name: np.asarray(rows) for name, rows in groups.items()}

    def base(x, _):
        return plain.predict(x, batch_size=batch_size, verbose=0)

    def base_use_none(x, _):
        adapters.use(model, None)
        return model.predict(x, batch_size=batch_size, verbose=0)

    def mixed(x, _):
        return adapters.predict(model, x, adapters=per_row, batch_size=batch_size)

    def mixed_all_base(x, _):
        names = [None] * len(per_row)
        return adapters.predict(model, x, adapters=names, batch_size=batch_size)

    def mixed_one_adapter(x, _):
        names = ["task0"] * len(per_row)
        return adapters.predict(model, x, adapters=names, batch_size=batch_size)

    def switching(x, _):
        out = None
        for name, rows in groups.items():
            adapters.use(model, name)
            part = model.predict(x[rows], batch_size=batch_size, verbose=0)
            if out is None:
                out = np.empty((len(x),) + part.shape[1:], part.dtype)
            out[rows] = part
        return out

    functions = {
        "base": base,
        "base (use None)": base_use_none,
        "mixed": mixed,
        "mixed (all base)": mixed_all_base,
        "mixed (one adapter)": mixed_one_adapter,
        "switching": switching,
    }
    return functions, x, per_row


class _Done:
    """What :mod:`.timing` waits on: a NumPy result is ready already."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def run(quick: bool, repeats: int) -> list[dict]:
    """The rows of ``cpu_adapters.csv`` (see the module's description)."""
    from evidence.benchmarks import real_models
    from evidence.benchmarks import timing as timer

    keras, np, _ = real_models._setup_tf()
    sizes = _sizes(quick)
    with tempfile.TemporaryDirectory() as folder:
        functions, x, _ = servings(keras, np, sizes, folder)
        calls = {
            name: (lambda f: lambda x, y: _Done(f(x, y)))(function)
            for name, function in functions.items()
        }
        counts = {
            name: timer.warm_up(call, x, None, target_s=0.2 if quick else 1.0)
            for name, call in calls.items()
        }
        samples = timer.interleaved(calls, x, None, counts, repeats=repeats)
    rows = []
    for name in SERVINGS:
        # throughput ratio: the base's seconds over this serving's, per round
        to_base = timer.summarise(samples["base"], samples[name])
        seconds = float(np.median(samples[name]))
        rows.append(
            {
                "serving": name,
                "rows": sizes["rows"],
                "batch_size": sizes["batch_size"],
                "adapters": ADAPTERS,
                "density": DENSITY,
                "seconds": round(seconds, 4),
                "rows_per_s": round(sizes["rows"] / seconds, 2),
                "vs_base": round(to_base["ratio_to_dense"], 3),
                "vs_base_q25": round(to_base["ratio_q25"], 3),
                "vs_base_q75": round(to_base["ratio_q75"], 3),
            }
        )
    return rows


def target(rows) -> str:
    """The target: a mixed batch at least 0.8x the base's throughput."""
    ratio = {row["serving"]: row["vs_base"] for row in rows}["mixed"]
    met = "met" if ratio >= 0.8 else "missed"
    return f"mixed: {ratio:.3f}x the base's throughput (target >= 0.8: {met})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = run(args.quick, args.repeats)
    tag = "cpu_quick" if args.quick else "cpu"
    from evidence.benchmarks import real_models

    real_models._write(rows, args.out / f"{tag}_adapters.csv")
    print(target(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
