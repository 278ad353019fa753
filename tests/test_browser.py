"""The app in a real browser (headless Chromium through Playwright): launch a job from the form,
see it finish on the Jobs page, move the temperature and see ECE change, and bad input answered
with a message. Screenshots go to tests/output/ (the README's comes from here)."""
import os
import re
import shutil
from pathlib import Path

import pytest

OUTPUT = Path(__file__).parent / "output"
TIMEOUT_MS = 240_000


def _chromium() -> str:
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("no Chromium on this machine (scripts/install_browser.sh installs Debian's where it can)")
    return path


@pytest.fixture
def page(served):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        yield page, served
        browser.close()


def _shot(page, name: str) -> None:
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / name), full_page=False)


def _fill(page, elem_id: str, value: str) -> None:
    box = page.locator(f"#{elem_id}").locator("input, textarea").first
    box.fill(value)
    box.press("Tab")  # commit the value to the server-side state


def test_launch_watch_and_recalibrate_in_the_browser(page, shared_data):
    page, (ctx, url) = page
    page.goto(url)
    page.get_by_role("tab", name="Launch").click()
    page.get_by_role("tab", name="evaluate").click()
    # Bad input first: each bad limit is refused with the message the CLI and the API give, and nothing is queued.
    _fill(page, "evaluate-data_files", str(shared_data / "arc_challenge" / "test.jsonl"))
    for typed, shown in (("six", "'six'"), ("inf", "inf"), ("1e400", "inf"), ("nan", "nan"), ("-1", "-1")):
        _fill(page, "evaluate-limit", typed)
        page.locator("#submit-evaluate").click()
        message = f"limit: must be an integer ≥ 1 and ≤ 10,000,000, got {shown}"
        page.locator("#launch-message-evaluate").get_by_text(message).wait_for()
    assert ctx.store.list() == []
    _fill(page, "evaluate-limit", "30")
    page.locator("#submit-evaluate").click()
    page.locator("#launch-message-evaluate").get_by_text(re.compile(r"Job \d+ queued")).wait_for()
    _shot(page, "01-launch.png")

    page.get_by_role("tab", name="Jobs").click()
    page.wait_for_function("() => document.querySelector('#jobs-table').innerText.includes('succeeded')",
                           timeout=TIMEOUT_MS)
    page.locator("#job-status").get_by_text("succeeded").wait_for()  # the newest job is shown without picking
    _shot(page, "02-jobs.png")

    page.get_by_role("tab", name="Temperature lab").click()
    page.get_by_role("button", name="↻ Refresh runs").first.click()
    picker = page.locator("#temperature-run input")
    picker.click()
    page.get_by_role("option").first.click()
    ece = page.locator("#ece-value")
    ece.wait_for()
    at_one = ece.inner_text()
    number = page.locator("#temperature-slider input[type=number]")
    number.fill("3")
    number.press("Enter")
    page.wait_for_function("v => document.querySelector('#ece-value') && "
                           "document.querySelector('#ece-value').innerText !== v", arg=at_one)
    assert page.locator("#temperature-metrics").inner_text().startswith("T = 3")
    _shot(page, "03-temperature.png")

    page.get_by_role("tab", name="Compare models").click()
    page.locator("#compare-run").click()  # no question typed
    page.get_by_text("question: must not be empty").wait_for()
    _shot(page, "04-compare-error.png")
