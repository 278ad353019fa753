"""Instruction tuning launched from the form, in a real browser (headless Chromium through Playwright) on an
empty runs folder with no ../shared and no network: the ``sft`` tab's defaults with a few rows, two epochs
and one small calibration task, submitted; the job page then draws that task's ECE and accuracy before
training and after each epoch, the figures the run's events hold. The screenshot goes to
tests/output/sft-job.png."""
import re

import pytest
import yaml

from lab.core.events import read_events
from tests.browser.helpers import box, fill, shot

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

JOB_TIMEOUT_MS = 600_000
CALIBRATION = "- {task: mcq, dataset: arc_easy, data_files: [bundled], split: validation, limit: 10}"
TYPED = (("limit", "4"), ("epochs", "2"), ("calibration", CALIBRATION), ("batch_size", "2"), ("max_length", "256"),
         ("bootstrap", "20"))  # the last three are under "More options"
LABEL = "mcq · arc_easy/validation"  # the task's label on the job page, as the sft kind names it
TRACES_JS = """() => {
    const plot = document.querySelector('#job-training .js-plotly-plot');
    return plot && plot.data ? plot.data.map(t => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y)})) : [];
}"""


@pytest.mark.slow
@pytest.mark.model
def test_sft_from_the_form_shows_ece_per_epoch_on_its_job_page(newcomer):
    page, (ctx, url) = newcomer
    page.goto(url)
    page.get_by_role("tab", name="sft", exact=True).click()
    # "More options" mounts its fields when first opened: open it before typing anything, so that no
    # value is typed into a field the page is still building.
    page.locator("#launch-sft").get_by_text("More options").click()
    box(page, f"sft-{TYPED[-1][0]}").wait_for()
    for field, value in TYPED:
        fill(page, f"sft-{field}", value)
    assert {f: box(page, f"sft-{f}").input_value() for f, _ in TYPED} == dict(TYPED)
    page.locator("#submit-sft").click()
    page.locator("#launch-message-sft").get_by_text(re.compile("Job 1 queued")).wait_for()
    config = yaml.safe_load((ctx.runs / "00001-sft" / "config.yaml").read_text())
    assert (config["limit"], config["epochs"], config["batch_size"], config["max_length"], config["bootstrap"]) == (
        4, 2, 2, 256, 20), "the job was not queued with the values typed"
    page.get_by_role("tab", name="Jobs").click()
    page.locator("#job-status").get_by_text(re.compile("Job 1 · sft")).wait_for()
    page.locator("#job-status").get_by_text("succeeded").wait_for(timeout=JOB_TIMEOUT_MS)
    page.wait_for_function(f"() => ({TRACES_JS})().some(t => t.name.endsWith('{LABEL} val ECE'))")
    traces = {t["name"]: t for t in page.evaluate(TRACES_JS)}
    events = [e for e in read_events(ctx.runs / "00001-sft" / "events.jsonl")[0] if e["stage"] == "train_eval"]
    assert [e["step"] for e in events] == [0, 2, 4]  # before training, then after each of the 2 epochs
    for metric, name in (("ece", "val ECE"), ("accuracy", "val accuracy")):
        drawn = traces[f"train · {LABEL} {name}"]
        assert drawn["x"] == [e["epoch"] for e in events] == [0, 1, 2]
        assert drawn["y"] == pytest.approx([e["tasks"]["t0-mcq"][metric] for e in events])
    assert any(name.endswith("loss") for name in traces)
    page.locator("#job-training").scroll_into_view_if_needed()
    shot(page, "sft-job.png")

