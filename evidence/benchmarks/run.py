"""Time one training step of every technique against the dense step.

    python -m evidence.benchmarks.run          # full run: CSV and plots in results/
    python -m evidence.benchmarks.run --quick  # seconds: a smoke test of it all
    python -m evidence.benchmarks.run --sizes 256 1024 4096 16384  # larger n, on a GPU

The results folder is ``evidence/benchmarks/results``. The variants are the
benchmarked techniques of ``evidence.registry`` (named by their ids), the
naive idioms they replace and the dense baseline (``dense_adam``).

The step is forward (``y = x @ W``), mean squared error, gradient and an Adam
update, inside ``tf.function`` and again with ``jit_compile=True``, for a batch
of 64 and a weight of n x n. For every size and setting, all variants are
built, warmed up, then timed in interleaved rounds; ratios are taken against
the dense step of the same round. A variant that cannot run (XLA cannot
compile it, say) gets a row that says why, with blank timings. One timing
sample lasts at least 1 s at the largest n (0.2 s below it), and there are 7
rounds.

Besides ``<device>.csv`` (the layer as a first layer: no input gradient), a
full run writes, at the largest n unless said otherwise:

* ``<device>_hidden.csv``: the same step for a hidden layer (the input's
  gradient is computed too), with and without XLA;
* ``<device>_crossover.csv``: more densities around the switches of the
  automatic choice, with and without XLA;
* ``<device>_scaling.csv``: the forms whose cost should fall with n, at
  :data:`SCALING_SIZES` (beyond the main sizes), without XLA;
* ``<device>_bandwidth.csv``: the band's width;
* ``<device>_memory.csv``: the peak resident memory of one training step
  per variant, each in its own process (:mod:`evidence.benchmarks.memory`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import multiprocessing
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from evidence.benchmarks import memory, report, timing, variants  # noqa: E402
from evidence.benchmarks.variants import cases  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
BATCH = 64
# Second, smaller sweeps at the largest n (tf.function only): the band's width,
# and the densities around the switch from a sparse delta to a select.
BAND_SWEEP = (3, 9, 33, 129)
CROSSOVER_SWEEP = (0.003, 0.005, 0.03, 0.15, 0.2, 0.3)
#: The partial forms whose choice the crossover sweep and the hidden layer test.
PARTIAL = ("partial_sparse", "partial_delta", "partial_select", "partial_auto")
#: The hidden-layer run: the floor, the partial forms and the structured ones.
HIDDEN = (variants.FLOOR, *PARTIAL, "diag_refimpl", "band_refimpl", "block_refimpl")
#: Sizes beyond the main run for the scaling plot, and what is timed there.
SCALING_SIZES = (8192,)
SCALING = (variants.FLOOR, "diag_refimpl", "band_refimpl", "block_refimpl")
SCALING_PARTIAL = (("partial_sparse", 0.001), ("partial_delta", 0.001))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m evidence.benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small n, few repeats")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS, help="output folder")
    p.add_argument("--sizes", type=int, nargs="+", help="values of n")
    p.add_argument(
        "--jit-sizes", type=int, nargs="*", help="values of n timed under XLA too"
    )
    p.add_argument("--densities", type=float, nargs="+", help="mask densities")
    p.add_argument("--repeats", type=int, help="interleaved rounds")
    p.add_argument(
        "--target-ms",
        type=float,
        help="length of one timing sample at the largest n (below it: a fifth)",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=variants.ALL,
        metavar="VARIANT",
        help=f"a subset of: {', '.join(variants.ALL)}",
    )
    p.add_argument("--no-plots", action="store_true", help="write the CSV only")
    p.add_argument(
        "--sweeps",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also sweep band widths and densities near the switch, at the largest n",
    )
    p.add_argument(
        "--extras",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also the hidden-layer, scaling and memory runs",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="time each warm-up")
    args = p.parse_args(argv)
    quick = args.quick
    args.sizes = args.sizes or ([64] if quick else [256, 1024, 4096])
    args.jit_sizes = args.sizes if args.jit_sizes is None else args.jit_sizes
    args.densities = args.densities or (
        [0.01, 0.5] if quick else list(variants.DENSITIES)
    )
    args.repeats = args.repeats or (3 if quick else 7)
    args.target_ms = args.target_ms or (2.0 if quick else 1000.0)
    args.variants = args.variants or list(variants.ALL)
    if variants.BASELINE not in args.variants:
        args.variants.insert(0, variants.BASELINE)
    if args.sweeps is None:
        args.sweeps = not quick
    if args.extras is None:
        args.extras = not quick
    return args


def measure(
    case_list,
    n,
    jit,
    args,
    common,
    *,
    bandwidth=variants.BANDWIDTH,
    hidden=False,
    target_ms=None,
):
    """Build, warm up and time the cases at one n and jit setting; return rows."""
    target_ms = target_ms or args.target_ms
    rng = np.random.default_rng(args.seed + n)
    x = tf.constant(rng.standard_normal((BATCH, n)).astype("float32"))
    y = tf.constant(rng.standard_normal((BATCH, n)).astype("float32"))
    rows, steps, counts = [], {}, {}
    built = []
    for key, (name, density, bw) in enumerate(case_list):
        t0 = time.perf_counter()
        row = dict.fromkeys(report.COLUMNS)
        row.update(common, jit=jit, n=n, variant=name, density=density)
        row.update(batch=BATCH, repeats=args.repeats)
        rows.append(row)
        try:
            variant = variants.build(
                name, n, rng, density=density, bandwidth=bw or bandwidth
            )
        except variants.Unavailable as e:
            row["status"] = f"unavailable: {e}"
            continue
        row.update(free_params=variant.free_params, mode=variant.mode)
        row["bandwidth"] = variant.bandwidth
        optimizer = keras.optimizers.Adam(learning_rate=1e-3)
        optimizer.build(variant.params)
        row["optimizer_state_values"] = variants.optimizer_state_values(optimizer)
        step = variants.make_step(variant, optimizer, jit=jit, hidden=hidden)
        try:
            counts[key] = timing.warm_up(step, x, y, target_s=target_ms / 1e3)
        except Exception as e:  # noqa: BLE001 - any failure is a finding
            row["status"] = timing.short_error(e)
            continue
        row.update(status="ok", steps=counts[key])
        steps[key] = step
        built.append((variant, optimizer))
        if args.verbose:
            took = time.perf_counter() - t0
            print(f"    {name} {density or ''}: built and warmed up in {took:.1f} s")
    times = timing.interleaved(steps, x, y, counts, repeats=args.repeats, seed=n)
    baseline = times[0]  # the dense baseline comes first
    for key, samples in times.items():
        rows[key].update(timing.summarise(samples, baseline))
    del built, steps
    gc.collect()
    return rows


def isolated(case_list, n, jit, args, common, **kwargs):
    """:func:`measure` in a fresh process (except for ``--quick``).

    TensorFlow keeps memory from every variant a process has built and
    compiled; over a full run that grows past the machine's memory. A
    process per size and setting returns it all.
    """
    if args.quick:
        return measure(case_list, n, jit, args, common, **kwargs)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(measure, case_list, n, jit, args, common, **kwargs).result()


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # one tf.function per variant is intended
    device, machine = report.machine_description()
    common = {"device": device, "tf_version": tf.__version__, "machine": machine}
    suffix = "-quick" if args.quick else ""
    out_csv = args.out / f"{device}{suffix}.csv"
    case_list = [(v, d, None) for v, d in cases(args.variants, args.densities)]
    print(f"{machine}, TensorFlow {tf.__version__}: {len(case_list)} variants")
    start = time.perf_counter()
    rows = []
    top = max(args.sizes)

    def target(n):
        return args.target_ms if n >= top else args.target_ms / 5

    for jit in (False, True):
        for n in args.jit_sizes if jit else args.sizes:
            rows += isolated(case_list, n, jit, args, common, target_ms=target(n))
            done = time.perf_counter() - start
            print(f"  jit={jit!s:5} n={n:5}: done at {done:6.1f} s", flush=True)
    report.write_csv(rows, out_csv)
    written = [out_csv]
    extra = {}
    if args.extras:
        densities = [d for d in args.densities if d < 0.5]
        hidden = [(v, d, None) for v, d in cases(HIDDEN, densities)]
        extra["hidden"] = [
            row
            for jit in (False, True)
            for row in isolated(
                [(variants.BASELINE, None, None), *hidden],
                top,
                jit,
                args,
                common,
                hidden=True,
            )
        ]
        scaling = [(v, None, None) for v in SCALING]
        scaling += [(v, d, None) for v, d in SCALING_PARTIAL]
        extra["scaling"] = [
            row
            for n in SCALING_SIZES
            for row in isolated(
                [(variants.BASELINE, None, None), *scaling], n, False, args, common
            )
        ]
        for name in ("hidden", "scaling"):
            written.append(args.out / f"{device}{suffix}_{name}.csv")
            report.write_csv(extra[name], written[-1])
            print(f"  {name}: done at {time.perf_counter() - start:6.1f} s")
    if args.sweeps:
        n = top
        widths = [b for b in BAND_SWEEP if b // 2 < n]
        band = [(v, None, b) for b in widths for v in ("band_naive", "band_refimpl")]
        cross = [(v, d, None) for v, d in cases(PARTIAL, CROSSOVER_SWEEP)]
        for name, sweep, jits in (
            ("bandwidth", band, (False,)),
            ("crossover", cross, (False, True)),
        ):
            sweep_rows = [
                row
                for jit in jits
                for row in isolated(
                    [(variants.BASELINE, None, None), *sweep], n, jit, args, common
                )
            ]
            extra[name] = sweep_rows
            written.append(args.out / f"{device}{suffix}_{name}.csv")
            report.write_csv(sweep_rows, written[-1])
            print(
                f"  {name} sweep at n={n}: done at {time.perf_counter() - start:6.1f} s"
            )
    if args.extras:
        memory_rows = memory.measure_all(
            top, args.densities, names=args.variants, verbose=args.verbose
        )
        written.append(args.out / f"{device}{suffix}_memory.csv")
        memory.write_csv(memory_rows, written[-1])
        extra["memory"] = memory_rows
        print(f"  memory: done at {time.perf_counter() - start:6.1f} s")
    if not args.no_plots:
        written += report.save_plots(rows, args.out, device + suffix)
        written += report.save_extra_plots(rows, extra, args.out, device + suffix)
    print(f"wrote in {time.perf_counter() - start:.0f} s:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
