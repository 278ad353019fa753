"""The Life cycle page in a real browser (headless Chromium through Playwright), on a real series:
three tiny models of growing size on two tasks, run in this process as the worker runs it. The page
draws three points per task in each row, and a selected row opens its run in Reliability.
The screenshot goes to tests/output/lifecycle.png."""
import re

import pytest

from tests.browser.helpers import box, serving, shot
from tests.helpers import SERIES_SIZES, SERIES_TASKS, run_series, tiny_models, write_series

pytestmark = pytest.mark.browser

# Per subplot (xy, x2y2 …), the markers plotly drew for each trace of the runs themselves: a trace's
# group carries its data (d3's __data__), so the traces are found by their name, not their order.
POINTS_JS = """() => {
    const plot = document.querySelector('#lifecycle-plot .js-plotly-plot');
    const out = {};
    for (const sub of plot.querySelectorAll('.cartesianlayer > g.subplot')) {
        const id = [...sub.classList].find(c => c !== 'subplot');
        out[id] = [...sub.querySelectorAll('.scatterlayer g.trace')]
            .filter(t => t.__data__ && t.__data__[0].trace.name.endsWith('of each run, 95 % bootstrap interval'))
            .map(t => t.querySelectorAll('.points path').length);
    }
    return out;
}"""


@pytest.fixture
def app(tmp_path):
    """The app on a runs folder holding one finished series, with no scheduler."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    run_series(ctx.runs / "00001-series", tiny_models(tmp_path / "models"))
    with serving(ctx) as url:
        yield ctx, url


@pytest.mark.model
@pytest.mark.slow
def test_life_cycle_draws_three_points_per_task_and_opens_a_row_in_reliability(browser_page):
    page, (ctx, url) = browser_page
    page.goto(url)
    page.get_by_role("tab", name="Life cycle").click()
    page.wait_for_function(f"() => document.querySelector('#lifecycle-plot .js-plotly-plot') "
                           f"&& Object.keys(({POINTS_JS})()).length === 4")
    assert re.match(r"00001 · params · 6 cells: 3 points × 2 tasks · ", box(page, "lifecycle-series").input_value())
    per_subplot = page.evaluate(POINTS_JS)
    # 2 tasks × (ECE, accuracy): each panel one trace of the runs, one marker per model
    assert per_subplot == {"xy": [3], "x2y2": [3], "x3y3": [3], "x4y4": [3]}, per_subplot
    titles = page.locator("#lifecycle-plot .annotation-text").all_text_contents()
    assert "mcq · synthetic/test" in titles and "clm · text/test" in titles
    ticks = page.locator("#lifecycle-plot .xaxislayer-above text").all_text_contents()
    assert len(SERIES_SIZES) <= len(ticks) and all(re.fullmatch(r"[\d.]+K", t) for t in ticks), ticks
    assert page.locator("#lifecycle-cells").get_by_text("00001-series/cells/m2_t1-clm").is_visible()
    assert page.locator("#lifecycle-csv").is_visible()
    shot(page, "lifecycle.png", full_page=True)

    page.locator("#lifecycle-cells").get_by_text("00001-series/cells/m1_t0-mcq").click()
    picked = f"Picked m1 × {SERIES_TASKS[0]['task']} · synthetic/test (00001-series/cells/m1_t0-mcq)"
    page.locator("#lifecycle-picked").get_by_text(picked).wait_for()
    page.locator("#lifecycle-open").click()
    page.get_by_role("tab", name="Reliability", selected=True).wait_for()
    page.locator("#reliability-runs").get_by_text(re.compile(r"^00001 · cells/m1_t0-mcq · ")).wait_for()
    page.locator(".js-plotly-plot >> visible=true").filter(has_text="cells/m1_t0-mcq").first.wait_for()


# ---------------------------------------------------------------- a click on a marker (issue 43), on a written series
@pytest.fixture
def lifecycle_app(tmp_path):
    """The app on a runs folder holding a finished series of three sizes on one task, no model."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    write_series(ctx.runs, 3)
    with serving(ctx) as url:
        yield ctx, url


@pytest.mark.slow
def test_clicking_a_marker_on_the_life_cycle_plot_opens_its_run_in_reliability(lifecycle_app, new_page):
    ctx, url = lifecycle_app
    page = new_page(height=1000, width=1440)
    page.goto(url)
    page.get_by_role("tab", name="Life cycle").click()
    markers = page.locator("#lifecycle-plot .subplot.xy .scatterlayer .trace .points path")
    page.wait_for_function("() => document.querySelectorAll("
                           "'#lifecycle-plot .subplot.xy .scatterlayer .trace .points path').length >= 3")
    middle = markers.nth(1).bounding_box()
    x, y = middle["x"] + middle["width"] / 2, middle["y"] + middle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    page.get_by_role("tab", name="Reliability", selected=True).wait_for()
    page.locator("#reliability-runs").get_by_text(re.compile(r"^00003 · cells/m1_t0-mcq")).wait_for()
    shot(page, "newcomer-lifecycle-click.png")
