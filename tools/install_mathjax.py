"""Install MathJax for the book, so that math renders without a network.

The book loads MathJax from ``_static/mathjax/`` of the built HTML
(``mathjax_path`` in ``_config.yml``) rather than from a CDN. This script fetches
the official ``mathjax`` package at one pinned version with ``npm pack``, checks
it against the pinned integrity hash, and unpacks it into ``_mathjax/_static/mathjax``,
a git-ignored folder that Sphinx copies into the build (``html_extra_path``).
Only the standard library and ``npm`` are needed; ``make`` runs it at install time.

    python3 tools/install_mathjax.py [DEST]
"""

import base64
import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

VERSION = "3.2.2"
# `npm view mathjax@3.2.2 dist.integrity`
INTEGRITY = (
    "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/"
    "O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
)
ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / "_mathjax"
# The component the book loads; the rest (fonts, lazily loaded extensions) sits
# beside it and is found relative to it.
ENTRY = "es5/tex-mml-chtml.js"


def _pack(workdir: pathlib.Path) -> bytes:
    if shutil.which("npm") is None:
        sys.exit(
            "install_mathjax: npm is needed to install MathJax "
            "(Debian: apt-get install npm)"
        )
    out = subprocess.run(
        ["npm", "pack", "--json", "--silent", f"mathjax@{VERSION}"],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    filename = json.loads(out)[0]["filename"]
    return (workdir / filename).read_bytes()


def _check(data: bytes) -> None:
    algorithm, _, expected = INTEGRITY.partition("-")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        sys.exit(
            f"install_mathjax: mathjax@{VERSION} has integrity "
            f"{algorithm}-{actual}, expected {INTEGRITY}"
        )


def _unpack(data: bytes, target: pathlib.Path) -> None:
    """Write the regular files under ``package/`` of the tarball into ``target``."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = pathlib.PurePosixPath(member.name).parts
            if not member.isfile() or parts[0] != "package" or ".." in parts:
                continue
            path = target.joinpath(*parts[1:])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tar.extractfile(member).read())


def main(dest: pathlib.Path = DEFAULT_DEST) -> None:
    target = dest / "_static" / "mathjax"
    with tempfile.TemporaryDirectory() as tmp:
        data = _pack(pathlib.Path(tmp))
        _check(data)
        staging = pathlib.Path(tmp) / "mathjax"
        _unpack(data, staging)
        if not (staging / ENTRY).is_file():
            sys.exit(f"install_mathjax: {ENTRY} is missing from mathjax@{VERSION}")
        shutil.rmtree(dest, ignore_errors=True)
        target.parent.mkdir(parents=True)
        shutil.move(str(staging), target)
    print(f"install_mathjax: mathjax@{VERSION} in {target}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DEST)
