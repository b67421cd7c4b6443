"""Benchmarks: what each way of training only some positions costs.

Run ``python -m evidence.benchmarks.run`` from the repository root. It times
one training step (forward, loss, gradient, Adam update) of every benchmarked
technique of :mod:`evidence.registry` against the dense step of the same run,
and writes ``evidence/benchmarks/results/<device>.csv`` and plots beside it.

* :mod:`evidence.benchmarks.variants` builds the variants: the techniques
  (named by their registry ids), the naive idioms they replace, the baseline;
* :mod:`evidence.benchmarks.timing` times them, interleaved and repeated;
* :mod:`evidence.benchmarks.report` writes, reads and plots the results (the
  book's performance chapter reads the committed CSV with it).
"""
