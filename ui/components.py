"""Pieces several pages share: the run picker that follows the runs directory, the binning choice (how many
bins, and which end of a bin is closed), and writing an export for the browser to download."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Optional

import gradio as gr

from lab.calibration import calibrators, confidence
from lab.core.layout import CALIBRATOR_FILE
from lab.results import runs
from ui.context import LabContext

Catalogue = Callable[[Path], list[Any]]  # the runs directory → names, or (label, name), to offer (lab.results.runs)
PICKER_POLL_S = 3.0  # how soon a new run appears in the pickers of the visible page
BINNINGS = {"10 equal-width bins": (10, "width"), "14 equal-width bins": (14, "width"),
            "10 equal-mass bins": (10, "mass")}
DEFAULT_BINNING = "10 equal-width bins"
# A run's ECE depends on which end of a bin holds a confidence on an edge (0.7 with 10 bins): by
# default a page redraws a run as it was evaluated, and the user may switch to see the difference.
AS_EVALUATED = "as the run was evaluated"
BIN_EDGES = {AS_EVALUATED: None, "right-closed (Guo et al.)": "right", "left-closed (torchmetrics)": "left"}


def binning(choice: Optional[str]) -> tuple[int, str]:
    """(number of bins, strategy) of a binning radio's choice; the default for anything else."""
    return BINNINGS.get(choice or "", BINNINGS[DEFAULT_BINNING])


def binning_radio(**kwargs: Any) -> gr.Radio:
    return gr.Radio(list(BINNINGS), value=DEFAULT_BINNING, label="Bins", **kwargs)


def bin_edges(choice: Optional[str], evaluated: str) -> str:
    """The convention an edges radio's choice names; ``evaluated`` (the run's own) for
    :data:`AS_EVALUATED` or anything else."""
    return (BIN_EDGES.get(choice) if isinstance(choice, str) else None) or evaluated


def edges_radio(**kwargs: Any) -> gr.Radio:
    return gr.Radio(list(BIN_EDGES), value=AS_EVALUATED, label="Bin edges (a confidence on an edge joins the bin "
                                                                "it closes)", **kwargs)


def signal_choices() -> list[tuple[str, str]]:
    """(title, name) of every confidence signal (:mod:`lab.calibration.confidence`), for the pages that let the
    user pick one: selective prediction, the workbench, and Case studies' confidence range."""
    return [(confidence.SIGNALS.get(n).title, n) for n in confidence.SIGNALS.in_order()]


def _names(choices: list[Any]) -> list[str]:
    return [c[1] if isinstance(c, tuple) else c for c in choices]


def follow_catalogue(ctx: LabContext, catalogue: Catalogue, multiselect: bool, pick_newest: bool, value: Any,
                     seen: Optional[str]) -> tuple[Any, Optional[str]]:
    """A picker kept in step with the runs directory: (its update, what it now lists).

    The choices are sent only when the catalogue changed since ``seen``, so a poll on a quiet
    directory sends nothing; with ``pick_newest``, a picker with nothing picked gets the newest
    entry, which fires its ``change`` and so draws the page (gradio's own default, the first
    choice, draws nothing)."""
    choices = catalogue(ctx.runs)
    listed = repr(choices)
    pick = None
    if pick_newest and not value and choices:
        newest = _names(choices)[0]
        pick = [newest] if multiselect else newest
    if listed == seen and pick is None:
        return gr.skip(), seen
    return gr.update(choices=choices, **({} if pick is None else {"value": pick})), listed


def run_picker(ctx: LabContext, label: str, multiselect: bool = False,
               catalogue: Catalogue = runs.evaluation_choices, elem_id: Optional[str] = None,
               pick_newest: bool = True, value: Any = None) -> tuple[gr.Dropdown, gr.Timer]:
    """A dropdown of what ``catalogue`` lists, following it live: filled when its page is opened
    (with the newest entry picked, unless ``pick_newest`` is False) and polled while the page is
    visible. The app runs a page's polls when its tab is selected and activates its timers
    (:func:`ui.app.poll_when_shown`); no picker loads with the app: with twelve such load events,
    each redrawing every component's status in the browser, the page answered its first click after
    8.4 s, not 4.9 s (bench/page_load.py). ``value``: what it holds before the page opens (then listed at once), e.g. a
    "none" entry. The page resolves the picked name on the server (:func:`lab.results.runs.resolve`)."""
    start = ([] if multiselect else None) if value is None else value
    picker = gr.Dropdown(catalogue(ctx.runs) if value is not None else [], value=start, multiselect=multiselect,
                         label=label, elem_id=elem_id)
    seen = gr.State(None)
    timer = gr.Timer(PICKER_POLL_S, active=False)
    follow = functools.partial(follow_catalogue, ctx, catalogue, multiselect, pick_newest)
    timer.tick(follow, inputs=[picker, seen], outputs=[picker, seen], show_progress="hidden")
    return picker, timer


def export(ctx: LabContext, filename: str, write: Callable[[Path], Any]) -> dict[str, Any]:
    """``write`` the export to ``<runs>/exports/<filename>`` and show it as a download."""
    target = ctx.exports / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    write(target)
    return gr.update(value=str(target), visible=True)


NO_CALIBRATOR = ("none: the run as it reported", "")


def calibrator_choices(root: Path) -> list[tuple[str, str]]:
    """"none", then every saved calibrator (:func:`lab.results.runs.calibrator_choices`), newest first."""
    return [NO_CALIBRATOR, *runs.calibrator_choices(root)]


def calibrator_picker(ctx: LabContext, **kwargs: Any) -> gr.Dropdown:
    """A dropdown of the saved calibrators (fitted in the Recalibration workbench), following the
    runs directory; "none" until the user picks one."""
    picker, _ = run_picker(ctx, "Apply a saved calibrator (fitted in the Recalibration workbench)",
                           catalogue=calibrator_choices, pick_newest=False, value=NO_CALIBRATOR[1], **kwargs)
    return picker


def picked_calibrator(ctx: LabContext, name: Any) -> Optional[calibrators.Calibrator]:
    """The calibrator a picker names, loaded; None for "none". A name leading outside the runs
    directory, or to no calibrator, is a ValueError the page shows."""
    if not name:
        return None
    directory = runs.calibrator_dir(ctx.runs, name)
    if directory is None:
        raise ValueError(f"No saved calibrator called {name!r}: pick one from the list.")
    return calibrators.load(directory, f"{name}/{CALIBRATOR_FILE}")
