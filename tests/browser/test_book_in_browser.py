"""Every page of the built book works offline in a real browser, on a phone too.

For every HTML page: no console error, no request that leaves the machine, all math
typeset by the local MathJax, every image and font loaded, every table within the
column on a desktop screen, and no sideways scroll at 400 px. On a phone-sized
screen the navigation and the page contents open; search finds a word of the book;
the copy button of a ``>>>`` example copies the code only. See conftest.py for the
browser and how these tests are run.
"""

from __future__ import annotations

import html
import os
import pathlib
import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from conftest import DESKTOP, PHONE

BOOK = pathlib.Path(os.environ["BOOK_HTML"]).resolve()
REDIRECT = re.compile(
    r'<meta\s+http-equiv="refresh"\s+content="\d+;\s*url=([^"]+)"', re.IGNORECASE
)
PAGES = sorted(
    path.relative_to(BOOK).as_posix()
    for path in BOOK.rglob("*.html")
    if "_static" not in path.relative_to(BOOK).parts
)
SEARCH_WORD = "trainable"

# After load: wait for MathJax to typeset and for images and fonts, then count.
INSPECT = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  const images = [...document.images];
  images.forEach((img) => { img.loading = "eager"; });
  await Promise.all(images.map((img) => img.decode().catch(() => null)));
  await document.fonts.ready;
  const math = [...document.querySelectorAll(".math")];
  return {
    math: math.length,
    typeset: math.filter((e) => e.querySelector("mjx-container")).length,
    rendered: document.querySelectorAll("mjx-container").length,
    texErrors: [...document.querySelectorAll("mjx-merror")].map((e) => e.textContent),
    brokenImages: images
      .filter((img) => !(img.complete && img.naturalWidth > 0))
      .map((img) => img.getAttribute("src")),
    // A Markdown table that was not parsed shows its pipes and dashes as text.
    rawTables: [...document.querySelectorAll("article p")]
      .filter((p) => /\\|\\s*[-\u2014:]{2,}\\s*\\|/.test(p.textContent))
      .map((p) => p.textContent.trim().slice(0, 60)),
    missingAlt: [...document.querySelectorAll("article img")]
      .filter((img) => !(img.getAttribute("alt") || "").trim())
      .map((img) => img.getAttribute("src")),
    wideTables: [...document.querySelectorAll("article table")]
      .filter((t) => t.getBoundingClientRect().width > t.parentElement.clientWidth + 1)
      .map((t) => t.innerText.trim().slice(0, 60)),
    brokenFonts: [...document.fonts]
      .filter((font) => font.status === "error")
      .map((font) => font.family),
  };
}"""

# The widest things sticking out of the screen and not inside a scroll box.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const scrollWidth = document.documentElement.scrollWidth;
  const viewport = window.innerWidth;
  if (scrollWidth <= viewport + 1) return {scrollWidth, viewport, culprits: []};
  const inScrollBox = (e) => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") return true;
    }
    return false;
  };
  const wide = [...document.body.querySelectorAll("*")].filter((e) => {
    const box = e.getBoundingClientRect();
    const sticksOut = box.right > width + 1 || e.scrollWidth > e.clientWidth + 1;
    return sticksOut && box.width > 0 && !inScrollBox(e)
      && getComputedStyle(e).overflowX === "visible";
  });
  // The innermost ones: the element whose content is too wide, not its parents.
  const out = wide
    .filter((e) => !wide.some((other) => other !== e && e.contains(other)))
    .map((e) => `<${e.tagName.toLowerCase()} class="${e.className}"> ` +
                `${Math.round(e.getBoundingClientRect().width)} px wide, ` +
                `content ${e.scrollWidth} px: ` + e.textContent.trim().slice(0, 60));
  return {scrollWidth, viewport, culprits: out.slice(0, 5)};
}"""

# Links of a navigation that a person can see and click on the screen now.
VISIBLE_LINKS = """(selector) => [...document.querySelectorAll(selector)]
.filter((a) => {
  const box = a.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) return false;
  if (box.left < 0 || box.right > innerWidth + 1) return false;
  if (box.top < 0 || box.bottom > innerHeight) return false;
  const hit = document.elementFromPoint(box.left + box.width / 2,
                                        box.top + box.height / 2);
  return hit !== null && (hit === a || a.contains(hit));
}).map((a) => a.getAttribute("href"))"""

NEXT_FRAME = "() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 50)))"


def url(relative: str) -> str:
    return (BOOK / relative).as_uri()


def assert_clean(page, what: str) -> None:
    log = page.log
    assert not log.external, f"{what}: requests off the machine: {log.external}"
    assert not log.failed, f"{what}: local files failed to load: {log.failed}"
    assert not log.errors, f"{what}: console errors: {log.errors}"


def test_the_book_is_built():
    assert "intro.html" in PAGES, f"no intro.html among {PAGES}"
    assert "search.html" in PAGES
    assert any(p.startswith("chapters/") for p in PAGES)


@pytest.mark.parametrize("relative", PAGES)
def test_page(page, relative):
    source = (BOOK / relative).read_text(encoding="utf-8")
    redirect = REDIRECT.search(source)
    if redirect:
        target = html.unescape(redirect.group(1))
        assert (BOOK / relative).parent.joinpath(target).is_file(), target
        page.goto(url(relative))
        page.wait_for_url(f"**/{target}")
        page.wait_for_load_state("load")
        assert_clean(page, relative)
        return

    page.goto(url(relative), wait_until="load")
    found = page.evaluate(INSPECT)
    assert found["typeset"] == found["math"] == found["rendered"], (
        f"{relative}: {found['math']} math elements, {found['typeset']} typeset, "
        f"{found['rendered']} rendered by MathJax"
    )
    assert not found["texErrors"], f"{relative}: TeX errors {found['texErrors']}"
    assert not found["brokenImages"], f"{relative}: images {found['brokenImages']}"
    assert not found["brokenFonts"], f"{relative}: fonts {found['brokenFonts']}"
    assert not found["rawTables"], (
        f"{relative}: Markdown tables shown as text: {found['rawTables']}"
    )
    assert not found["missingAlt"], (
        f"{relative}: images without alt text {found['missingAlt']}"
    )
    assert not found["wideTables"], (
        f"{relative}: tables wider than the column at {DESKTOP['width']} px: "
        f"{found['wideTables']}"
    )

    page.set_viewport_size(PHONE)
    page.evaluate(NEXT_FRAME)
    wide = page.evaluate(OVERFLOW)
    assert wide["scrollWidth"] <= wide["viewport"] + 1, (
        f"{relative} scrolls sideways at {wide['viewport']} px "
        f"(document {wide['scrollWidth']} px wide): {wide['culprits']}"
    )
    assert_clean(page, relative)


def _open_on_phone(page, relative: str, toggle: str, links: str) -> list[str]:
    page.set_viewport_size(PHONE)
    page.goto(url(relative), wait_until="load")
    assert page.evaluate(VISIBLE_LINKS, links) == [], (
        f"{links} is on screen before {toggle} is pressed"
    )
    button = page.locator(toggle).filter(visible=True)
    assert button.count() >= 1, f"{relative}: no visible {toggle} at 400 px"
    button.first.click()
    try:
        page.wait_for_function(
            f"() => ({VISIBLE_LINKS})({links!r}).length > 0", timeout=5_000
        )
    except PlaywrightTimeout:
        pytest.fail(f"{relative}: pressing {toggle} at 400 px shows no {links}")
    shown = page.evaluate(VISIBLE_LINKS, links)
    assert_clean(page, relative)
    return shown


def test_navigation_opens_on_a_phone(page):
    shown = _open_on_phone(
        page, "intro.html", "button.primary-toggle", "nav.bd-docs-nav a"
    )
    assert any("chapters/" in href for href in shown), shown


def test_page_contents_open_on_a_phone(page):
    chapter = next(p for p in PAGES if p.startswith("chapters/"))
    shown = _open_on_phone(page, chapter, "button.secondary-toggle", "nav.page-toc a")
    assert all(href.startswith("#") for href in shown), shown


def test_search_finds_a_word_of_the_book(page):
    page.goto(url("search.html") + f"?q={SEARCH_WORD}", wait_until="load")
    results = "#search-results ul.search li a"
    page.wait_for_selector(results)
    page.wait_for_function(
        "() => /found/i.test(document.querySelector('#search-results').innerText)"
    )
    hrefs = page.eval_on_selector_all(
        results, "links => links.map((a) => a.getAttribute('href'))"
    )
    pages = {href.split("#")[0].split("?")[0] for href in hrefs}
    assert pages and all((BOOK / p).is_file() for p in pages), hrefs
    assert_clean(page, f"search for {SEARCH_WORD!r}")


def _doctest_page() -> str | None:
    for relative in PAGES:
        if '<span class="gp">&gt;&gt;&gt; </span>' in (BOOK / relative).read_text(
            encoding="utf-8"
        ):
            return relative
    return None


def test_copy_button_copies_doctest_code_only(page):
    relative = _doctest_page()
    if relative is None:
        pytest.skip("no >>> example in the book")
    page.goto(url(relative), wait_until="load")
    # The copy button hands its text to a hidden textarea and copies that.
    page.evaluate(
        """() => document.addEventListener("copy", (event) => {
          window.copiedText = event.target.value ?? String(getSelection());
        })"""
    )
    blocks = page.locator("div.highlight pre").filter(
        has_text=re.compile("^>>> ", re.M)
    )
    assert blocks.count(), f"{relative}: no >>> block found"
    for index in range(min(blocks.count(), 5)):
        block = blocks.nth(index)
        text = block.inner_text()
        code = [
            line[4:]
            for line in text.splitlines()
            if line.startswith((">>> ", "... ")) and line[4:].strip()
        ]
        block.scroll_into_view_if_needed()
        block.hover()
        page.evaluate("() => { window.copiedText = null; }")
        block.locator("xpath=..").locator("button.copybtn").click()
        copied = page.wait_for_function("() => window.copiedText").json_value()
        lines = [line for line in copied.splitlines() if line.strip()]
        assert lines == code, f"the copy button of {text!r} copied {copied!r}"
    assert_clean(page, relative)
