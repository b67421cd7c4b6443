"""The book's measuring instruments, beside the `refimpl` library.

* :mod:`evidence.registry`: one record per technique;
* :mod:`evidence.exactness`: which frozen entries each technique and optimizer moves;
* :mod:`evidence.distributed`: the same techniques under ``tf.distribute``;
* :mod:`evidence.benchmarks`: timing and memory, with committed results.
"""
