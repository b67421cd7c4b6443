"""Train the exact techniques under a ``tf.distribute`` strategy, on many processes.

The book's distributed chapter and ``tests/test_distributed.py`` use this
module twice:

* in-process, :func:`train` runs one technique under any strategy (the default
  one-device strategy, or a ``MirroredStrategy`` over logical devices), so the
  multi-device result can be compared with single-device training;
* as a script, ``python -m evidence.distributed OUT_DIR`` is one worker
  of a ``MultiWorkerMirroredStrategy``: it reads its place in the cluster from
  ``TF_CONFIG``, trains every technique and writes ``worker<i>.npz`` into
  ``OUT_DIR``. :func:`launch` starts such a cluster on the loopback address,
  waits for it with a hard timeout and always stops it.

Every technique trains the same ``[4, 4]`` kernel on the same full batch.
Replica ``r`` of ``n`` takes the rows ``r, r + n, ...`` of the batch and
divides its loss by the *global* batch size, so the gradients that the
optimizer sums over the replicas are those of one device.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import refimpl
from evidence import _cases, registry

#: The techniques :func:`train` knows: every exact technique of the registry
#: that has a setup. Each trains with a custom loop around ``strategy.run``.
TECHNIQUES: tuple[registry.Technique, ...] = tuple(
    t for t in registry.TECHNIQUES if t.distributed
)
#: Those that also train with ``model.fit``.
FIT: tuple[registry.Technique, ...] = tuple(t for t in TECHNIQUES if t.fit)
#: ``refimpl.partialize`` of a plain ``Dense`` model, trained with ``model.fit``
#: as a user trains a converted model (:func:`train_partialized`); saved
#: under ``"partialize_fit"``.
PARTIALIZE = registry.get("partialize")
STEPS = 20
_ROWS = 32


def problem(technique="partial_delta") -> dict[str, np.ndarray]:
    """Return the data, the starting kernel and the mask of ``technique``.

    Every technique trains the same data. A technique that takes any mask, or
    a band, frees the diagonal and the one above it; one that takes only the
    diagonal (``diagonal_dense``) frees the diagonal; the slices form
    (``partial_slices``) frees whole rows. A structured layer holds
    only its free values, so its frozen entries start at zero.

    >>> sorted(problem())
    ['initial', 'mask', 'x', 'y']
    >>> int(problem("diagonal_dense")["mask"].sum())
    4
    """
    technique = registry.get(technique)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(_ROWS, 4)).astype("float32")
    initial = rng.normal(size=(4, 4)).astype("float32")
    y = x @ rng.normal(size=(4, 4)).astype("float32")
    mask = np.eye(4, dtype=bool)
    if technique.mask != "diagonal":
        mask |= np.eye(4, k=1, dtype=bool)
    if technique.mask == "rows":
        mask = _cases.rows_mask(4)
    if technique.mask != "any":
        initial = np.where(mask, initial, np.float32(0.0))
    return {"x": x, "y": y, "initial": initial, "mask": mask}


def _optimizer():
    # AdamW: its weight decay moves every entry it sees, so only an exact
    # technique keeps the frozen entries.
    return keras.optimizers.AdamW(learning_rate=0.05, weight_decay=0.1)


def _replica_batch(x, y):
    """This replica's rows of the global batch: r, r + n, r + 2n, ..."""
    context = tf.distribute.get_replica_context()
    step = context.num_replicas_in_sync
    rows = tf.range(context.replica_id_in_sync_group, _ROWS, step)
    return tf.gather(x, rows), tf.gather(y, rows)


def _custom_loop(technique, strategy, data, steps):
    # The technique's setup is the one of the exactness matrix.
    with strategy.scope():
        variables, output, kernel, apply = technique.setup(
            data["initial"], data["mask"], "float32"
        )
        optimizer = _optimizer()
        optimizer.build(variables)  # slots are variables: create them in scope

    def replica_step():
        x, y = _replica_batch(data["x"], data["y"])
        with tf.GradientTape() as tape:
            # Divide by the global batch size: the optimizer sums replicas.
            loss = tf.reduce_sum((output(x) - y) ** 2) / _ROWS
        grads = tape.gradient(loss, variables)
        if apply is None:  # Keras applies a constraint after the update
            optimizer.apply_gradients(zip(grads, variables))
        else:  # apply_masked_gradients(..., restore_frozen=True)
            apply(optimizer, grads)

    @tf.function
    def step():
        strategy.run(replica_step)

    for _ in range(steps):
        step()
    return kernel


def _fit(technique, strategy, data, steps):
    # A one-layer model; a masked technique wraps the optimizer in a
    # refimpl.MaskedOptimizer.
    with strategy.scope():
        layer, wrap = technique.fit(data["initial"], data["mask"])
        model = keras.Sequential([keras.Input((4,)), layer])
        model.compile(optimizer=wrap(_optimizer()), loss="mse")
    return _fit_model(model, layer, data, steps)


def _partialized(strategy, data, steps):
    # Built, converted and compiled in the scope, as for any Keras model.
    with strategy.scope():
        start = keras.initializers.Constant(data["initial"])
        dense = keras.layers.Dense(4, use_bias=False, kernel_initializer=start)
        plain = keras.Sequential([keras.Input((4,)), dense])
        model = refimpl.partialize(plain, {dense.name: data["mask"]})
        model.compile(optimizer=_optimizer(), loss="mse")
    return _fit_model(model, model.layers[-1], data, steps)


def _fit_model(model, layer, data, steps):
    dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"]))
    model.fit(
        dataset.batch(_ROWS).repeat(), steps_per_epoch=steps, shuffle=False, verbose=0
    )
    return lambda: layer.kernel


def train(technique, strategy, *, fit: bool = False, steps: int = STEPS):
    """Train ``technique`` under ``strategy``; return the final dense kernel.

    Args:
        technique: the id of a technique of :data:`TECHNIQUES` (or of
            :data:`FIT` with ``fit=True``), or its registry record.
        strategy: a ``tf.distribute.Strategy``; ``tf.distribute.get_strategy()``
            for one device.
        fit: train with ``model.fit`` instead of a custom loop.
        steps: full-batch AdamW steps.

    Returns:
        The kernel after training as every local replica sees it, read from
        its own copies of the variables: a NumPy array ``[replicas, 4, 4]``.
    """
    known = FIT if fit else TECHNIQUES
    try:
        record = registry.get(technique)
    except ValueError:
        record = None
    if record not in known:
        raise ValueError(
            f"`technique` must be one of {[t.id for t in known]}"
            f"{' (with fit=True)' if fit else ''}. Received: technique={technique!r}"
        )
    run = _fit if fit else _custom_loop
    return _local(strategy, run(record, strategy, problem(record), steps))


def free_ports(count: int) -> list[int]:
    """Ask the OS for ``count`` free TCP ports on the loopback address.

    >>> len(free_ports(2))
    2
    """
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(ports: list[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster on 127.0.0.1.

    >>> json.loads(tf_config([5000, 5001], 1))["task"]
    {'type': 'worker', 'index': 1}
    """
    workers = [f"127.0.0.1:{port}" for port in ports]
    task = {"type": "worker", "index": index}
    return json.dumps({"cluster": {"worker": workers}, "task": task})


def launch(out_dir: str, *, workers: int = 2, timeout: float = 120) -> list[dict]:
    """Run a ``MultiWorkerMirroredStrategy`` cluster of local processes.

    Starts ``workers`` processes of this module on 127.0.0.1, waits at most
    ``timeout`` seconds in all, and kills any that are left (also when
    waiting fails). Raises ``RuntimeError`` with a worker's log if one fails
    or times out.

    Returns:
        One dict per worker: technique id -> per-replica kernels, and
        ``"<id>_fit"`` -> the same from ``model.fit`` (or, under
        ``"<id>_fit_error"``, its error: see :func:`main`).
    """
    ports = free_ports(workers)
    deadline = time.monotonic() + timeout
    procs = []
    try:
        for index in range(workers):
            env = {**os.environ, "TF_CONFIG": tf_config(ports, index)}
            env["CUDA_VISIBLE_DEVICES"] = "-1"  # one CPU replica per worker
            env["no_proxy"] = env["no_grpc_proxy"] = "127.0.0.1"  # never a proxy
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            log = tempfile.TemporaryFile()
            cmd = [sys.executable, "-m", "evidence.distributed", out_dir]
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log))
        for index, (proc, log) in enumerate(procs):
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-3000:]
                status = "timed out" if code is None else f"exit status {code}"
                raise RuntimeError(f"worker {index} failed ({status}):\n{tail}")
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    results = []
    for index in range(workers):
        with np.load(os.path.join(out_dir, f"worker{index}.npz")) as saved:
            results.append({name: saved[name] for name in saved.files})
    return results


def train_partialized(strategy, *, steps: int = STEPS):
    """``refimpl.partialize`` a plain ``Dense`` model and ``fit`` it under ``strategy``.

    The problem, the mask and the optimizer are those of :func:`train`'s
    ``"partialize"`` technique; the result has the same form.
    """
    kernel = _partialized(strategy, problem(PARTIALIZE), steps)
    return _local(strategy, kernel)


def _local(strategy, kernel):
    per_replica = strategy.run(tf.function(lambda: tf.identity(kernel())))
    local = strategy.experimental_local_results(per_replica)
    return np.stack([keras.ops.convert_to_numpy(k) for k in local])


def _train_all(strategy) -> dict:
    """Every technique with a custom loop, and with ``model.fit`` where it has one.

    Keys are technique ids, and ``"<id>_fit"`` for ``model.fit``. Where
    ``model.fit`` fails, the error's type and first line are kept under
    ``"<id>_fit_error"`` instead of the kernels.
    """
    results = {t.id: train(t, strategy) for t in TECHNIQUES}
    fits = {f"{t.id}_fit": lambda t=t: train(t, strategy, fit=True) for t in FIT}
    fits["partialize_fit"] = lambda: train_partialized(strategy)
    for key, run in fits.items():
        try:
            results[key] = run()
        except Exception as err:  # noqa: BLE001 - reported, not hidden
            first_line = (str(err).splitlines() or [""])[0]
            results[f"{key}_error"] = f"{type(err).__name__}: {first_line}"
    return results


def main(argv: list[str]) -> int:
    """Train every technique under a strategy and save the kernels.

    ``OUT_DIR`` alone: one worker of the ``TF_CONFIG`` cluster, which writes
    ``worker<index>.npz``. ``--mirrored OUT_DIR``: a ``MirroredStrategy`` over
    two logical CPUs of this process, plus the one-device reference (keys
    prefixed ``single_``), written to ``mirrored.npz``.
    """
    if argv[0] == "--mirrored":
        out_dir = argv[1]
        tf.config.set_visible_devices([], "GPU")
        cpu = tf.config.list_physical_devices("CPU")[0]
        halves = [tf.config.LogicalDeviceConfiguration()] * 2
        tf.config.set_logical_device_configuration(cpu, halves)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        results = _train_all(strategy)
        single = _train_all(tf.distribute.get_strategy())
        results.update({f"single_{name}": value for name, value in single.items()})
        file_name = "mirrored.npz"
    else:
        out_dir = argv[0]
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        results = _train_all(strategy)
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        file_name = f"worker{index}.npz"
    np.savez(os.path.join(out_dir, file_name), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
