"""The README's controlled-task figure: the Reliability page's own figure of two evaluations made by
bench/controlled.py (the base, and the same model after 16 epochs on 100 noisy questions), each
followed by the Bayes predictor on the same questions, drawn in headless Chromium.

    .venv/bin/python scripts/figure_controlled.py [--bench runs/bench-controlled-seeds/seed-0]
        [--out assets/controlled/reliability.png]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a plain script from anywhere

RUNS = {"e1-eval-base-test": "base",
        "e1-eval-full-test": "base + 16 epochs"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, default=REPO / "runs" / "bench-controlled-seeds" / "seed-0")
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "controlled" / "reliability.png")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from lab.results.runs import write_label
    from ui.context import LabContext
    from ui.reliability_page import VIEWS, reliability_view

    with tempfile.TemporaryDirectory() as tmp:
        for name, label in RUNS.items():
            shutil.copytree(args.bench / name, Path(tmp) / name)
            write_label(Path(tmp) / name, label)
        figure, message = reliability_view(LabContext(Path(tmp)), list(RUNS), None, VIEWS[0])
        if figure is None:
            raise SystemExit(f"no figure: {message}")
        figure.update_layout(width=1500, height=560)
        html = Path(tmp) / "figure.html"
        html.write_text(figure.to_html(include_plotlyjs=True, full_html=True), encoding="utf-8")
        chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1520, "height": 580})
            page.goto(html.as_uri())
            page.locator(".js-plotly-plot").wait_for()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".js-plotly-plot").screenshot(path=str(args.out))
            browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
