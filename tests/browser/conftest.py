"""The built book in headless Chromium, offline: `make browser` (after `make book`).

These tests read the HTML in ``$BOOK_HTML`` (``make browser`` sets it to
``_build/html``); without it they are not collected, so ``pytest tests`` never
tests a stale build. Chromium is Debian's ``/usr/bin/chromium`` (or
``$CHROMIUM``), driven by Playwright's Python package; every request that is not
for a local file is blocked and counted as a failure.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from dataclasses import dataclass, field

import pytest

BOOK_HTML = os.environ.get("BOOK_HTML")
if not BOOK_HTML:
    collect_ignore_glob = ["test_*.py"]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 400, "height": 800}
TIMEOUT_MS = 15_000


@dataclass
class Log:
    """What one page did: console errors, uncaught errors, refused requests."""

    errors: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def clear(self) -> None:
        self.errors.clear()
        self.external.clear()
        self.failed.clear()


@pytest.fixture(scope="session")
def book() -> pathlib.Path:
    root = pathlib.Path(BOOK_HTML).resolve()
    if not (root / "index.html").is_file():
        pytest.fail(f"no built book in {root}: run `make book` first")
    return root


@pytest.fixture(scope="session")
def browser_context():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} not found: install Debian's `chromium` package "
            "(make browser does so as root)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport=DESKTOP,
            service_workers="block",
        )
        context.set_default_timeout(TIMEOUT_MS)
        log = Log()

        def only_files(route):
            url = route.request.url
            if url.startswith(("file:", "data:", "blob:")):
                route.continue_()
            else:
                log.external.append(url)
                route.abort("internetdisconnected")

        context.route("**/*", only_files)
        context.log = log
        yield context
        context.close()


@pytest.fixture()
def page(browser_context):
    """A fresh tab at desktop size whose console errors and requests are logged."""
    log = browser_context.log
    log.clear()
    tab = browser_context.new_page()
    tab.set_viewport_size(DESKTOP)

    def on_console(message):
        if message.type == "error":
            log.errors.append(f"console: {message.text}")

    def on_request_failed(request):
        if request.url.startswith("file:"):
            log.failed.append(f"{request.url} ({request.failure})")

    tab.on("console", on_console)
    tab.on("pageerror", lambda error: log.errors.append(f"uncaught: {error}"))
    tab.on("requestfailed", on_request_failed)
    tab.log = log
    yield tab
    tab.close()
