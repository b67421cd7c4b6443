"""Count the words a reader sees on each page of the book.

A page's *visible words* are the whitespace-separated tokens of its rendered
article text: prose, shown code and shown outputs. Left out, as the built book
hides them: code cells tagged ``remove-input``/``hide-input`` (their inputs),
``remove-output``/``hide-output`` (their outputs), ``remove-cell``/``hide-cell``
(both), MyST comments and target labels, directive option lines, figure files,
and ``{dropdown}`` blocks that are not ``:open:``. *Prose* is the part of the
visible words outside code and outputs.

The Markdown is parsed with markdown-it (the parser MyST builds on), so table
pipes, link targets and role names are not counted; a ``{doc}`` role without
its own text counts the words of the title it renders.

    python tools/book_words.py PATH [PATH ...]
"""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import pathlib
import re
import sys

from markdown_it import MarkdownIt

ROOT = pathlib.Path(__file__).resolve().parents[1]

HIDDEN_INPUT = {"remove-input", "hide-input", "remove-cell", "hide-cell"}
HIDDEN_OUTPUT = {"remove-output", "hide-output", "remove-cell", "hide-cell"}
# MyST-NB's order of preference among an output's MIME types (HTML builder).
MIME_PRIORITY = (
    "text/html",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "text/markdown",
    "text/latex",
    "text/plain",
)
CODE_DIRECTIVES = {"code", "code-block", "code-cell", "sourcecode", "literalinclude"}
SKIPPED_DIRECTIVES = {"raw", "toctree", "glue:figure", "mermaid"}
ROLE = re.compile(r"\{([\w:.-]+)\}`([^`]*)`")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TAG = re.compile(r"<[^>]+>")

_md = MarkdownIt("commonmark").enable("table")


@dataclasses.dataclass
class Count:
    prose: int = 0
    code: int = 0  # shown code: code cells and code blocks in Markdown
    output: int = 0

    @property
    def visible(self) -> int:
        return self.prose + self.code + self.output

    def __iadd__(self, other: Count) -> Count:
        self.prose += other.prose
        self.code += other.code
        self.output += other.output
        return self


def words(text: str) -> int:
    return len(text.split())


@functools.cache
def _title(target: str) -> str:
    """The H1 of a page, as a ``{doc}`` role without text renders it."""
    path = pathlib.Path(target)
    for candidate in (path, path.with_suffix(".md"), path.with_suffix(".ipynb")):
        if candidate.is_file():
            if candidate.suffix == ".ipynb":
                cells = json.loads(candidate.read_text())["cells"]
                text = "\n".join("".join(c["source"]) for c in cells)
            else:
                text = candidate.read_text()
            match = re.search(r"^# (.+)$", text, re.M)
            return match.group(1) if match else candidate.stem
    return target


def _inline(text: str, page: pathlib.Path) -> str:
    def role(match: re.Match) -> str:
        name, body = match.groups()
        explicit = re.fullmatch(r"(.*?)\s*<[^>]*>", body, re.S)
        if explicit:
            return explicit.group(1)
        if name == "doc":
            target = (
                ROOT / body.lstrip("/") if body.startswith("/") else page.parent / body
            )
            return _title(str(target.resolve()))
        return body

    # markdown-it splits the line into text, code, links and images; a link
    # shows its text, an image no words, code its content. A role is text
    # ending in "{name}" followed by code, so code keeps its backticks until
    # the roles are resolved.
    pieces = []
    for child in _md.parseInline(text)[0].children or []:
        if child.type == "text":
            pieces.append(child.content)
        elif child.type == "code_inline":
            pieces.append(f"`{child.content}`")
        elif child.type in ("softbreak", "hardbreak", "html_inline"):
            pieces.append(" ")
    text = ROLE.sub(role, "".join(pieces)).replace("`", "")
    return html.unescape(TAG.sub(" ", text))


def _directive(info: str, body: str, page: pathlib.Path) -> Count:
    name, _, argument = info[1:].partition("}")
    lines = body.splitlines()
    options = []
    while lines and re.match(r"^\s*:[\w-]+:", lines[0]):
        options.append(lines.pop(0).strip())
    rest = "\n".join(lines)
    count = Count()
    if name == "dropdown" and not any(o.startswith(":open:") for o in options):
        return count  # closed: only its title shows, counted as prose
    if name in SKIPPED_DIRECTIVES:
        return count
    if name in CODE_DIRECTIVES:
        count.code += words(rest)
        return count
    if name == "math":
        count.prose += words(rest)
        return count
    count.prose += words(_inline(argument, page))
    if name in ("figure", "image"):
        count.prose += words(_inline(rest, page))
        return count
    count += markdown(rest, page)
    return count


def markdown(text: str, page: pathlib.Path) -> Count:
    """The words of MyST Markdown as the book renders it."""
    kept = [
        line
        for line in text.splitlines()
        if not re.match(r"^\s*(%|\(.+\)=\s*$|\+\+\+)", line)
    ]
    count = Count()
    for token in _md.parse("\n".join(kept)):
        if token.type == "fence":
            info = token.info.strip()
            if info.startswith("{"):
                count += _directive(info, token.content, page)
            else:
                count.code += words(token.content)
        elif token.type == "code_block":
            count.code += words(token.content)
        elif token.type == "inline":
            count.prose += words(_inline(token.content, page))
        elif token.type == "html_block":
            count.prose += words(html.unescape(TAG.sub(" ", token.content)))
    return count


def _output(output: dict, page: pathlib.Path) -> int:
    kind = output["output_type"]
    if kind == "stream":
        return words("".join(output["text"]))
    if kind == "error":
        return words(ANSI.sub("", "\n".join(output.get("traceback", []))))
    data = output.get("data", {})
    for mime in MIME_PRIORITY:
        if mime in data:
            text = "".join(data[mime])
            if mime.startswith("image/"):
                return 0
            if mime == "text/html":
                text = re.sub(r"<(style|script)\b.*?</\1>", " ", text, flags=re.S)
                return words(html.unescape(TAG.sub(" ", text)))
            if mime == "text/markdown":
                return markdown(text, page).visible
            return words(text)
    return 0


def notebook(path: pathlib.Path) -> Count:
    count = Count()
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            count += markdown(source, path)
        elif cell["cell_type"] == "code":
            tags = set(cell.get("metadata", {}).get("tags", []))
            if not tags & HIDDEN_INPUT:
                count.code += words(source)
            if not tags & HIDDEN_OUTPUT:
                count.output += sum(_output(o, path) for o in cell.get("outputs", []))
    return count


def page(path: pathlib.Path) -> Count:
    path = path.resolve()
    if path.suffix == ".ipynb":
        return notebook(path)
    return markdown(path.read_text(), path)


def main(argv: list[str]) -> int:
    print(f"{'page':45} {'visible':>8} {'prose':>6} {'code':>6} {'output':>7}")
    for name in argv:
        count = page(pathlib.Path(name))
        print(
            f"{name:45} {count.visible:8} {count.prose:6} {count.code:6} "
            f"{count.output:7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
