"""Benchmarks: what each way of training only some positions costs.

Run ``python -m evidence.benchmarks.run`` (or ``make bench``) from the repository root.
It times one training step (forward, loss, gradient, Adam update) of every
technique against the dense step of the same run, and writes
``benchmarks/results/<device>.csv`` and plots beside it.

* :mod:`benchmarks.variants` builds the techniques from ``refimpl``;
* :mod:`benchmarks.timing` times them, interleaved and repeated;
* :mod:`benchmarks.report` writes, reads and plots the results (the book's
  performance chapter reads the committed CSV with it).
"""
