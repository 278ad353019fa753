"""The Launch form in a real browser (headless Chromium through Playwright): the evaluate form follows task clm
and brings Show config into view (issue 43's round 3), and an lm-eval task picked from the dataset picker is
queued as picked (issue 40). Screenshots go to tests/output/harness_*.png."""
import re

import pytest

from lab.data.templates import LM_EVAL

pytestmark = pytest.mark.browser


IN_VIEW_JS = """(id) => { const r = document.getElementById(id).getBoundingClientRect();
    return r.height > 0 && r.top >= 0 && r.top < window.innerHeight; }"""


@pytest.mark.e2e
@pytest.mark.slow
def test_the_evaluate_form_shows_clms_dataset_and_brings_show_config_into_view(served_bare, new_page):
    """In Chromium: picking task clm shows text / test in the form (only Show config said so), and the
    YAML that Show config prints below a form taller than the window is brought into view."""
    from tests.browser.helpers import box, pick

    _, url = served_bare
    page = new_page(height=800)
    page.goto(url)
    page.get_by_role("tab", name="evaluate", exact=True).click()
    pick(page, "evaluate-task", "^clm$")
    page.wait_for_function("() => document.querySelector('#evaluate-dataset input').value === 'text'")
    assert box(page, "evaluate-split").input_value() == "test"
    page.locator("#launch-bar-evaluate").get_by_role("button", name="Show config").click()
    page.locator("#launch-config-evaluate").get_by_text("task: clm").wait_for()
    page.wait_for_function(IN_VIEW_JS, arg="launch-config-evaluate")


@pytest.mark.slow
def test_a_user_picks_an_lm_eval_task_on_the_launch_form_and_queues_it(tmp_path, new_page):
    """Scoring left at letter from an earlier try; the picker opened (lm-eval's list arrives), searched,
    a shipped task picked: scoring, template and data files follow, and Submit queues it as picked."""
    from tests.browser.helpers import box, fill, pick, serving, shot
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    with serving(ctx) as url:  # no scheduler: the job stays queued
        page = new_page()
        page.goto(url)
        pick(page, "evaluate-scoring", "^letter$")
        box(page, "evaluate-dataset").click()
        page.get_by_role("option", name=re.compile("hub \\(needs the network\\)")).first.wait_for(timeout=120_000)
        box(page, "evaluate-dataset").fill("hellaswag")
        shot(page, "harness_picker_open.png")
        box(page, "evaluate-dataset").fill("bundled_boolq")
        page.get_by_role("option", name=re.compile("^lm-eval:bundled_boolq — offline")).first.click()
        page.wait_for_function("() => document.querySelector('#evaluate-scoring input').value === 'cloze'")
        fill(page, "evaluate-num_fewshot", "2")
        fill(page, "evaluate-limit", "3")
        page.locator("#evaluate-dataset").scroll_into_view_if_needed()
        shot(page, "harness_launch_form.png")
        page.locator("#submit-evaluate").click()
        page.locator("#launch-message-evaluate").get_by_text(re.compile("queued")).wait_for()
        shot(page, "harness_launch_queued.png")
    config = ctx.store.list()[0].config_dict
    assert (config["dataset"], config["scoring"], config["template"], config["num_fewshot"], config["data_files"]) \
        == ("lm-eval:bundled_boolq", "cloze", LM_EVAL, 2, [])
