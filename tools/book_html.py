"""Sphinx extension for the HTML of the book (``sphinx.local_extensions``).

* Inline scripts are written once per page. Sphinx 7.4 adds every script that an
  extension registers after the builder starts (sphinx-togglebutton's selector,
  sphinx-thebe's configuration) a second time when it starts writing, so each page
  declared ``const THEBE_JS_URL`` twice, a SyntaxError in the browser console.
* A local ``mathjax_path`` must exist in the build: ``tools/install_mathjax.py``
  (run by ``make``) puts MathJax into ``_mathjax``, which ``html_extra_path`` copies
  to ``_static/mathjax``. Without it the build warns, so ``-W`` fails, instead of
  the math silently staying raw TeX.
"""

from __future__ import annotations

import os
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _key(script: Any) -> tuple:
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {})
    return (os.fspath(filename), tuple(sorted(attributes.items())))


def dedupe_scripts(app: Sphinx, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen = set()
    unique = []
    for script in scripts:
        key = _key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # the builder's own list, which the template reads


def check_mathjax(app: Sphinx) -> None:
    if app.builder.format != "html":
        return
    mathjax_path = app.config.mathjax_path
    if not mathjax_path or "://" in mathjax_path or mathjax_path.startswith("/"):
        return
    candidates = [
        os.path.join(app.confdir, extra, "_static", mathjax_path)
        for extra in app.config.html_extra_path
    ] + [
        os.path.join(app.confdir, static, mathjax_path)
        for static in app.config.html_static_path
    ]
    if not any(os.path.isfile(path) for path in candidates):
        logger.warning(
            "MathJax %s is not installed (looked in html_extra_path and "
            "html_static_path); run `make book` or `python3 tools/install_mathjax.py`",
            mathjax_path,
        )


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", check_mathjax)
    # After every other handler has added its scripts for the page.
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
