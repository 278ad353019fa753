"""Knowledge: how much of the teacher's probability its top-K tokens hold (FIRST's concentrated
knowledge, Figure 2), and what storing K tokens per position costs, from a top-k store's manifest."""
from __future__ import annotations

import functools
import json
from typing import Optional

import gradio as gr

from lab import runs
from ui.components import run_picker
from ui.context import LabContext
from ui.messages import error
from ui.plots import coverage_figure

INTRO = ("How much of the teacher's probability its top-K tokens hold (FIRST's concentrated knowledge), "
         "and what storing K tokens per position costs.")


# ---------------------------------------------------------------- handlers
def knowledge_view(ctx: LabContext, name: Optional[str]):
    """(coverage figure or None, a line about the store) for the store called ``name``."""
    path = runs.topk_store(ctx.runs, name)
    if path is None:
        return None, "Pick a top-k store (an `extract` job, or a FIRST run's `topk/train`)."
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        return None, error(f"Cannot read {path}: {e}")
    if not isinstance(manifest, dict):
        return None, error(f"Cannot read {path}: expected a JSON object, got {type(manifest).__name__}")
    meta = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
    text = (f"k = {manifest.get('k')} · {manifest.get('n_sequences')} sequences · model {meta.get('model')} · "
            f"{meta.get('dataset')} {meta.get('split')} · complete: {manifest.get('complete', True)}")
    return coverage_figure(manifest), text


# ---------------------------------------------------------------- layout and wiring
def build_knowledge(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    name, _ = run_picker(ctx, "Top-k store", catalogue=runs.store_names, refresh_label="↻ Refresh")
    text = gr.Markdown()
    plot = gr.Plot(label="Top-K coverage")
    name.change(functools.partial(knowledge_view, ctx), inputs=name, outputs=[plot, text])
