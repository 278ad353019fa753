"""Headless Chromium through Playwright, for the browser tests (tests/browser/test_first_ten_minutes.py, tests/browser/test_pages.py):
the page, its widgets by elem_id, and screenshots into tests/output/."""
from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

OUTPUT = Path(__file__).parents[1] / "output"
# How long a wait for the page gives up after: a step takes a few seconds on two quiet cores, but on parallel workers
# (`pytest -n 3`) the others run jobs and ranks beside Chromium, and 30 s was overrun there.
WAIT_MS = 90_000


def chromium() -> str:
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("no Chromium on this machine (scripts/install_browser.sh installs Debian's where it can)")
    return path


@contextmanager
def serving(ctx) -> Iterator[str]:
    """The app built on ``ctx`` (a ``ui.context.LabContext``), served on a free local port with the
    app's CSS, no scheduler; yields its address and closes it after."""
    from tests.helpers import free_port
    from ui.app import build
    from ui.messages import CSS

    demo = build(ctx)
    for attempt in range(3):
        port = free_port()
        try:
            demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
            break
        except ValueError as e:  # gradio's one 3-second probe of the new server timed out: parallel workers load the cores
            demo.close()
            if "localhost is not accessible" not in str(e) or attempt == 2:
                raise
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def launch(playwright):
    """Headless Chromium: the machine's own, no sandbox (it runs as root here)."""
    return playwright.chromium.launch(executable_path=chromium(), headless=True,
                                      args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])


def open_page(browser, height: int = 1000, width: int = 1440):
    """A page of that size in a context of its own (no cookies, storage or cache from another test)
    whose waits give up after WAIT_MS; closing its context (``page.context.close()``) closes it."""
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(WAIT_MS)
    return page


def shot(page, name: str, full_page: bool = False) -> None:
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / name), full_page=full_page)


def box(page, elem_id: str):
    return page.locator(f"#{elem_id}").locator("input, textarea").first


def fill(page, elem_id: str, value: str) -> None:
    field = box(page, elem_id)
    field.fill(value)
    field.press("Tab")  # commit the value to the server-side state


def pick(page, elem_id: str, option: str) -> None:
    """Pick ``option`` (a regex on its label) in the dropdown ``elem_id``."""
    box(page, elem_id).click()
    page.get_by_role("option", name=re.compile(option)).first.click()
    page.keyboard.press("Escape")


def recalibrate(page, method: str):
    """On the Recalibration page: fit ``method`` on the val run, apply it to the test run; the
    before/after figure (a locator: wait for it)."""
    page.get_by_role("tab", name="Recalibration").click()
    pick(page, "recal-fit", "^val · ")
    pick(page, "recal-apply", "^test · ")
    page.locator("#recal-method").get_by_text(method).click()
    page.locator("#recal-run").click()
    page.locator("#recal-message").get_by_text(re.compile("applied to test · ")).wait_for()
    return page.locator(".js-plotly-plot >> visible=true").filter(has_text="before").first


def until_shown(act: Callable[[], None], shown, try_ms: int = 5_000) -> None:
    """``act`` (a click that should bring ``shown``, a locator, into view) again every ``try_ms`` until ``shown``
    shows, for WAIT_MS at most: on loaded parallel workers gradio can drop a click whose button's last event is still
    finishing, and a poll can land after the list it fills was opened."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    waited = time.perf_counter()
    while True:
        act()
        try:
            shown.wait_for(timeout=try_ms)
            return
        except PlaywrightTimeout:
            if time.perf_counter() - waited > WAIT_MS / 1000:
                raise
