"""Knowledge: how much of the teacher's probability its top-K tokens hold (FIRST's concentrated
knowledge, Figure 2), and what storing K tokens per position costs, from a top-k store's manifest."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

import gradio as gr

from lab.results import runs
from ui.components import run_picker
from ui.context import LabContext
from ui.messages import error
from ui.plots.curves import coverage_figure

INTRO = ("How much of the teacher's probability its top-K tokens hold (FIRST's concentrated knowledge), "
         "and what storing K tokens per position costs.")
# shown until a store is picked: with none yet, nothing else on the page says where they come from
NO_STORE = ("No top-k store picked. An `extract` job (Launch page → extract) stores a teacher's top-k tokens "
            "and fills this page when it is done; a FIRST run's `topk/train` is listed too.")


# ---------------------------------------------------------------- handlers
def _short(path: str) -> str:
    """A model as a reader knows it: a name or hub id as given, a folder by its last two parts."""
    parts = Path(path).parts
    return path if not path.startswith(("/", ".", "~")) else "/".join(parts[-2:])


def model_text(model: Any) -> str:
    """The store's model as text: ``meta.model`` is a name, or (extract and FIRST jobs) a dict
    ``{"model": …, "adapter": …, …}`` that the caption used to print raw."""
    if isinstance(model, dict):
        name = _short(str(model.get("model") or "?"))
        return f"{name} + adapter {_short(str(model['adapter']))}" if model.get("adapter") else name
    return _short(str(model)) if model else "not recorded"


def caption(manifest: dict[str, Any]) -> str:
    """One readable line about a store: what it keeps, of what, from which model, and whether it is complete."""
    meta = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
    data = "/".join(str(meta[key]) for key in ("dataset", "split") if meta.get(key)) or "data not recorded"
    n = manifest.get("n_sequences")
    complete = ("complete" if manifest.get("complete", True)
                else "incomplete: the extraction stopped early; run it again to finish")
    return (f"Top-k store: k = {manifest.get('k', '?')} tokens kept per position · "
            f"{f'{n:,}' if isinstance(n, int) else '?'} sequences of {data} · model {model_text(meta.get('model'))} "
            f"· {complete}")


def knowledge_view(ctx: LabContext, name: Optional[str]):
    """(coverage figure or None, a line about the store) for the store called ``name``."""
    path = runs.topk_store(ctx.runs, name)
    if path is None:
        return None, NO_STORE
    where = f"{name}/{path.name}"  # by the store's name, as the picker shows it: never the server's path
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:  # its own text names the absolute path
        return None, error(f"Cannot read {where}: {e.strerror or type(e).__name__}")
    except ValueError as e:  # not JSON, or not UTF-8
        return None, error(f"Cannot read {where}: {e}")
    if not isinstance(manifest, dict):
        return None, error(f"Cannot read {where}: expected a JSON object, got {type(manifest).__name__}")
    return coverage_figure(manifest), caption(manifest)


# ---------------------------------------------------------------- layout and wiring
def build_knowledge(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    name, _ = run_picker(ctx, "Top-k store", catalogue=runs.store_names)
    text = gr.Markdown(NO_STORE)
    plot = gr.Plot(label="Top-K coverage")
    name.change(functools.partial(knowledge_view, ctx), inputs=name, outputs=[plot, text])
