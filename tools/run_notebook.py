"""Run a chapter's code cells in order, in one namespace, without Jupyter.

For a machine that has the book's runtime but not its Jupyter stack (the JAX
path of scripts/gpu_check.sh): every claim of a chapter is an assertion in a
cell, so running the cells checks them; outputs are printed, not compared
(nbval compares them in `make test`). A cell whose source contains a
``--skip`` string is skipped and named.

    python tools/run_notebook.py chapters/08_backends.ipynb [--skip TEXT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--skip", action="append", default=[], metavar="TEXT")
    args = parser.parse_args(argv)
    with open(args.notebook, encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    os.chdir(os.path.dirname(os.path.abspath(args.notebook)))
    namespace: dict = {"__name__": "__main__"}
    for number, cell in enumerate(cells, 1):
        source = "".join(cell["source"])
        if any(text in source for text in args.skip):
            print(f"--- code cell {number}: skipped ({source.splitlines()[0]})")
            continue
        print(f"--- code cell {number}")
        lines = [line for line in source.splitlines() if not line.startswith("%")]
        exec(
            compile("\n".join(lines), f"{args.notebook}:cell{number}", "exec"),
            namespace,
        )
    print(f"run_notebook: {args.notebook}: every assertion held")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    sys.exit(main())
