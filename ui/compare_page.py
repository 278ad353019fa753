"""Compare on your own question: 2–4 models (with adapters and fitted temperatures) side by side.

The models run in a ``compare`` job, not in the web server (which never loads torch): the page
submits it, polls the job, and draws each model's option probabilities and generated answer
when it is done — a few seconds for small models once the worker has started.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import gradio as gr
import pandas as pd
import yaml

from jobs.store import ConfigError
from lab.compare import MAX_MODELS, read_result
from ui.context import LabContext
from ui.messages import error, ok
from ui.plots import option_bars

POLL_S = 1.0
SCAN_DEPTH = 5


def trained_models(runs: Path) -> list[tuple[str, str]]:
    """(label, "model|adapter") for ``bundled`` and every saved model or adapter under ``runs``.

    Training jobs save full models as ``<run>/model/`` and LoRA adapters as ``<run>/adapter/``
    (pipelines one level deeper per row); epoch checkpoints are not offered.
    """
    found = [("bundled", "bundled|")]
    for depth in range(1, SCAN_DEPTH + 1):
        for directory in sorted(runs.glob("/".join(["*"] * depth))):
            if "checkpoint" in directory.as_posix():
                continue
            label = directory.parent.relative_to(runs).as_posix()
            if directory.name == "adapter" and (directory / "adapter_config.json").is_file():
                base = _adapter_base(directory)
                found.append((f"{label} (LoRA on {base})", f"{base}|{directory}"))
            elif directory.name == "model" and (directory / "config.json").is_file():
                found.append((f"{label} (full)", f"{directory}|"))
    return found


def _adapter_base(directory: Path) -> str:
    """The base model an adapter was trained on, as the config of the job that made it names it."""
    for parent in list(directory.parents)[:4]:
        config = parent / "config.yaml"
        if config.is_file():
            data = yaml.safe_load(config.read_text()) or {}
            for key in ("model", "student", "teacher"):
                if isinstance(data.get(key), str):
                    return data[key]
    return "bundled"


def _entry(choice: Optional[str], temperature: str) -> Optional[dict[str, Any]]:
    if not choice:
        return None
    model, _, adapter = choice.partition("|")
    entry: dict[str, Any] = {"model": model}
    if adapter:
        entry["adapter"] = adapter
    if temperature and temperature.strip():
        entry["temperature"] = temperature.strip()
    return entry


def build_compare(ctx: LabContext) -> None:
    gr.Markdown("Ask your own question. With options you see each model's probability for every option "
                "(letter scoring, the CFT chat prompt) and its generated answer; without options, the answers only.")
    question = gr.Textbox(label="Question", lines=2, elem_id="compare-question",
                          placeholder="What is the capital of Norway?")
    options = gr.Textbox(label="Options, one per line (leave empty for free text)", lines=4,
                         placeholder="Oslo\nHelsinki\nStockholm\nCopenhagen")
    choices = trained_models(ctx.runs)
    models, temps = [], []
    with gr.Row():
        for i in range(MAX_MODELS):
            with gr.Column():
                models.append(gr.Dropdown(choices, value="bundled|" if i == 0 else None, label=f"Model {i + 1}",
                                          allow_custom_value=True))
                temps.append(gr.Textbox(label="Temperature (number or temperature.json)", value=""))
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        rescan = gr.Button("Rescan trained models")
    message = gr.HTML()
    plot = gr.Plot(label="Option probabilities")
    answers = gr.Dataframe(label="Generated answers", interactive=False)
    job_state = gr.State(None)

    def on_run(q, opts, *model_and_temps):
        entries = [e for e in (_entry(m, t) for m, t in zip(model_and_temps[:MAX_MODELS], model_and_temps[MAX_MODELS:])) if e]
        config = {"kind": "compare", "question": q or "",
                  "options": [o.strip() for o in (opts or "").splitlines() if o.strip()], "models": entries}
        try:
            job = ctx.submit(config)
        except ConfigError as e:
            return error(str(e)), None
        return f"Running as job {job.id}…", job.id

    def poll(job_id):
        if job_id is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        job = ctx.store.get(int(job_id))
        if job.status in ("queued", "running"):
            return f"Job {job.id} {job.status}…", gr.skip(), gr.skip(), job_id
        if job.status != "succeeded":
            return (error(f"Job {job.id} {job.status}: {job.error or ''}"),
                    gr.skip(), gr.skip(), None)
        result = read_result(job.run_dir) or {"results": [], "options": []}
        rows = [{"model": r["label"], "answer": r["generation"]["text"],
                 "sequence probability": r["generation"]["sequence_prob"],
                 "first-token probability": r["generation"]["first_token_prob"],
                 **({"chosen option": "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[r["prediction"]],
                     "its probability": r["probs"][r["prediction"]], "T": r.get("temperature")} if "probs" in r else {})}
                for r in result["results"]]
        labels = [f"{chr(ord('A') + i)}. {o}" for i, o in enumerate(result["options"])]
        figure = option_bars([{"model": r["label"], "probs": r["probs"], "labels": labels} for r in result["results"]]) \
            if result["options"] else None
        return ok(f"Job {job.id} done."), figure, pd.DataFrame(rows).round(4), None

    run.click(on_run, inputs=[question, options, *models, *temps], outputs=[message, job_state], api_visibility="private")
    rescan.click(lambda: [gr.update(choices=trained_models(ctx.runs)) for _ in models], outputs=models,
                 api_visibility="private")
    gr.Timer(POLL_S).tick(poll, inputs=job_state, outputs=[message, plot, answers, job_state], api_visibility="private")
