"""Check the book's table of contents and stored notebook outputs.

* every notebook in chapters/ is listed in _toc.yml, and every entry exists;
* every code cell has been executed (outputs are stored);
* no stored output is an error, except in cells tagged ``raises-exception``;
* every figure a code cell stores has alt text for screen readers, in the
  cell's metadata ``mystnb: {image: {alt: ...}}``, which MyST-NB puts on the
  rendered image;
* the book stays short: every page's visible words (tools/book_words.py) fit
  its budget, and the reading path has the intro and at most 9 chapters.

Every page's counts are printed. ``--words PATH ...`` prints the counts of the
pages named, and checks nothing.

Exit status 1 with one line per problem, 0 when the book is consistent.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import book_words

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Visible words (prose, shown code, shown outputs) a page may have.
INTRO_WORDS = 1_800
CHAPTER_WORDS = 5_000
CHAPTER_PROSE = 2_000
REFERENCE_WORDS = 6_000
BOOK_WORDS = 40_000  # every page but the API reference
MAX_CHAPTERS = 9
UNBUDGETED = {"appendices/api"}  # the API reference, generated from docstrings


def toc_order() -> list[str]:
    """The pages of _toc.yml in reading order, without their suffixes."""
    text = (ROOT / "_toc.yml").read_text()
    return [
        m.group(1).removesuffix(".ipynb").removesuffix(".md")
        for m in re.finditer(r"^\s*-?\s*(?:file|root):\s*([\w./-]+)", text, re.M)
    ]


def toc_entries() -> set[str]:
    return set(toc_order())


def page_path(entry: str) -> pathlib.Path | None:
    """The notebook or Markdown file behind a _toc.yml entry, or None."""
    for ext in (".ipynb", ".md"):
        if (ROOT / f"{entry}{ext}").exists():
            return ROOT / f"{entry}{ext}"
    return None


def budget_problems(show: bool = True) -> list[str]:
    """Every page's visible words against its budget; prints the counts."""
    found = []
    total = 0
    entries = [e for e in toc_order() if page_path(e) is not None]
    chapters = [e for e in entries if e.startswith("chapters/")]
    if len(chapters) > MAX_CHAPTERS:
        found.append(
            f"the reading path has {len(chapters)} chapters (at most {MAX_CHAPTERS})"
        )
    if show:
        print(f"check_book: {'page':40} {'visible':>8} {'prose':>6}  budget")
    for entry in entries:
        count = book_words.page(page_path(entry))
        if entry in UNBUDGETED:
            limit, prose_limit = None, None
        elif entry.startswith("chapters/"):
            limit, prose_limit = CHAPTER_WORDS, CHAPTER_PROSE
        elif entry.startswith("appendices/"):
            limit, prose_limit = REFERENCE_WORDS, None
        else:
            limit, prose_limit = INTRO_WORDS, None
        if entry not in UNBUDGETED:
            total += count.visible
        budget = "none" if limit is None else f"{limit:,}"
        if prose_limit is not None:
            budget += f", prose {prose_limit:,}"
        if show:
            print(f"check_book: {entry:40} {count.visible:8} {count.prose:6}  {budget}")
        if limit is not None and count.visible > limit:
            found.append(f"{entry} has {count.visible} visible words (at most {limit})")
        if prose_limit is not None and count.prose > prose_limit:
            found.append(
                f"{entry} has {count.prose} words of prose (at most {prose_limit})"
            )
    if show:
        print(f"check_book: {'the book but the API page':40} {total:8}")
    if total > BOOK_WORDS:
        found.append(
            f"the book has {total} visible words without the API page "
            f"(at most {BOOK_WORDS})"
        )
    return found


def problems() -> list[str]:
    found = []
    entries = toc_entries()
    for entry in sorted(entries):
        if page_path(entry) is None:
            found.append(f"_toc.yml lists {entry}, which does not exist")
    notebooks = sorted(
        [
            *ROOT.glob("*.ipynb"),
            *(ROOT / "chapters").glob("*.ipynb"),
            *(ROOT / "appendices").glob("*.ipynb"),
        ]
    )
    for nb in notebooks:
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
    return found + budget_problems()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--words"]:
        return book_words.main(argv[1:])
    found = problems()
    for line in found:
        print(f"check_book: {line}")
    if not found:
        print("check_book: table of contents and stored outputs are consistent")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
