"""Every refimpl 1.x name that moved, a function's or a module's, raises an
AttributeError that names where it is now, and the table "Names moved in 2.0"
of CHANGELOG.md, to which the error and the API page send the reader, lists
it with the same new place."""

import re
from pathlib import Path

import pytest

import refimpl

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"

pytestmark = pytest.mark.every_backend


@pytest.mark.parametrize("name", sorted(refimpl.MOVED))
def test_a_moved_name_says_where_it_went(name):
    with pytest.raises(AttributeError) as err:
        getattr(refimpl, name)
    message = str(err.value)
    assert f"refimpl.{name} moved in refimpl 2.0" in message
    assert refimpl.MOVED[name] in message


def test_the_moved_modules_are_listed():
    for module in ("variables", "sparse", "partial_dense", "masked_optimizer"):
        assert module in refimpl.MOVED
    for module in ("stop_gradient", "scipy_optimize"):
        assert refimpl.MOVED[module].startswith("refimpl.tf.")


def test_an_unknown_name_is_a_plain_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        refimpl.no_such_name  # noqa: B018


def moved_table() -> dict[str, str]:
    """The table of CHANGELOG.md's "Names moved in 2.0": each old name (the code
    spans of a row's first cell) -> the row's second cell."""
    text = CHANGELOG.read_text()
    section = text[text.index("### Names moved in 2.0") :]
    section = section[: section.index("\n#")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or set(cells[1]) <= {"-", " "}:
            continue
        for old in re.findall(r"`([^`]+)`", cells[0]):
            rows[old] = cells[1]
    return rows


@pytest.mark.parametrize("name", sorted(refimpl.MOVED))
def test_the_changelog_lists_each_moved_name_and_where_it_went(name):
    rows = moved_table()
    assert f"refimpl.{name}" in rows, f"CHANGELOG.md's table lacks refimpl.{name}"
    new_places = re.findall(r"refimpl(?:\.\w+)+", refimpl.MOVED[name])
    assert new_places
    written = re.findall(r"`([^`]+)`", rows[f"refimpl.{name}"])
    for place in new_places:
        assert place in written, (
            f"CHANGELOG.md moves refimpl.{name} to {rows[f'refimpl.{name}']}, "
            f"but the error says {place}"
        )
