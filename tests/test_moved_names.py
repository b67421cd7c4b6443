"""Every refimpl 1.x name that moved, a function's or a module's, raises an
AttributeError that names where it is now."""

import pytest

import refimpl

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
