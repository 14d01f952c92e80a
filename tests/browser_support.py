"""Chromium through Playwright for the browser tests (tests/browser/ and the dashboard's real-stack test).

One browser per test module, not per session: Playwright's sync API keeps an event loop in the main thread while it
lives, and Django refuses synchronous ORM calls while a loop is there. DJANGO_ALLOW_ASYNC_UNSAFE is set only while
a browser is open (the ORM calls of those tests are ours and synchronous), so it cannot leak into other tests or
into the subprocesses they start (`check --deploy` rightly refuses it)."""
from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def chromium():
    if not CHROMIUM.exists():
        pytest.skip("browser tests need Debian's Chromium at /usr/bin/chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                yield browser
            finally:
                browser.close()


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)  # pages refresh every 5 s; a loaded host skips a tick now and then
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.js_errors = errors
    # What the Content-Security-Policy refused (Chromium reports each refusal as a console error).
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text)
            if message.type == "error" and "Content Security Policy" in message.text else None)
    page.csp_violations = violations
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def screenshot():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
