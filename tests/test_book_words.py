"""The book's word counter counts what a reader sees, and the budgets bite."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import book_words  # noqa: E402
import check_book  # noqa: E402


def _notebook(tmp_path, cells):
    path = tmp_path / "page.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    return path


def _code(source, outputs=(), tags=()):
    return {
        "cell_type": "code",
        "source": source,
        "metadata": {"tags": list(tags)},
        "outputs": list(outputs),
        "execution_count": 1,
    }


def test_prose_skips_table_pipes_link_targets_and_role_names(tmp_path):
    text = (
        "# Two words\n\n"
        "| a | b |\n| --- | --- |\n| c | d |\n\n"
        "See [the page](https://example.org/x) and {term}`free entry <free entry>`.\n"
        "Then [Train `X[0]`](../c.ipynb#train-only-x0) ![a picture](p.png).\n"
    )
    count = book_words.markdown(text, tmp_path / "page.md")
    # heading 2, table 4 cells, "See the page and free entry." 6, and
    # "Then Train X[0] ." 4: the picture shows no words, its full stop does
    assert (count.prose, count.code) == (16, 0)


def test_closed_dropdown_labels_and_comments_are_not_visible(tmp_path):
    text = (
        "(a-label)=\n% a comment\n\none two\n\n"
        "```{dropdown} Shown title\nhidden words here\n```\n\n"
        "```{dropdown} Open title\n:open:\nshown words\n```\n\n"
        "```{note}\nthree more words\n```\n\n"
        "```python\nx = 1\n```\n"
    )
    count = book_words.markdown(text, tmp_path / "page.md")
    # "one two" 2, open dropdown title 2 + body 2, note 3; closed body 0
    assert count.prose == 9
    assert count.code == 3


def test_hidden_inputs_and_outputs_are_left_out(tmp_path):
    stream = {"output_type": "stream", "name": "stdout", "text": "a b c\n"}
    figure = {
        "output_type": "display_data",
        "data": {"image/png": "xx", "text/plain": "<Figure size 1 with 1 Axes>"},
    }
    path = _notebook(
        tmp_path,
        [
            _code("print(1)", [stream]),
            _code("hidden = input", [stream], tags=["hide-input"]),
            _code("shown = input", [stream], tags=["remove-output"]),
            _code("plot()", [figure]),
        ],
    )
    count = book_words.page(path)
    assert (count.code, count.output) == (1 + 3 + 1, 3 + 3)


def test_every_page_of_the_book_is_within_its_budget():
    assert check_book.budget_problems(show=False) == []
