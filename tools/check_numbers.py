"""Check that the book's prose states no measured number that nothing produces.

The rule: numbers are never copied into prose. A measured number in a page
must come from a cell, or from a table generated from a committed CSV.

What is checked: the markdown cells of every notebook (the intro, chapters/
and appendices/) and every .md page of _toc.yml. Inline code, math, link
targets, URLs, HTML tags, MyST directive and option lines, fenced code,
comments and version numbers (``Keras 3.15``) are masked out first. Headings
are checked like any other prose: they are rendered text, and a heading that
quotes a result goes stale like a sentence does.

What counts as a measured number:

* a number, integer or decimal, with a unit or a ratio sign: ``1.17×``,
  ``0.46x``, ``15 %``, ``917 ms``, ``103 MiB``, ``1.3 GB``, ``12 s``;
* a bare decimal or a number in scientific notation: ``0.125``, ``1e-6``.

A bare integer (``9 values``, ``20 steps``) is a count, not a measurement.

Where it may come from:

* in a notebook, the outputs of its code cells (stream text, ``text/plain``,
  ``text/markdown``, ``text/html``, error messages), the sources of its code
  cells (a configuration such as ``n = 4096``; comments are not counted) and
  the files its ``literalinclude`` directives show;
* in a .md page, a committed CSV under evidence/ or the output of any
  notebook;
* anywhere, a ``{glue}`` role: its value is inserted at build time, and the
  role sits in backticks, so it is masked like inline code.

A prose number matches a produced value when the value, rounded to the
precision the prose states, equals it: ``1.2×`` matches an output ``1.17``,
``1.17`` matches ``1.17`` or ``1.170``, ``15 %`` matches ``15.3``. A
percentage also matches a fraction: ``1 %`` matches ``density=0.01``. Signs
are ignored (``falls by 0.5`` matches ``-0.5``). Units are not converted:
``917 ms`` does not match ``0.917 s``.

Exit status 1 with one line per problem, 0 when every number is produced.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import pathlib
import re
import subprocess
import sys
import tokenize
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Definitional constants a page may state without a cell producing them.
# Keep this short; each entry says why it is not a measurement.
# Keys are written without spaces ("100%"); none is needed yet.
ALLOWED: dict[str, str] = {}

# Directives whose body is code or data, not prose: masked whole.
CODE_DIRECTIVES = {
    "code",
    "code-block",
    "code-cell",
    "sourcecode",
    "literalinclude",
    "math",
    "eval-rst",
    "raw",
    "mermaid",
    "glue",
    "glue:figure",
    "glue:math",
}

# Names after which a number is a version: "Keras 3.15", "Python >= 3.10".
VERSIONED = (
    "Keras|keras|keras-hub|KerasHub|TensorFlow|TF|tf|Python|python|JAX|jax|jaxlib|"
    "PyTorch|torch|NumPy|numpy|SciPy|scipy|CUDA|cuDNN|Jupyter Book|jupyter-book|"
    "MyST-NB|MyST|Sphinx|Ubuntu|Debian|pip|optax|Flax|flax|refimpl|protobuf|h5py|"
    "ml-dtypes|pytest|Hypothesis|ruff|Node|Chrome|Chromium|Playwright|macOS|"
    "Windows|Linux|version|versions|release|releases|v"
)
NUM = r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?"
VERSION = re.compile(
    rf"(?<![\w.-])(?:{VERSIONED})\s*(?:[<>=~!]=?|≥|≤)?\s*v?\d+(?:\.\d+)+(?:\.[x*])?"
    rf"(?:\s*(?:,|–|—|-|to|and|or|through)\s*v?\d+(?:\.\d+)+(?:\.[x*])?)*"
    r"|(?<![\w.])v?\d+(?:\.\d+){2,}(?![\w.])"  # 2.16.1, 127.0.0.1: no measurement
)

UNITS = (
    r"%|‰|×|ms|µs|μs|us|ns|s|sec|secs|seconds?|min|minutes?|h|hours?|"
    r"B|KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB|bytes?|Hz|kHz|MHz|GHz|"
    r"FLOPs?|GFLOP/s|TFLOP/s|GFLOPS|TFLOPS|GB/s|MB/s|it/s|steps/s|samples/s|"
    r"tokens/s|W|pp|percent|ULPs?|thousand|million|billion"
)
SPACE = r"[ \u00a0\u2009\u202f]?"
# A number with a unit, or a number glued to a ratio "x" (0.46x, 2x).
# "2 × 4" and "3x3" are products of sizes, not ratios: no digit may follow.
MEASURED = re.compile(
    rf"(?<![\w.$\\-])(?P<sign>[-−])?(?P<num>{NUM})"
    rf"(?:(?P<unit>{SPACE}(?:{UNITS}))(?![\w/])(?!\s*\d)|(?P<ratio>x)(?![\w]))"
    rf"|(?<![\w.$\\-])(?P<bsign>[-−])?(?P<bare>\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)"
    r"(?!\w|\.\d)"
    # 1,843: a count written with thousands separators is a result, not a size.
    r"|(?<![\w.,])(?P<grouped>\d{1,3}(?:,\d{3})+)(?![\w,]|\.\d)"
)
SCALE = {"thousand": 3, "million": 6, "billion": 9}
# A range "10–20 %": the first number takes the unit of the second.
RANGE = re.compile(rf"(?<![\w.])(?P<num>{NUM})\s*(?:–|—|-|to)\s*(?={NUM}{SPACE}%)")

OUTPUT_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|(?<![\d.])\.\d+")
THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")


def toc_pages(root: pathlib.Path = ROOT) -> list[str]:
    """The .md pages of _toc.yml, relative to the root."""
    text = (root / "_toc.yml").read_text()
    names = re.findall(r"^\s*-?\s*(?:file|root):\s*([\w./-]+)", text, re.M)
    pages = []
    for name in names:
        name = name.removesuffix(".md")
        if (root / f"{name}.md").exists():
            pages.append(f"{name}.md")
    return pages


def _blank(text: str, start: int, end: int) -> str:
    """Replace text[start:end] by spaces, keeping newlines and offsets."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def _blank_all(text: str, pattern: re.Pattern, group: int | str = 0) -> str:
    for m in reversed(list(pattern.finditer(text))):
        if m.group(group) is not None:
            text = _blank(text, m.start(group), m.end(group))
    return text


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})\s*(\{([\w:.-]+)\})?(.*)$")
OPTION = re.compile(r"^\s*:[\w-]+:.*$")


def mask_prose(text: str) -> tuple[str, list[str]]:
    """The prose of a page with everything but running text blanked.

    Returns the masked text (same length and lines as ``text``) and the files
    named by ``literalinclude`` directives.
    """
    lines = text.split("\n")
    includes = []
    out = []
    stack: list[tuple[str, bool]] = []  # (closing fence, body is code)
    at_body_start = False
    for line in lines:
        m = FENCE.match(line)
        if stack and m and not m.group(3) and not m.group(5).strip():
            fence, _ = stack[-1]
            if m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence):
                stack.pop()
                out.append(" " * len(line))
                continue
        if stack and stack[-1][1]:
            out.append(" " * len(line))
            continue
        if m:
            name = m.group(4)
            is_code = name is None or name in CODE_DIRECTIVES
            if name == "literalinclude":
                includes.append(m.group(5).strip())
            stack.append((m.group(2), is_code))
            at_body_start = True
            out.append(" " * len(line))
            continue
        if stack and at_body_start and OPTION.match(line):
            out.append(" " * len(line))  # a directive's option
            continue
        at_body_start = False
        if re.match(r"^\s*%", line) or re.match(r"^\s*\([\w:.-]+\)=\s*$", line):
            out.append(" " * len(line))  # a MyST comment or target
            continue
        if re.match(r"^\s*\[[^\]]+\]:\s*\S+", line):
            out.append(" " * len(line))  # a link reference definition
            continue
        out.append(line)
    text = "\n".join(out)
    patterns = [
        re.compile(r"<!--.*?-->", re.S),
        re.compile(r"(?:\{[\w:.-]+\})?(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.S),
        re.compile(r"\$\$.+?\$\$", re.S),
        re.compile(r"\\begin\{(\w+\*?)\}.+?\\end\{\1\}", re.S),
        re.compile(r"(?<![\\$])\$(?![\s$])(?:[^$\n]|\n(?!\s*\n))+?(?<![\s\\])\$(?!\d)"),
        re.compile(r"\{\{.*?\}\}", re.S),
        re.compile(r"</?[A-Za-z][^>\n]*>"),
        re.compile(r"https?://[^\s)>\]]+"),
        VERSION,
    ]
    for pattern in patterns:
        text = _blank_all(text, pattern)
    text = _blank_all(text, re.compile(r"\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)"), 1)
    return text, includes


def _decimal(token: str) -> Decimal | None:
    try:
        value = Decimal(token.replace(",", "").replace("−", "-"))
    except InvalidOperation:
        return None
    return abs(value) if value.is_finite() else None


def numbers_in(text: str) -> set[Decimal]:
    """Every number a text shows, as an absolute value."""
    found = set()
    for m in OUTPUT_NUMBER.finditer(text):
        value = _decimal(m.group(0))
        if value is not None:
            found.add(value)
    for m in THOUSANDS.finditer(text):
        value = _decimal(m.group(0))
        if value is not None:
            found.add(value)
    return found


def _strip_html(text: str) -> str:
    text = re.sub(r"<(style|script)\b.*?</\1>", " ", text, flags=re.S | re.I)
    return re.sub(r"<[^>]*>", " ", text)


def _strip_comments(source: str) -> str:
    """A code cell's source without its comments, which configure nothing."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        spans = [(t.start, t.end) for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return re.sub(r"#[^\n]*", "", source)
    lines = source.split("\n")
    for (row, col), (_, end) in reversed(spans):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + line[end:]
    return "\n".join(lines)


class Produced:
    """The values some source produces, rounded on demand to any precision."""

    def __init__(self, values: set[Decimal]):
        self.values = values
        self.fractions = {v for v in values if v <= 1}
        self._rounded: dict[tuple[int, bool], set[Decimal]] = {}

    def _at(self, exponent: int, percent: bool) -> set[Decimal]:
        key = (exponent, percent)
        if key not in self._rounded:
            quantum = Decimal(1).scaleb(exponent)
            rounded = set()
            source = self.fractions if percent else self.values
            for value in source:
                if percent:
                    value = value * 100
                for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN):
                    try:
                        rounded.add(value.quantize(quantum, rounding=mode))
                    except InvalidOperation:
                        pass
            self._rounded[key] = rounded
        return self._rounded[key]

    def has(self, prose: Decimal, percent: bool) -> bool:
        exponent = prose.as_tuple().exponent
        assert isinstance(exponent, int)
        if prose in self._at(exponent, False):
            return True
        return percent and prose in self._at(exponent, True)


def _notebook_values(path: pathlib.Path) -> tuple[set[Decimal], set[Decimal]]:
    """(numbers in code cell outputs, numbers in code cell sources)."""
    outputs: set[Decimal] = set()
    sources: set[Decimal] = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        sources |= numbers_in(_strip_comments("".join(cell["source"])))
        for out in cell.get("outputs", []):
            texts = []
            if "text" in out:
                texts.append("".join(out["text"]))
            if out.get("evalue"):
                texts.append(out["evalue"])
            data = out.get("data", {})
            for kind in ("text/plain", "text/markdown", "text/latex"):
                if kind in data:
                    texts.append("".join(data[kind]))
            if "text/html" in data:
                texts.append(_strip_html("".join(data["text/html"])))
            for text in texts:
                outputs |= numbers_in(text)
    return outputs, sources


@functools.cache
def _csv_values(root: pathlib.Path) -> frozenset[Decimal]:
    """Every number in the committed CSVs under evidence/."""
    listed = subprocess.run(
        ["git", "ls-files", "evidence"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not listed:  # not a git checkout: every CSV under evidence/
        paths = sorted((root / "evidence").rglob("*.csv"))
    else:
        paths = [root / p for p in listed if p.endswith(".csv")]
    values: set[Decimal] = set()
    for path in paths:
        if not path.exists():
            continue
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                for field in row:
                    values |= numbers_in(field)
    return frozenset(values)


def _include_values(page: pathlib.Path, includes: list[str]) -> set[Decimal]:
    values: set[Decimal] = set()
    for name in includes:
        path = (page.parent / name).resolve()
        if path.is_file():
            values |= numbers_in(_strip_comments(path.read_text()))
    return values


def measured_numbers(text: str) -> list[tuple[int, int, list[Decimal], bool, str]]:
    """(start, end, values, is_percent, as written) for each measured number.

    ``values`` are the readings of the number that may match: ``59 million``
    is 59 or 59E+6.
    """
    masked, _ = mask_prose(text)
    found = {}
    for m in MEASURED.finditer(masked):
        token = m.group("num") or m.group("bare") or m.group("grouped")
        value = _decimal(token)
        if value is None:
            continue
        unit = (m.group("unit") or "").strip()
        values = [value]
        if unit in SCALE:
            values.append(value.scaleb(SCALE[unit]))
        percent = unit in ("%", "percent", "pp")
        found[m.start()] = (m.start(), m.end(), values, percent, m.group(0))
    for m in RANGE.finditer(masked):
        value = _decimal(m.group("num"))
        if value is not None:
            found[m.start()] = (m.start(), m.end("num"), [value], True, m.group("num"))
    return [found[start] for start in sorted(found)]


def _context(text: str, start: int, end: int) -> str:
    before = text[max(0, start - 20) : start]
    after = text[end : end + 20]
    return " ".join((before + text[start:end] + after).split())


def unproduced(text: str, produced: Produced) -> list[tuple[int, str]]:
    """(offset, number with context) for each measured number not produced."""
    missing = []
    for start, end, values, percent, written in measured_numbers(text):
        if "".join(written.split()) in ALLOWED:
            continue
        if not any(produced.has(value, percent) for value in values):
            missing.append((start, _context(text, start, end)))
    return missing


MESSAGE = '{}: "{}" is not produced by any cell output or committed CSV'


def problems(root: pathlib.Path = ROOT) -> list[str]:
    found: list[str] = []
    every_output: set[Decimal] = set()
    notebooks = [
        *root.glob("*.ipynb"),
        *(root / "chapters").glob("*.ipynb"),
        *(root / "appendices").glob("*.ipynb"),
    ]
    for nb in sorted(notebooks):
        rel = nb.relative_to(root).as_posix()
        outputs, sources = _notebook_values(nb)
        every_output |= outputs
        cells = json.loads(nb.read_text())["cells"]
        prose = {
            number: "".join(cell["source"])
            for number, cell in enumerate(cells, 1)
            if cell["cell_type"] == "markdown"
        }
        includes = [name for text in prose.values() for name in mask_prose(text)[1]]
        produced = Produced(outputs | sources | _include_values(nb, includes))
        for number, text in prose.items():
            for _, context in unproduced(text, produced):
                found.append(MESSAGE.format(f"{rel} cell {number}", context))
    produced = Produced(every_output | set(_csv_values(root)))
    for page in toc_pages(root):
        text = (root / page).read_text()
        for offset, context in unproduced(text, produced):
            line = text.count("\n", 0, offset) + 1
            found.append(MESSAGE.format(f"{page} line {line}", context))
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(f"check_numbers: {line}")
    if not found:
        print("check_numbers: every measured number in the prose is produced")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
