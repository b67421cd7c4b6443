"""Numbers are never copied into prose: every measured number a page states
comes from a cell output, a code cell or a committed CSV.

The rules are in tools/check_numbers.py; these tests read files only.
"""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_numbers", ROOT / "tools" / "check_numbers.py"
)
check_numbers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_numbers)


def test_the_prose_states_no_number_that_nothing_produces():
    found = check_numbers.problems()
    assert not found, f"{len(found)} copied numbers:\n" + "\n".join(found)


def _book(tmp_path, prose, source="", output="", page="", csv=""):
    """A one-chapter book with one markdown cell and one code cell."""
    (tmp_path / "chapters").mkdir(parents=True)
    (tmp_path / "evidence").mkdir()
    (tmp_path / "_toc.yml").write_text("root: intro\nchapters:\n  - file: chapters/c\n")
    (tmp_path / "intro.md").write_text(page)
    (tmp_path / "evidence" / "r.csv").write_text(csv)
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": [prose]},
        {
            "cell_type": "code",
            "metadata": {},
            "execution_count": 1,
            "source": [source],
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}],
        },
    ]
    (tmp_path / "chapters" / "c.ipynb").write_text(json.dumps({"cells": cells}))
    return check_numbers.problems(tmp_path)


def test_a_copied_number_is_found_at_any_unit(tmp_path):
    prose = "It is 1.17× faster, 0.46x, 15 %, 917 ms, 103 MiB, 1.3 GB, 12 s, 0.125."
    found = _book(tmp_path, prose, output="nothing here")
    assert len(found) == 8, found
    assert found[0] == (
        'chapters/c.ipynb cell 1: "It is 1.17× faster, 0.46x, 15 %" '
        "is not produced by any cell output or committed CSV"
    )


def test_a_number_an_output_shows_at_the_stated_precision_is_allowed(tmp_path):
    prose = "It is 1.17× or 1.2× faster, 15 % of the time, 1 % free, in 12 s."
    source = "density = 0.01  # 15 in a comment does not count"
    assert _book(tmp_path / "a", prose, source=source, output="1.170 15.3 11.8") == []
    assert len(_book(tmp_path / "b", "15 % here", source="# 15 in a comment")) == 1


def test_code_math_links_directives_and_versions_are_not_prose(tmp_path):
    prose = (
        "With Keras 3.15, TF 2.16 and Python 3.10 to 3.12: `x = 0.25`, $0.5$,\n"
        "[the page](https://example.org/v1.5/2.5.html), 2 × 4 devices, 3x3.\n"
        "```{literalinclude} ../code.py\n:lines: 1.5\n```\n"
        "```python\ny = 9.75\n```\n"
        "{glue:text}`speedup:.2f`× faster\n"
    )
    assert _book(tmp_path, prose) == []


def test_a_page_takes_its_numbers_from_a_committed_csv(tmp_path):
    page = "# Results\n\nThe step takes 0.46× the dense time, and 2.8× here.\n"
    found = _book(tmp_path, "", page=page, csv="variant,ratio\na,0.4612\n")
    assert found == [
        'intro.md line 3: "the dense time, and 2.8× here." '
        "is not produced by any cell output or committed CSV"
    ]
