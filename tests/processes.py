"""Run Python in a fresh process, for what one process cannot show.

A fresh process has made none of refimpl's classes yet, so it shows that a
file loads by its registered names alone; :data:`WITHOUT_REFIMPL` makes it a
process where ``refimpl`` cannot even be imported, as on a serving machine.
"""

import subprocess
import sys
import textwrap

#: A prelude that makes every import of refimpl fail in the process.
WITHOUT_REFIMPL = """
import builtins
real = builtins.__import__
def refuse(name, *args, **kwargs):
    if name.split(".")[0] == "refimpl":
        raise ImportError("refimpl is not installed here")
    return real(name, *args, **kwargs)
builtins.__import__ = refuse
"""


def run_python(code: str, *args) -> str:
    """Run ``code`` with ``args`` in a fresh interpreter; return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
