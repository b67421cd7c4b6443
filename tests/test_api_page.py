"""The API page states the values of the `choose_mode` thresholds it names.

The table of forms on ``appendices/api.md``, and the paragraph on XLA under
it, write each threshold of ``refimpl.ops`` as its ``{data}`` role followed by
its value as a percentage, ``{data}`~refimpl.ops.SPARSE_BELOW_DENSITY`
(0.5 %)``. A typed number goes stale, so the expected text is computed here
from the constant itself: change a constant without updating the page and
this test fails. A percentage written anywhere else on the page, away from
its role, would escape that check, so none may be.

The page's own ``>>>`` examples (in ```` ```python ```` blocks, outside the
docstrings, which run as refimpl's doctests) run here as shown.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from refimpl import ops

API_PAGE = Path(__file__).resolve().parents[1] / "appendices" / "api.md"
THRESHOLDS = (
    "SPARSE_BELOW_DENSITY",
    "SPARSE_BELOW_DENSITY_XLA",
    "SELECT_ABOVE_DENSITY",
)


def percent(fraction: float) -> str:
    """The page's spelling of a fraction as a percentage: 0.005 -> '0.5 %'."""
    return f"{fraction * 100:g} %"


def stated_values(text: str, name: str) -> list[str]:
    """Every percentage written right after the ``{data}`` role of ``name``."""
    role = re.escape("{data}`~refimpl.ops." + name + "`")
    return re.findall(role + r" \(([^()]*%)\)", text)


def test_percent_spelling():
    assert percent(0.005) == "0.5 %"
    assert percent(0.003) == "0.3 %"
    assert percent(0.125) == "12.5 %"


@pytest.mark.parametrize("name", THRESHOLDS)
def test_threshold_value_is_on_the_page(name):
    stated = stated_values(API_PAGE.read_text(), name)
    expected = percent(getattr(ops, name))
    assert stated, f"api.md never writes {name} followed by ({expected})"
    assert set(stated) == {expected}, (
        f"api.md writes {name} as {stated}, but refimpl.ops.{name} is "
        f"{getattr(ops, name)!r} ({expected}): update the page"
    )


_PERCENT = r"\d(?:[\d.]*\d)? ?%"


def unchecked_percentages(text: str) -> list[str]:
    """Every percentage in ``text`` that does not follow a threshold's role."""
    written = re.findall(_PERCENT, text)
    roles = r"\{data\}`~refimpl\.ops\.(?:" + "|".join(THRESHOLDS) + ")`"
    checked = re.findall(roles + rf" \(({_PERCENT})\)", text)
    for value in checked:
        written.remove(value)
    return written


def test_every_percentage_follows_its_role():
    assert unchecked_percentages(API_PAGE.read_text()) == [], (
        "api.md writes a percentage away from the {data} role of its "
        "refimpl.ops constant, where no test checks it: write the role before it"
    )


def test_a_stray_percentage_is_found():
    role = "{data}`~refimpl.ops.SELECT_ABOVE_DENSITY` (12.5 %)"
    assert unchecked_percentages(role) == []
    assert unchecked_percentages(role + ", or 12.5 % free") == ["12.5 %"]
    assert unchecked_percentages("at 0.3% free") == ["0.3%"]


@pytest.mark.parametrize("name", THRESHOLDS)
def test_a_changed_threshold_fails(monkeypatch, name):
    """The check above fails for a constant that moved and a page that did not."""
    monkeypatch.setattr(ops, name, getattr(ops, name) * 0.8)
    with pytest.raises(AssertionError, match="update the page"):
        test_threshold_value_is_on_the_page(name)


# -- the page's own examples ---------------------------------------------------
_EXAMPLE = re.compile(r"^```python\n(>>> .*?)^```", re.M | re.S)


def page_examples(text: str) -> list[str]:
    """The ``>>>`` examples the page writes itself (outside the docstrings)."""
    return _EXAMPLE.findall(text)


def test_the_page_examples_are_found():
    assert page_examples("```python\n>>> 1 + 1\n2\n```\n") == [">>> 1 + 1\n2\n"]
    assert page_examples(API_PAGE.read_text())


@pytest.mark.parametrize("index", range(len(page_examples(API_PAGE.read_text()))))
def test_a_page_example_runs_as_shown(index):
    # As the page's conventions say: after `import keras` and `import numpy as np`.
    import doctest

    import keras
    import numpy as np

    source = page_examples(API_PAGE.read_text())[index]
    test = doctest.DocTestParser().get_doctest(
        source, {"keras": keras, "np": np}, f"api.md example {index}", str(API_PAGE), 0
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"api.md's example {index} does not run as shown"
