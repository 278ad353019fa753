"""How long the app's page takes to open: from the address typed to the first click it answers.

    python -m bench.page_load [--loads 5] [--app DIR ...]

Starts each checkout's ``app.py`` (``--app``, default this one; e.g. a ``git worktree`` of an older
commit beside it, for before/after in the same run) on a fresh runs directory, and opens its page
``--loads`` times, each in a fresh headless Chromium (Playwright): the seconds from ``goto`` until a
click on the Selective prediction tab is taken, and Chromium's main-thread busy time and script time
(CDP ``Performance.getMetrics``) over the same span. It also counts the app's events (as it opens, the page walks
every event for every component) and those the page runs as it loads (a gradio ``load`` event with a server function:
each one's status updates redraw every component's status in the browser). Medians, and each checkout's ratio to the
first one.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

from bench._app import CHROMIUM, served
from bench._harness import REPO, RESULTS, Timer, Transcript, parser, write_result


def _events(url: str) -> tuple[int, int]:
    """The app's events (the page walks every one for every component as it opens), and those with a server
    function that the page runs as it loads, from the app's config."""
    config = json.loads(urllib.request.urlopen(f"{url}config", timeout=30).read())
    loads = sum(1 for dep in config["dependencies"]
                if dep.get("backend_fn") and any(event == "load" for _, event in dep["targets"]))
    return len(config["dependencies"]), loads


def measure(app_dir: Path, loads: int) -> dict[str, list[float] | int]:
    """Seconds to the first click answered, Chromium's task and script seconds, for each of ``loads`` openings."""
    result: dict[str, list[float] | int] = {"answered": [], "task": [], "script": []}
    with served(app_dir, Path(tempfile.mkdtemp(prefix="page-load-"))) as (url, _):
        result["events"], result["load events"] = _events(url)
        with sync_playwright() as p:
            for _ in range(loads):
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.set_default_timeout(120_000)
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                timer = Timer()
                page.goto(url)
                page.get_by_role("tab", name="Selective prediction").click()
                result["answered"].append(timer.seconds)
                metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
                result["task"].append(metrics["TaskDuration"])
                result["script"].append(metrics["ScriptDuration"])
                browser.close()
    return result


def main() -> None:
    options = parser(__doc__, out=RESULTS / "page_load_cpu.txt")
    options.add_argument("--loads", type=int, default=5, help="openings of the page per checkout")
    options.add_argument("--app", type=Path, nargs="+", default=[REPO], help="the checkouts whose app.py is measured")
    args = options.parse_args()
    report = Transcript()
    report.print(f"{args.loads} openings of the page each, seconds (median; each opening):")
    first = None
    for app in args.app:
        found = measure(app.resolve(), args.loads)
        answered = statistics.median(found["answered"])
        first = first or answered
        each = ", ".join(f"{s:.2f}" for s in found["answered"])
        report.print(f"  {app.resolve()}: {found['events']} events, {found['load events']} run as it loads; first "
                     f"click answered after {answered:.2f} s ({each}; {answered / first:.2f}× the first checkout); Chromium's main "
                     f"thread busy {statistics.median(found['task']):.2f} s, script "
                     f"{statistics.median(found['script']):.2f} s")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
