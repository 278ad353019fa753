"""A newcomer's first ten minutes, in a real browser (headless Chromium through Playwright), on a
fresh runs folder with no ../shared and no network: launch the default evaluation, see its numbers
and diagram on its job page, launch a second run, compare them side by side, move the temperature,
read the over-confident wrong answers, and download the results. Bad input is answered with a
message naming the field and nothing is queued. Screenshots go to tests/output/; the README's come
from here."""
import csv
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.browser.helpers import box as _box
from tests.browser.helpers import fill as _fill
from tests.browser.helpers import pick as _pick
from tests.browser.helpers import recalibrate as _recalibrate
from tests.browser.helpers import shot as _shot
from tests.browser.helpers import until_shown

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

JOB_TIMEOUT_MS = 300_000
LIMIT = "40"  # questions per run: enough for a diagram, short enough for a 2-core CI machine


def _submit(page, expect: str) -> None:
    page.locator("#submit-evaluate").click()
    page.locator("#launch-message-evaluate").get_by_text(re.compile(expect)).wait_for()


def _refused(page, expect: str) -> None:
    """Submit until the refusal ``expect`` shows (:func:`tests.browser.helpers.until_shown`): the last refusal's
    message can show before its event finishes, and gradio drops a click on the button meanwhile."""
    until_shown(page.locator("#submit-evaluate").click,
                page.locator("#launch-message-evaluate").get_by_text(re.compile(expect)))


def _refused_and_nothing_queued(page, ctx) -> None:
    """Bad values are refused at submit, by field name; none of them queues a job."""
    for typed, shown in (("six", "'six'"), ("inf", "inf"), ("-1", "-1")):
        _fill(page, "evaluate-limit", typed)
        _refused(page, re.escape(f"limit: must be an integer ≥ 1 and ≤ 10,000,000, got {shown}"))
    _fill(page, "evaluate-limit", LIMIT)
    page.get_by_text("More options").first.click()
    _fill(page, "evaluate-temperature", "hot")
    _refused(page, "temperature: expected a positive number")
    _fill(page, "evaluate-temperature", "")
    _fill(page, "launch-gpus-evaluate", "1")
    _refused(page, "GPU")
    _fill(page, "launch-gpus-evaluate", "0")
    assert ctx.store.list() == []


def _wait_done(page, since: float) -> float:
    """Seconds from ``since`` to the first progress the job page shows; then waits until it is done."""
    page.wait_for_function(
        "() => /loading|scoring|\\d+\\/\\d+/.test(document.querySelector('#job-status').innerText)")
    first_progress = time.perf_counter() - since
    page.locator("#job-status").get_by_text("succeeded").wait_for(timeout=JOB_TIMEOUT_MS)
    return first_progress


@pytest.mark.slow
@pytest.mark.model
def test_a_newcomers_first_ten_minutes(newcomer):
    page, (ctx, url) = newcomer
    page.goto(url)
    page.get_by_role("tab", name="evaluate").click()
    _refused_and_nothing_queued(page, ctx)

    # 1. The default evaluation, as it comes: the bundled model on the bundled ARC-Easy dev file.
    submitted = time.perf_counter()
    _submit(page, r"Job 1 queued")
    _shot(page, "01-launch.png")
    page.get_by_role("tab", name="Jobs").click()
    page.locator("#job-status").get_by_text(re.compile("Job 1 · evaluate")).wait_for()  # opened on it, unpicked
    first_progress = _wait_done(page, submitted)
    results = page.locator("#job-results")
    results.get_by_text("Accuracy").wait_for()
    assert re.search(r"ECE [\d.]+% \(95% interval [\d.]+%–[\d.]+%\) · n = 40", results.inner_text())
    assert page.locator("#job-figure").is_visible()
    _shot(page, "02-job-page.png")
    print(f"first visible progress {first_progress:.1f} s after Submit")

    # 2. A second run of the same questions, scored by letter.
    page.get_by_role("tab", name="Launch").click()
    page.locator("#evaluate-scoring input").click()
    page.get_by_role("option", name="letter", exact=True).click()
    _submit(page, r"Job 2 queued")
    page.get_by_role("tab", name="Jobs").click()
    page.locator("#job-picker input").click()
    page.get_by_role("option", name=re.compile("^2 · evaluate")).click()
    page.locator("#job-status").get_by_text(re.compile("Job 2 · evaluate")).wait_for()
    _wait_done(page, time.perf_counter())

    # 3. Both runs side by side, named for what they are.
    page.get_by_role("tab", name="Reliability").click()
    picker = page.locator("#reliability-runs")
    picker.get_by_text(re.compile(r"00002 · bundled · arc_easy/validation · letter")).wait_for()  # the newest, drawn
    picker.locator("input").click()
    page.get_by_role("option", name=re.compile(r"00001 · bundled · arc_easy.validation · cloze")).click()
    page.keyboard.press("Escape")
    both = page.locator(".js-plotly-plot >> visible=true").filter(has_text="00001").filter(has_text="00002")
    both.first.wait_for()  # one figure, a diagram per run, each titled by its name
    both.first.scroll_into_view_if_needed()  # the README's picture: both diagrams whole, below the notes
    _shot(page, "03-reliability.png")

    # 4. The temperature lab opens on the newest run, drawn; typing and dragging T both redraw.
    page.get_by_role("tab", name="Temperature lab").click()
    ece = page.locator("#ece-value")
    ece.wait_for()
    before = ece.inner_text()
    _fill(page, "temperature-value", "3")
    page.wait_for_function("v => document.querySelector('#ece-value').innerText !== v", arg=before)
    typed = ece.inner_text()
    slider = page.locator("#temperature-log-slider input[type=range]")
    slider.focus()
    for _ in range(50):
        slider.press("ArrowRight")
    page.wait_for_function("v => document.querySelector('#ece-value').innerText !== v", arg=typed)
    page.locator("#temperature-best-ece").click()
    page.locator("#temperature-text").get_by_text("lowest ECE").wait_for()
    _shot(page, "04-temperature.png")

    # 5. Case studies open on the newest run, over-confident wrong answers first, the filter explained.
    page.get_by_role("tab", name="Case studies").click()
    page.get_by_text(re.compile("wrong answers")).first.wait_for()
    page.get_by_text(f"of {LIMIT} questions.").first.wait_for()  # the run's table, not only the page's text
    _shot(page, "05-cases.png")

    # 6. Results: both runs with their scoring and ECE interval, and as CSV.
    page.get_by_role("tab", name="Results").click()
    page.wait_for_function("() => document.querySelector('#results-table').innerText.includes('cloze (cloze_qa)')")
    assert "letter (first)" in page.locator("#results-table").inner_text()
    page.get_by_role("button", name="Export CSV").click()
    deadline = time.time() + 30
    while not (ctx.exports / "results.csv").is_file() and time.time() < deadline:
        time.sleep(0.5)
    rows = list(csv.DictReader(open(ctx.exports / "results.csv", encoding="utf-8")))
    assert [r["scoring"].split()[0] for r in rows] == ["letter", "cloze"] and all(r["ECE low"] for r in rows)
    _shot(page, "06-results.png")


def test_compare_refuses_an_empty_question(served_bare, new_page):
    ctx, url = served_bare
    page = new_page()
    page.goto(url)
    page.get_by_role("tab", name="Compare models").click()
    page.locator("#compare-question textarea").fill("")
    page.locator("#compare-run").click()
    page.get_by_text("Type a question").wait_for()
    assert ctx.store.list() == []


@pytest.mark.slow
@pytest.mark.model
def test_compare_two_models_on_one_question_and_on_a_list(newcomer):
    """The Compare page through the inference lane: FIRST's Norway question to the bundled model and
    to the same model at T = 2, then a list of three questions; bars and answers each time."""
    page, (ctx, url) = newcomer
    page.goto(url)
    page.get_by_role("tab", name="Compare models").click()
    _box(page, "compare-model-2").click()
    page.get_by_role("option", name="bundled", exact=True).click()
    _fill(page, "compare-temperature-2", "2")
    question = _box(page, "compare-question")
    assert question.input_value().startswith("What is the capital of Norway?\nOslo\nHelsinki")
    page.locator("#compare-run").click()
    message = page.locator("#compare-message")
    message.get_by_text("Done in").wait_for(timeout=JOB_TIMEOUT_MS)
    bars = page.locator(".js-plotly-plot g.trace.bars")
    bars.nth(1).wait_for()
    assert bars.count() == 2 and page.locator(".js-plotly-plot").get_by_text("A. Oslo").count() >= 1
    rows = page.locator("#compare-answers [role=row]")
    rows.nth(2).wait_for()  # the table can draw after the plot
    assert rows.count() == 3  # the header and a row per model
    page.locator("#compare-message").scroll_into_view_if_needed()
    page.mouse.wheel(0, 250)
    _shot(page, "07-compare.png")
    question.fill("Which planet is largest?\nMars\n*Jupiter\nVenus\n\nWhat colour is the sky on a clear day?\n"
                  "red\n*blue\ngreen\n\nName a large city in Norway.")
    page.locator("#compare-run").click()
    message.get_by_text("which-planet-is-largest").wait_for(timeout=JOB_TIMEOUT_MS)
    page.locator(".js-plotly-plot").get_by_text("B. Jupiter").first.wait_for()
    rows.nth(6).wait_for()
    page.get_by_text("bundled at T = 2").first.wait_for()
    assert rows.count() == 7
    page.locator("#compare-answers").scroll_into_view_if_needed()
    _shot(page, "08-compare-list.png")
    assert ctx.store.list() == []  # nothing queued: the lane answered
    assert len(list((ctx.runs / "comparisons").iterdir())) == 2
    ctx.lane.stop()


def _selective_runs(root: Path) -> None:
    """The runs the selective/recalibration walk uses: synthetic ones (tests.helpers.write_runs),
    or, with LAB_SCREENSHOT_RUNS set to a folder holding ``val/`` and ``test/`` evaluations (the
    README's screenshots: the bundled model on OpenBookQA; the controlled task's base and
    over-trained models for 12-reliability-both.png), copies of those."""
    source = os.environ.get("LAB_SCREENSHOT_RUNS")
    if source:
        for name in ("val", "test"):
            shutil.copytree(Path(source) / name, root / name)
        return
    from tests.helpers import RUNS, write_runs

    write_runs(root, RUNS[:2])


@pytest.mark.slow
def test_selective_prediction_and_the_recalibration_workbench(served_bare, new_page):
    """Two runs on the selective page, the threshold moved and the dropped questions listed, then
    opened in Case studies; the workbench fits on the validation run, applies to the test run and
    draws before/after, refuses the same questions, saves; Reliability draws ECE against bins."""
    ctx, url = served_bare
    _selective_runs(ctx.runs)
    page = new_page(height=1000)
    page.goto(url)

    page.get_by_role("tab", name="Selective prediction").click()
    page.locator("#selective-runs").get_by_text(re.compile("^test · ")).wait_for()  # the newest, picked
    _pick(page, "selective-runs", "^val · ")
    table = page.locator("#selective-table")
    page.wait_for_function("() => document.querySelector('#selective-table').innerText.split('\\n')"
                           ".filter(l => /^(test|val) · /.test(l)).length === 2")
    _fill(page, "selective-threshold", "0.8")
    heading = page.get_by_text(re.compile(r"questions of test · .* fall below the threshold 0\.80"))
    heading.wait_for()
    dropped = int(re.search(r"(\d+) questions of", heading.inner_text()).group(1))
    page.locator("#selective-dropped [role=row]").nth(1).wait_for()  # the table can draw after the heading
    assert dropped > 0
    assert "AURC" in table.inner_text()
    _shot(page, "09-selective.png", full_page=True)
    page.get_by_role("button", name=re.compile("in Case studies")).click()
    page.get_by_text(re.compile(r"of \d+ questions")).first.wait_for()
    page.locator("#cases-table [role=row]").nth(1).wait_for()  # a question's row, past the header

    _recalibrate(page, "isotonic regression").wait_for()
    assert "ECE % [95% range of resampled ECE]" in page.locator("#recal-table").inner_text()
    _shot(page, "10-recalibration.png", full_page=True)
    page.locator("#recal-save").click()
    page.get_by_text(re.compile("Saved as calibrators/")).wait_for()
    _pick(page, "recal-apply", "^val · ")
    page.locator("#recal-run").click()
    page.locator("#recal-message").get_by_text(re.compile("Refused")).wait_for()

    page.get_by_role("tab", name="Reliability").click()
    page.get_by_text("ECE vs number of bins").click()
    page.locator(".js-plotly-plot >> visible=true").filter(has_text="number of bins").first.wait_for()
    page.mouse.wheel(0, 420)
    _shot(page, "11-ece-bins.png")
    # Both runs' diagrams; a run of the controlled task is followed by the oracle's on its questions.
    page.get_by_text("reliability diagram").click()
    _pick(page, "reliability-runs", "^val · ")
    page.locator(".js-plotly-plot >> visible=true").filter(has_text="val · ").filter(
        has_text="test · ").first.wait_for()
    _shot(page, "12-reliability-both.png")


# ---------------------------------------------------------------- what a 1440 px screen shows (issue 30)
EVIL = '<a href="https://evil.example">Log in again</a><b>x</b>'
HEADERS = """id => Object.fromEntries([...document.querySelectorAll(`#${id} th.header-cell`)].map(th => {
    const text = th.querySelector('span.header'), range = document.createRange();
    range.selectNodeContents(text);
    const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
    const box = th.getBoundingClientRect();
    return [text.innerText.trim(), {left: box.left, right: box.right, lines}];
}))"""


def _headers_in_view(page, table_id: str, wanted: list[str]) -> None:
    """Each of ``wanted`` is a header of the table, wholly inside the window, and no one-word header
    is broken over two lines ("confide nce")."""
    page.locator(f"#{table_id}").scroll_into_view_if_needed()
    headers = page.evaluate(HEADERS, table_id)
    width = page.viewport_size["width"]
    for name in wanted:
        assert 0 <= headers[name]["left"] and headers[name]["right"] <= width, (table_id, name, headers[name])
    broken = [name for name, h in headers.items() if " " not in name and h["lines"] > 1]
    assert not broken, (table_id, broken)


def _in_view(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"]


def _comparison(root: Path) -> None:
    """A comparison of the bundled model and the untrained scratch one, as the lane writes it."""
    import json

    folder = root / "comparisons" / "20250101-000000-what-is-the-capital-of-norway"
    folder.mkdir(parents=True)
    answer = lambda probs, text, tokens: {"probs": probs, "prediction": max(range(4), key=probs.__getitem__),
                                          "confidence": max(probs), "generation": {
                                              "text": text, "tokens": tokens, "sequence_prob": 0.01,
                                              "first_token_prob": 0.4}}
    folder.joinpath("compare.json").write_text(json.dumps({
        "questions": [{"question": "What is the capital of Norway?",
                       "options": ["Oslo", "Helsinki", "Stockholm", "Copenhagen"], "answer": 0}],
        "results": [{"label": "bundled", "model": "bundled", "adapter": None, "temperature": None,
                     "answers": [answer([0.4, 0.3, 0.2, 0.1], "The capital of Norway is Oslo.", 8)]},
                    {"label": "scratch", "model": "scratch", "adapter": None, "temperature": None,
                     "answers": [answer([0.2, 0.3, 0.25, 0.25], "", 48)]}],
        "template": "cft_chat", "created": 0, "seconds": 1.0}))


@pytest.mark.slow
def test_what_a_1440_px_screen_shows(served_bare, new_page):
    """At 1440 × 900: a refusal beside Submit and on its field, which is brought into view, both gone once the field
    is typed in again; a typed dataset name kept and refused; the headline columns of Results, Selective prediction
    and Compare in view with no header broken mid-word; a run label's markup shown as text on a plot; the
    calibrator's "Saved as" beside its button."""
    from lab.results import runs
    ctx, url = served_bare
    page = new_page(height=900)
    page.goto(url)
    page.get_by_role("tab", name="evaluate").click()

    _fill(page, "evaluate-limit", "six")
    _refused(page, "limit: must be an integer")
    page.locator("#evaluate-limit.lab-refused").get_by_text("limit: must be an integer").wait_for()
    page.wait_for_timeout(600)  # the page scrolls the refused field into view
    assert _in_view(page, "#launch-message-evaluate") and _in_view(page, "#submit-evaluate")
    assert _in_view(page, "#evaluate-limit")
    # Typed as a user types (gradio's textbox says `input` on a key press, not on Playwright's fill): the form's one
    # event for all its fields clears the refusal and its mark.
    _box(page, "evaluate-limit").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(LIMIT)
    page.keyboard.press("Tab")
    page.wait_for_function("() => !document.querySelector('.lab-refused') && "
                           "!document.querySelector('#launch-message-evaluate').innerText.trim()")
    dataset = _box(page, "evaluate-dataset")
    dataset.click()
    dataset.fill("openbookqa")
    dataset.press("Tab")
    _refused(page, "dataset: unknown dataset 'openbookqa'.*obqa")
    assert dataset.input_value() == "openbookqa" and ctx.store.list() == []
    page.wait_for_timeout(600)
    _shot(page, "13-launch-refused.png")

    _selective_runs(ctx.runs)
    _comparison(ctx.runs)
    runs.write_label(ctx.runs / "test", EVIL)
    page.get_by_role("tab", name="Results").click()
    page.wait_for_function("() => (document.querySelector('#results-table') || {}).innerText?.includes('val · ')")
    _headers_in_view(page, "results-table", ["run", "ECE", "accuracy", "Trust", "AURC", "AUROC"])
    _shot(page, "14-results.png")

    page.get_by_role("tab", name="Selective prediction").click()
    page.wait_for_function("() => /AURC/.test(document.querySelector('#selective-table').innerText)")
    _headers_in_view(page, "selective-table", ["run", "AUROC", "AURC", "acc @ 50%", "acc @ 80%", "accuracy"])
    _shot(page, "15-selective.png")

    page.get_by_role("tab", name="Compare models").click()
    _pick(page, "compare-history", "[Nn]orway")
    page.wait_for_function("() => document.querySelector('#compare-answers').innerText.includes('scratch')")
    _headers_in_view(page, "compare-answers", ["model", "prediction", "confidence", "correct", "answer",
                                               "option probabilities"])
    assert page.locator("#compare-answers").get_by_text(re.compile(r"^\(blank: its 48 generated tokens")).count()
    _shot(page, "16-compare.png")

    page.get_by_role("tab", name="Reliability").click()
    plot = page.locator(".js-plotly-plot >> visible=true").first
    plot.get_by_text(EVIL).first.wait_for()  # the label as typed, in the title
    assert page.locator('.js-plotly-plot a[href*="evil.example"]').count() == 0

    page.get_by_role("tab", name="Recalibration").click()
    _pick(page, "recal-fit", "^val · ")
    _pick(page, "recal-apply", "^&lt;a|^<a")
    page.locator("#recal-run").click()
    page.locator("#recal-message").get_by_text(re.compile("applied to")).wait_for()
    page.locator("#recal-save").click()
    page.locator("#recal-saved").get_by_text(re.compile("Saved as calibrators/")).wait_for()
    assert _in_view(page, "#recal-saved") and _in_view(page, "#recal-save")
