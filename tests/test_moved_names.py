"""Every name that moved, a function's or a module's (refimpl 1.x names in
2.0, refimpl 2.x names in 3.0), raises an AttributeError that names the
release it moved in and where it is now, and CHANGELOG.md, to which the error
and the API page send the reader, leads to the same new place: the table
"Names moved in <release>" lists the name, and a place it gives that moved
again later is in a later release's table."""

import re
from pathlib import Path

import pytest

import refimpl

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"

pytestmark = pytest.mark.every_backend


def test_the_table_holds_a_release_and_a_new_place_for_each_name():
    assert refimpl._MOVED
    for name, entry in refimpl._MOVED.items():
        assert isinstance(entry, tuple) and len(entry) == 2, name
        release, new = entry
        assert release in ("2.0", "3.0"), name
        assert re.search(r"refimpl(?:\.\w+)+", new), name
    assert not hasattr(refimpl, "MOVED")  # private since 3.0


@pytest.mark.parametrize("name", sorted(refimpl._MOVED))
def test_a_moved_name_says_where_it_went(name):
    release, new = refimpl._MOVED[name]
    with pytest.raises(AttributeError) as err:
        getattr(refimpl, name)
    message = str(err.value)
    assert f"refimpl.{name} moved in refimpl {release}: use " in message
    assert new in message


def test_the_moved_modules_are_listed():
    for module in ("variables", "sparse", "partial_dense", "masked_optimizer"):
        assert refimpl._MOVED[module][0] == "2.0"
    for module in ("stop_gradient", "scipy_optimize"):
        assert refimpl._MOVED[module] == ("2.0", f"refimpl.tf.{module}")
    release, new = refimpl._MOVED["trainability"]
    assert release == "3.0" and new.startswith("refimpl.convert")


def test_an_unknown_name_is_a_plain_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        refimpl.no_such_name  # noqa: B018


def moved_table(release: str) -> dict[str, str]:
    """The table of CHANGELOG.md's "Names moved in <release>": each old name
    (the code spans of a row's first cell) -> the row's second cell."""
    text = CHANGELOG.read_text()
    heading = f"### Names moved in {release}"
    assert heading in text, f"CHANGELOG.md has no section {heading!r}"
    section = text[text.index(heading) :]
    section = section[: section.index("\n#")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or set(cells[1]) <= {"-", " "}:
            continue
        for old in re.findall(r"`([^`]+)`", cells[0]):
            rows[old] = cells[1]
    return rows


def _later_releases(release: str) -> list[str]:
    releases = sorted({r for r, _ in refimpl._MOVED.values()}, key=float)
    return [r for r in releases if float(r) > float(release)]


def _spans(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def _leads_to(place: str, written: set[str], release: str) -> bool:
    """Whether a place of ``written`` is ``place``, or moved there in a release
    after ``release`` (that release's table has the written place, or a module
    above it, with ``place`` in its row)."""
    if place in written:
        return True
    for later in _later_releases(release):
        for old, cell in moved_table(later).items():
            if any(w == old or w.startswith(old + ".") for w in written):
                if _leads_to(place, _spans(cell), later):
                    return True
    return False


@pytest.mark.parametrize("name", sorted(refimpl._MOVED))
def test_the_changelog_lists_each_moved_name_and_where_it_went(name):
    release, new = refimpl._MOVED[name]
    new_places = re.findall(r"refimpl(?:\.\w+)+", new)
    assert new_places
    rows = moved_table(release)
    assert f"refimpl.{name}" in rows, (
        f"CHANGELOG.md's table of the names moved in {release} lacks refimpl.{name}"
    )
    written = _spans(rows[f"refimpl.{name}"])
    for place in new_places:
        assert _leads_to(place, written, release), (
            f"CHANGELOG.md moves refimpl.{name} to {rows[f'refimpl.{name}']}, "
            f"but the error says {place}"
        )
