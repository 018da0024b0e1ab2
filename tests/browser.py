"""Real headless Chromium (Debian's /usr/bin/chromium) driven by playwright-python, network off.

A pytest plugin module, listed in tests/conftest.py's pytest_plugins: one Chromium per session for
every test module (importing the fixtures into two modules would start two playwright sessions,
which playwright refuses). Never downloads a browser (no ``playwright install``): it launches the system
Chromium. Every request other than the page's own file:// URL is blocked and recorded, so a test can
assert that a report asked for nothing over the network. When Chromium (or playwright) is missing,
tests that use it FAIL under CI=true and are skipped otherwise.
"""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from need import missing

CHROMIUM = os.environ.get("PERFSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
OUTPUT = Path(__file__).resolve().parent / "_output"


def _missing(why: str):
    missing(f"{why} (the HTML tests need it; tests/install.sh installs chromium)")


@dataclass
class PageResult:
    url: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # every request other than the page itself
    screenshot: bytes = b""
    text: str = ""
    charts: list[dict] = field(default_factory=list)  # [{id, plotly, svg, traces}] per [data-chart] container
    texts: dict = field(default_factory=dict)  # selector -> innerText, for the selectors asked for


@pytest.fixture(scope="session")
def chromium():
    """A launched playwright Browser on the system Chromium (session-wide)."""
    if not Path(CHROMIUM).exists():
        _missing(f"chromium not found at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright (python) is not installed: pip install playwright (never `playwright install`)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def load_page(browser, path: Path, screenshot: str | None = None, width: int = 1400,
              select: tuple[str, ...] = (), actions=None) -> PageResult:
    """Load a local HTML file with the network cut off, wait for its charts, and collect console
    errors, blocked requests, chart state, the page text and a full-page screenshot (also saved as
    tests/_output/<screenshot> when a name is given). ``select``: CSS selectors whose innerText to
    return (None when absent); ``actions(page)``: called once the charts are drawn (clicks...)."""
    url = Path(path).resolve().as_uri()
    ctx = browser.new_context(viewport={"width": width, "height": 1000}, offline=True, service_workers="block")
    try:
        page = ctx.new_page()
        res = PageResult(url=url)

        def route(r):
            if r.request.url == url:
                r.continue_()
            else:
                res.blocked.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("console", lambda m: res.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: res.page_errors.append(str(e)))
        page.goto(url, wait_until="load")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('[data-chart]')).every("
            "el => el.classList.contains('js-plotly-plot') && el.querySelector('svg.main-svg'))",
            timeout=30_000)
        page.wait_for_timeout(200)
        res.charts = page.evaluate(
            "() => Array.from(document.querySelectorAll('[data-chart]')).map(el => ({"
            "id: el.id, plotly: el.classList.contains('js-plotly-plot'),"
            "svg: el.querySelectorAll('svg.main-svg').length,"
            "traces: (el.data || []).map(t => ({name: t.name, n: (t.x || []).length})) }))")
        if actions is not None:
            actions(page)
        res.text = page.inner_text("body")
        for sel in select:
            el = page.query_selector(sel)
            res.texts[sel] = el.inner_text() if el else None
        res.screenshot = page.screenshot(full_page=True)
        if screenshot:
            OUTPUT.mkdir(exist_ok=True)
            (OUTPUT / screenshot).write_bytes(res.screenshot)
        return res
    finally:
        ctx.close()


@pytest.fixture
def open_page(chromium):
    """``open_page(path, screenshot=None) -> PageResult`` (see :func:`load_page`)."""
    return lambda path, screenshot=None, **kw: load_page(chromium, path, screenshot, **kw)


# JS: decode the base64 PNG ``b64`` on a canvas ``c``; ``px`` holds its RGBA bytes, row by row
_DECODE_PNG = """
    const img = new Image();
    img.src = "data:image/png;base64," + b64;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const px = g.getImageData(0, 0, c.width, c.height).data;
"""


def eval_png(page, png: bytes, body: str, arg=None):
    """Run the JS ``body`` in ``page`` on a PNG decoded by the browser: it sees ``px`` (RGBA bytes),
    ``c.width``/``c.height`` and ``arg`` (any JSON value), and what it returns comes back."""
    return page.evaluate("async ([b64, arg]) => {" + _DECODE_PNG + body + "}", [base64.b64encode(png).decode(), arg])


def png_colours(chromium, png: bytes, step: int = 3) -> int:
    """Distinct RGB colours in a PNG (every ``step``-th pixel), decoded by the browser on a canvas:
    a blank or single-colour screenshot has one or two, a report with charts has hundreds."""
    ctx = chromium.new_context(offline=True)
    try:
        page = ctx.new_page()
        page.set_content("<html><body></body></html>")
        return eval_png(page, png, """
            const step = arg;
            const seen = new Set();
            for (let i = 0; i < px.length; i += 4 * step) seen.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
            return seen.size;""", step)
    finally:
        ctx.close()
