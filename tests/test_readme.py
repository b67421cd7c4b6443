"""Every Python block in README.md runs as written."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_python_examples():
    assert BLOCKS


# A block that builds a keras-hub model runs in `make test`, not `make check`.
NUMBERS = [
    pytest.param(i, marks=pytest.mark.slow) if "keras_hub" in block else i
    for i, block in enumerate(BLOCKS)
]


@pytest.mark.parametrize("number", NUMBERS)
def test_readme_example_runs(number):
    exec(compile(BLOCKS[number], f"README.md block {number}", "exec"), {})
