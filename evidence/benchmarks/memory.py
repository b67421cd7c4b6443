"""Peak resident memory of one training step, one process per variant.

    python -m evidence.benchmarks.memory --n 4096      # every variant, a table
    python -m evidence.benchmarks.memory --one partial_sparse --n 4096 --density 0.01

Each variant runs in a fresh Python process, so that nothing another variant
allocated is counted. The process builds the variant and its Adam optimizer,
traces the step without running it, and reads its resident set (``VmRSS``):
the weights, the optimizer state and the batch. Then it resets the kernel's
high-water mark (``/proc/self/clear_refs``), takes three steps and reads the
new high-water mark (``VmHWM``). The difference is the memory the steps
needed beyond what the variant keeps: its temporaries (and the allocator's
own caches). Linux only; elsewhere the run says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

COLUMNS = (
    "n,batch,variant,density,free_params,optimizer_state_values,"
    "resident_mb,peak_mb,step_mb,n2_mb,status"
).split(",")
_STATUS = pathlib.Path("/proc/self/status")


def _status_mb(field: str) -> float:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MiB
    raise LookupError(field)


def measure_one(name: str, n: int, density: float | None, batch: int = 64) -> dict:
    """Measure variant ``name`` in this process (see the module's description)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    from evidence.benchmarks import variants

    rng = np.random.default_rng(n)
    x = tf.constant(rng.standard_normal((batch, n)).astype("float32"))
    y = tf.constant(rng.standard_normal((batch, n)).astype("float32"))
    variant = variants.build(name, n, rng, density=density)
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)
    optimizer.build(variant.params)
    step = variants.make_step(variant, optimizer, jit=False)
    step.get_concrete_function(x, y)  # traced, not run: no temporaries yet
    resident = _status_mb("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM
    for _ in range(3):
        step(x, y).numpy()
    peak = _status_mb("VmHWM")
    return {
        "n": n,
        "batch": batch,
        "variant": name,
        "density": density,
        "free_params": variant.free_params,
        "optimizer_state_values": variants.optimizer_state_values(optimizer),
        "resident_mb": round(resident, 1),
        "peak_mb": round(peak, 1),
        "step_mb": round(peak - resident, 1),
        "n2_mb": round(n * n * 4 / 2**20, 1),
        "status": "ok",
    }


def _in_subprocess(name: str, n: int, density: float | None) -> dict:
    command = [sys.executable, "-m", "evidence.benchmarks.memory", "--one", name]
    command += ["--n", str(n)]
    if density is not None:
        command += ["--density", repr(density)]
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(command, capture_output=True, text=True, cwd=root)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        row = dict.fromkeys(COLUMNS)
        row.update(n=n, variant=name, density=density, status=f"failed: {last}")
        return row
    return json.loads(lines[-1])


def measure_all(n: int, densities, *, names=None, workers: int = 2, verbose=False):
    """One row per (variant, density) of the main run at ``n``, each measured apart.

    ``workers`` processes run at once (memory is per process; only the time
    is shared).
    """
    from evidence.benchmarks import variants

    if not _STATUS.exists():
        raise RuntimeError("The memory run reads /proc/self/status: Linux only")
    todo = list(variants.cases(names or variants.ALL, densities))
    with ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(lambda case: _in_subprocess(case[0], n, case[1]), todo))
    if verbose:
        for row in rows:
            print(f"    {row['variant']} {row['density'] or ''}: {row['step_mb']} MiB")
    return rows


def write_csv(rows, path) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row.get(c) is None else row[c] for c in COLUMNS})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evidence.benchmarks.memory")
    p.add_argument("--one", help="measure this variant in this process")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--density", type=float)
    p.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01, 0.1])
    p.add_argument("--out", type=pathlib.Path, help="write the table here")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.n, args.density)))
        return 0
    rows = measure_all(args.n, args.densities)
    if args.out:
        write_csv(rows, args.out)
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
