"""Check the book's table of contents and stored notebook outputs.

* every notebook in chapters/ is listed in _toc.yml, and every entry exists;
* every code cell has been executed (outputs are stored);
* no stored output is an error, except in cells tagged ``raises-exception``;
* every figure a code cell stores has alt text for screen readers, in the
  cell's metadata ``mystnb: {image: {alt: ...}}``, which MyST-NB puts on the
  rendered image.

Exit status 1 with one line per problem, 0 when the book is consistent.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def toc_entries() -> set[str]:
    text = (ROOT / "_toc.yml").read_text()
    return {
        m.group(1).removesuffix(".ipynb").removesuffix(".md")
        for m in re.finditer(r"^\s*-?\s*(?:file|root):\s*([\w./-]+)", text, re.M)
    }


def problems() -> list[str]:
    found = []
    entries = toc_entries()
    for entry in sorted(entries):
        if not any((ROOT / f"{entry}{ext}").exists() for ext in (".ipynb", ".md")):
            found.append(f"_toc.yml lists {entry}, which does not exist")
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        rel = nb.relative_to(ROOT).with_suffix("").as_posix()
        if rel not in entries:
            found.append(f"{rel}.ipynb is not listed in _toc.yml")
        cells = json.loads(nb.read_text())["cells"]
        for number, cell in enumerate(cells, 1):
            if cell["cell_type"] != "code":
                continue
            if cell.get("execution_count") is None:
                found.append(f"{rel}.ipynb cell {number} was not executed")
            tags = cell.get("metadata", {}).get("tags", [])
            if any("image/png" in out.get("data", {}) for out in cell["outputs"]):
                alt = cell["metadata"].get("mystnb", {}).get("image", {}).get("alt")
                if not (isinstance(alt, str) and alt.strip()):
                    found.append(
                        f"{rel}.ipynb cell {number} stores a figure without alt "
                        "text (set its metadata mystnb.image.alt)"
                    )
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) if out.get("text") else ""
                is_error = out["output_type"] == "error" or "Traceback" in text
                if is_error and "raises-exception" not in tags:
                    found.append(
                        f"{rel}.ipynb cell {number} stores an error "
                        f"({out.get('ename', 'traceback in a stream')})"
                    )
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(f"check_book: {line}")
    if not found:
        print("check_book: table of contents and stored outputs are consistent")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
