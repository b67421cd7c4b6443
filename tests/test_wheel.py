"""The wheel holds refimpl alone, needs only Keras and NumPy, and runs on JAX."""

import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.slow

# Refuses TensorFlow: the Keras-level API must not need it.
_NO_TENSORFLOW = """
import importlib.abc, sys
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("TensorFlow is not installed here")
sys.meta_path.insert(0, _Refuse())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(ROOT)],
        check=True,
    )  # fmt: skip
    [path] = out.glob("refimpl-*.whl")
    return path


def test_the_wheel_holds_refimpl_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.startswith("refimpl-")}
    assert packages == {"refimpl"}, packages
    assert "refimpl/layers/partial.py" in names


def test_the_wheel_depends_on_keras_and_numpy_only(wheel):
    [meta] = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("METADATA")]
    text = zipfile.ZipFile(wheel).read(meta).decode()
    required = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert sorted(r.split(">")[0].split("=")[0].strip() for r in required) == [
        "keras",
        "numpy",
    ], required
    assert "keras>=3.15" in required
    extras = re.findall(r"^Provides-Extra: (\S+)", text, re.M)
    assert {"tensorflow", "scipy", "plot"} <= set(extras)


def test_the_readme_example_runs_from_the_wheel_on_jax_without_tensorflow(
    wheel, tmp_path
):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    example = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(
        _NO_TENSORFLOW
        + "import refimpl, pathlib\n"
        + f"assert pathlib.Path(refimpl.__file__).is_relative_to({str(site)!r})\n"
        + "assert refimpl.backend.name == 'jax'\n"
        + example
    )
    env = {"KERAS_BACKEND": "jax", "PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
