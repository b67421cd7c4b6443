"""Time training steps: interleaved, repeated, summarised by medians.

All variants of one size and one ``jit_compile`` setting are timed in the same
rounds: each round times every variant once, in a shuffled order, so a slow
moment of the machine hits all of them alike. A ratio to the dense step is
taken within each round, and its median and quartiles are reported.
"""

from __future__ import annotations

import gc
import math
import re
import time

import numpy as np


def short_error(error: BaseException) -> str:
    """A one-line reason why a variant could not run (no addresses, no paths)."""
    text = str(error)
    op = re.search(r"on XLA_\w+_JIT: (\w+)", text)
    if op:
        return f"xla_unsupported: {op.group(1)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return f"{type(error).__name__}: {last[:160]}"


def warm_up(step, x, y, *, target_s: float, max_steps: int = 1000) -> int:
    """Compile ``step``, run it a little, and return steps per timing sample.

    The number of steps is chosen so that one sample lasts about ``target_s``.
    """
    step(x, y).numpy()  # traces (and compiles, under XLA)
    step(x, y).numpy()
    start = time.perf_counter()
    step(x, y).numpy()
    once = max(time.perf_counter() - start, 1e-6)
    return int(min(max_steps, max(1, math.ceil(target_s / once))))


def sample(step, x, y, steps: int) -> float:
    """Seconds per step, averaged over ``steps`` consecutive steps."""
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(x, y)
    loss.numpy()  # waits for the last step on an asynchronous device
    return (time.perf_counter() - start) / steps


def interleaved(steps: dict, x, y, counts: dict, *, repeats: int, seed: int = 0):
    """Time every step function in ``steps`` ``repeats`` times, interleaved.

    Args:
        steps: variant key -> compiled step function.
        x, y: the batch and its targets.
        counts: variant key -> steps per sample (from :func:`warm_up`).
        repeats: the number of rounds.
        seed: the seed of the shuffled order.

    Returns:
        Variant key -> NumPy array of ``repeats`` seconds-per-step samples.
    """
    rng = np.random.default_rng(seed)
    keys = list(steps)
    times = {key: [] for key in keys}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for i in rng.permutation(len(keys)):
                key = keys[i]
                times[key].append(sample(steps[key], x, y, counts[key]))
            gc.collect()
    finally:
        if enabled:
            gc.enable()
    return {key: np.asarray(v) for key, v in times.items()}


def summarise(samples: np.ndarray, baseline: np.ndarray) -> dict:
    """Median and quartiles in ms, and of the per-round ratio to ``baseline``."""
    ms = samples * 1e3
    ratio = samples / baseline
    q = np.percentile
    return {
        "median_ms": float(np.median(ms)),
        "q25_ms": float(q(ms, 25)),
        "q75_ms": float(q(ms, 75)),
        "ratio_to_dense": float(np.median(ratio)),
        "ratio_q25": float(q(ratio, 25)),
        "ratio_q75": float(q(ratio, 75)),
    }
