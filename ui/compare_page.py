"""Compare on your own question: 2–4 models (with adapters and fitted temperatures) side by side.

The models run in a ``compare`` job, not in the web server (which never loads torch): the page
submits it, polls the job, and draws each model's option probabilities and generated answer
when it is done — a few seconds for small models once the worker has started. The models on
offer are the catalogue's (:func:`lab.runs.trained_models`).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import gradio as gr

from lab import runs
from lab.config import ConfigError
from lab.compare import MAX_MODELS, read_result
from lab.layout import TEMPERATURE_FILE
from ui.context import LabContext
from ui.job_results import compare_answers, compare_figure
from ui.messages import error, ok

POLL_S = 1.0
BUNDLED = ("bundled", "bundled|")  # (label, value): the model that ships with the lab
INTRO = ("Ask your own question. With options you see each model's probability for every option "
         "(letter scoring, the CFT chat prompt) and its generated answer; without options, the answers only.")


# ---------------------------------------------------------------- handlers
def model_choices(root: Path) -> list[tuple[str, str]]:
    """(label, "model|adapter") for ``bundled`` and every saved model or adapter under ``root``:
    a full model is its own ``model``, an adapter names the base it was trained on."""
    found = [BUNDLED]
    for m in runs.trained_models(root):
        if m.base is None:
            found.append((f"{m.name} (full)", f"{m.path}|"))
        else:
            found.append((f"{m.name} (LoRA on {m.base})", f"{m.base}|{m.path}"))
    return found


def model_entry(choice: Optional[str], temperature: Optional[str]) -> Optional[dict[str, Any]]:
    """One ``models`` entry of a compare config from a picked "model|adapter" and a temperature box."""
    if not choice:
        return None
    model, _, adapter = choice.partition("|")
    entry: dict[str, Any] = {"model": model}
    if adapter:
        entry["adapter"] = adapter
    if temperature and temperature.strip():
        entry["temperature"] = temperature.strip()
    return entry


def submit_compare(ctx: LabContext, question: Optional[str], options: Optional[str], *models_and_temps: Any):
    """Queue the compare job: (message, its id or None). ``models_and_temps``: the model pickers, then
    their temperature boxes."""
    pairs = zip(models_and_temps[:MAX_MODELS], models_and_temps[MAX_MODELS:])
    config = {"kind": "compare", "question": question or "",
              "options": [o.strip() for o in (options or "").splitlines() if o.strip()],
              "models": [e for e in (model_entry(m, t) for m, t in pairs) if e]}
    try:
        job = ctx.submit(config)
    except ConfigError as e:
        return error(str(e)), None
    return f"Running as job {job.id}…", job.id


def poll_compare(ctx: LabContext, job_id: Optional[int]):
    """(message, option figure, answers table, the job still to poll or None) for the submitted job."""
    if job_id is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    job = ctx.store.get(int(job_id))
    if job.status in ("queued", "running"):
        return f"Job {job.id} {job.status}…", gr.skip(), gr.skip(), job_id
    if job.status != "succeeded":
        return error(f"Job {job.id} {job.status}: {job.error or ''}"), gr.skip(), gr.skip(), None
    result = read_result(job.run_dir) or {"results": [], "options": []}
    return ok(f"Job {job.id} done."), compare_figure(result), compare_answers(result), None


def rescan(ctx: LabContext, n: int = MAX_MODELS) -> list[dict[str, Any]]:
    """New choices for each of the ``n`` model pickers."""
    choices = model_choices(ctx.runs)
    return [gr.update(choices=choices) for _ in range(n)]


# ---------------------------------------------------------------- layout and wiring
def build_compare(ctx: LabContext) -> None:
    gr.Markdown(INTRO)
    question = gr.Textbox(label="Question", lines=2, elem_id="compare-question",
                          placeholder="What is the capital of Norway?")
    options = gr.Textbox(label="Options, one per line (leave empty for free text)", lines=4,
                         placeholder="Oslo\nHelsinki\nStockholm\nCopenhagen")
    choices = model_choices(ctx.runs)
    models, temps = [], []
    with gr.Row():
        for i in range(MAX_MODELS):
            with gr.Column():
                models.append(gr.Dropdown(choices, value=BUNDLED[1] if i == 0 else None, label=f"Model {i + 1}",
                                          allow_custom_value=True))
                temps.append(gr.Textbox(label=f"Temperature (number or {TEMPERATURE_FILE})", value=""))
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        rescan_button = gr.Button("Rescan trained models")
    message = gr.HTML()
    plot = gr.Plot(label="Option probabilities")
    answers = gr.Dataframe(label="Generated answers", interactive=False)
    job_state = gr.State(None)

    run.click(functools.partial(submit_compare, ctx), inputs=[question, options, *models, *temps],
              outputs=[message, job_state])
    rescan_button.click(functools.partial(rescan, ctx), outputs=models)
    gr.Timer(POLL_S, active=False).tick(functools.partial(poll_compare, ctx), inputs=job_state,
                          outputs=[message, plot, answers, job_state])
