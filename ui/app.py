"""The whole browser lab: one tab per page, each page built by its own module."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gradio as gr

from lab.calibration import confidence
from lab.results import runs
from ui.api import API_NAMES, register_api
from ui.cases_page import CasesControls, build_cases, questions_below
from ui.compare_page import build_compare
from ui.context import LabContext
from ui.jobs_page import JobLinks, build_jobs
from ui.knowledge_page import build_knowledge
from ui.launch_page import build_launch
from ui.lifecycle_page import LifecycleLink, build_lifecycle
from ui.recalibration_page import build_recalibration
from ui.reliability_page import build_reliability
from ui.results_page import build_results
from ui.selective_page import SelectiveLink, build_selective
from ui.temperature_page import build_temperature

PAGES = (("Launch", "launch", build_launch), ("Jobs", "jobs", build_jobs), ("Reliability", "reliability", build_reliability),
         ("Temperature lab", "temperature", build_temperature), ("Case studies", "cases", build_cases),
         ("Selective prediction", "selective", build_selective), ("Life cycle", "lifecycle", build_lifecycle),
         ("Recalibration", "recalibration", build_recalibration),
         ("Compare models", "compare", build_compare), ("Knowledge", "knowledge", build_knowledge),
         ("Results", "results", build_results))


IDLE_WAKE_S = 0.02  # how often an idle server looks for queued page events


def timers_in(block: gr.blocks.Block) -> list[gr.Timer]:
    """Every timer a page built, however deep in its rows and accordions."""
    found = [block] if isinstance(block, gr.Timer) else []
    for child in getattr(block, "children", []):
        found += timers_in(child)
    return found


def mount_with_app(timers: list[gr.Timer]) -> None:
    """Move ``timers`` out of their pages' tabs to the app's top level. Gradio mounts a tab's
    children only when it is first selected, and an update that reaches a component while it mounts
    can be lost (its ``update_state`` looks the component up, awaits, then queues the update for a
    component not yet mounted, after the mount took the queue). The update that starts a page's
    timers is sent on that same select: under load, Reliability's picker timer never started and
    the page never listed a run that finished (1 run in 15 beside a loaded suite, no tick sent in
    100 s). Mounted with the app, a timer is there before any tab is selected; it draws nothing."""
    for timer in timers:
        timer.unrender()
        timer.render()


def element(block: gr.blocks.Block, elem_id: str) -> Any:
    """The component ``elem_id`` inside ``block``, however deep (None if none): a page whose builder
    hands the app nothing (Reliability) is still reached by its picker's id."""
    if getattr(block, "elem_id", None) == elem_id:
        return block
    return next((found for child in getattr(block, "children", []) if (found := element(child, elem_id))), None)


def timer_states(visible: list[gr.Timer], every: list[gr.Timer]) -> list[gr.Timer]:
    """The update that runs the visible page's timers and stops all others."""
    return [gr.Timer(active=any(t is v for v in visible)) for t in every]


def poll_when_shown(demo: gr.Blocks, tab: gr.Tab, timers: list[gr.Timer]) -> None:
    """Run a page's polls the moment its tab is selected, as well as on its timers: a timer's first
    tick comes one period after it starts, and until then a page shows what it held when it was
    last visible (Reliability sat empty for seconds before drawing a run finished meanwhile)."""
    ticks = {(timer._id, "tick") for timer in timers}
    for poll in [fn for fn in demo.fns.values() if ticks & set(fn.targets)]:
        tab.select(poll.fn, inputs=poll.inputs, outputs=poll.outputs, show_progress="hidden")


def open_run(ctx: LabContext, tab_id: str, visible: list[gr.Timer], every: list[gr.Timer], name: Any):
    """A job page's "open in …" button: that page's tab, its picker on the job's run (listed afresh:
    the run may be newer than the page's last poll) and its timers running."""
    return (gr.Tabs(selected=tab_id), gr.update(choices=runs.evaluation_choices(ctx.runs), value=name),
            *timer_states(visible, every))


def open_in_reliability(ctx: LabContext, visible: list[gr.Timer], every: list[gr.Timer], name: Any):
    """The Life cycle page's button: Reliability on the selected cell's evaluation; a name that is no
    evaluation (a cell removed since, or one no page offered) opens nothing."""
    if runs.evaluation(ctx.runs, name) is None:
        return (gr.skip(),) * (2 + len(every))
    return open_run(ctx, "reliability", visible, every, [name])  # its picker takes several runs


def open_below_threshold(ctx: LabContext, visible: list[gr.Timer], every: list[gr.Timer], names: Any, signal: Any,
                         threshold: Any, order: Any):
    """The selective page's link: Case studies on its first run, every question whose confidence
    signal is below the threshold (its range set on the same signal), in the user's order."""
    first = names[0] if isinstance(names, list) and names else None
    known = signal if signal in confidence.SIGNALS else confidence.DEFAULT
    below = float(threshold) if isinstance(threshold, (int, float)) else 1
    return (gr.Tabs(selected="cases"), gr.update(choices=runs.evaluation_choices(ctx.runs), value=first),
            *questions_below(ctx, first, known, below, order), *timer_states(visible, every))


def _picker(built: Any) -> gr.Dropdown:
    return built.picker if isinstance(built, CasesControls) else built


def _wire_links(ctx: LabContext, tabs: gr.Tabs, built: dict[str, Any], timers: dict[str, list[gr.Timer]],
                reliability: gr.Dropdown) -> None:
    every = [t for page in timers.values() for t in page]
    links: JobLinks = built["jobs"]
    for tab_id, button in links.buttons.items():
        button.click(functools.partial(open_run, ctx, tab_id, timers[tab_id], every), inputs=links.run,
                     outputs=[tabs, _picker(built[tab_id]), *every], show_progress="hidden")
    selective: SelectiveLink = built["selective"]
    cases: CasesControls = built["cases"]
    selective.button.click(functools.partial(open_below_threshold, ctx, timers["cases"], every),
                           inputs=[selective.names, selective.signal, selective.threshold, cases.order],
                           outputs=[tabs, cases.picker, *cases.opened(), *every],
                           show_progress="hidden")
    lifecycle: LifecycleLink = built["lifecycle"]
    lifecycle.button.click(functools.partial(open_in_reliability, ctx, timers["reliability"], every),
                           inputs=lifecycle.run, outputs=[tabs, reliability, *every], show_progress="hidden")


def preload_plots(demo: gr.Blocks) -> None:
    """Fetch and run the browser's plotting code (plotly.js, 1.3 MB) as the app loads. Gradio
    imports it when the first figure arrives, so the first plot page a user opens stayed empty for
    seconds after its figure was ready (Reliability, issue 30); run at load, while the user reads
    the Launch page, the import is done when a figure comes."""
    chunk = next((Path(gr.__file__).parent / "templates" / "frontend" / "assets").glob("PlotlyPlot-*.js"), None)
    if chunk is None:  # a gradio built otherwise: its plots load as they always did
        return
    demo.load(None, js=f"() => {{ import(new URL('assets/{chunk.name}', document.baseURI).href); }}")


def quiet_queue(demo: gr.Blocks, wake_s: float = IDLE_WAKE_S) -> None:
    """Let gradio's queue sleep between events. It polls for work every 1 ms while idle (and its
    progress loop every 10 ms): 6 % of a core on a 2-core machine with nobody connected, more
    than the pages' own polls. ``wake_s`` is the most it adds to the start of an event."""
    queue = demo._queue
    for name in ("sleep_when_free", "progress_update_sleep_when_free"):
        if not hasattr(queue, name):  # a gradio that renamed them: say so rather than tune nothing
            raise RuntimeError(f"gradio {gr.__version__}: Queue.{name} is gone; update ui.app.quiet_queue")
        setattr(queue, name, max(getattr(queue, name), wake_s))


def build(ctx: LabContext) -> gr.Blocks:
    with gr.Blocks(title="Calibration Lab") as demo:
        gr.Markdown("# Calibration Lab\nHow accurate is a model, and how honest is its confidence?")
        built: dict[str, Any] = {}  # what each page hands the app: its picker, or the jobs page's links
        timers: dict[str, list[gr.Timer]] = {}
        tabs_by_id: dict[str, gr.Tab] = {}
        with gr.Tabs() as tabs:
            for title, tab_id, build_page in PAGES:
                with gr.Tab(title, id=tab_id) as tab:
                    built[tab_id] = build_page(ctx)
                timers[tab_id], tabs_by_id[tab_id] = timers_in(tab), tab
        # Only the page in view polls: a tab left open on the Launch page costs the server nothing.
        every = [t for page in timers.values() for t in page]
        mount_with_app(every)
        for tab_id, tab in tabs_by_id.items():
            tab.select(functools.partial(timer_states, timers[tab_id], every), outputs=every, show_progress="hidden")
            poll_when_shown(demo, tab, timers[tab_id])
        _wire_links(ctx, tabs, built, timers, element(tabs_by_id["reliability"], "reliability-runs"))
        # Opening the Compare page warms the inference lane for the models its form shows.
        tabs_by_id["compare"].select(**built["compare"].on_open)
        preload_plots(demo)
        register_api(ctx)
    # The pages' own events (uploads, sliders, the loaders of callable values) are not an API:
    # only the documented endpoints may be called by a client.
    for fn in demo.fns.values():
        if fn.api_name not in API_NAMES:
            fn.api_visibility = "private"
    quiet_queue(demo)
    return demo
