"""Compare on your own questions: 1–4 models (with adapters and fitted temperatures) side by side.

The models run in the inference lane (:class:`jobs.lane.Lane`), a worker beside the training
queue that keeps them loaded: opening the page starts it and loads the models the form shows
(``app.py --lane-preload``), so that the first compare is as quick as the next ones, and none waits
for a training job. A line under the Compare button says whether the lane is still warming up and
what it holds, read from the server's side (asking the worker would keep an idle lane alive). The
web server never loads torch. Every comparison is kept under ``runs/comparisons/`` and listed in
History, across server restarts; a ``compare`` job (``python -m jobs submit``) writes the same
``compare.json`` and is listed there too.

A saved calibrator (the Recalibration workbench's) can be applied to every model's option
probabilities: the answers table gains a "calibrated confidence" column, recomputed from the
comparison shown, so picking another calibrator never asks the models again.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import gradio as gr
import pandas as pd

from jobs.lane import LaneError, Warmup, model_name
from lab.calibration import calibrators, metrics
from lab.core.errors import USER_ERRORS
from lab.core.layout import TEMPERATURE_FILE
from lab.jobkit.kinds import parse_config
from lab.kinds.compare.config import MAX_MODELS
from lab.kinds.compare.questions import format_questions, parse_questions
from lab.kinds.compare.result import history_dir, read_result
from lab.models.weights import NAMED_MODELS, size_text
from lab.results import runs
from lab.results.reports import csv_text
from ui.components import NO_CALIBRATOR, calibrator_choices, export, picked_calibrator, run_picker
from ui.context import LabContext
from ui.job_results import compare_answers, compare_figure
from ui.messages import error, ok
from ui.uploads import ALLOWED_SUFFIXES, accept_upload

# (label, "model|adapter") of every model a name loads (lab.models.weights): bundled, the default, then scratch
NAMED = [(name, f"{name}|") for name in NAMED_MODELS]
FORM_MODELS = (NAMED[0][1],) + (None,) * (MAX_MODELS - 1)  # what the model pickers show as the page opens
EXAMPLE = "What is the capital of Norway?\nOslo\nHelsinki\nStockholm\nCopenhagen"
INTRO = ("Ask your own questions. With options you see each model's probability for every option "
         "(letter scoring, the CFT chat prompt) and its generated answer; without options, the answers only. "
         "Models stay loaded between compares (and start loading as this page opens); the line under Compare "
         "says whether they are ready.")
QUESTIONS_HELP = ("One question per block, blocks separated by a blank line: the question on the first line, "
                  "its options one per line below (none: a free-text answer). Put * before the right option "
                  "to have it marked.")
NOT_RUNNING = "Inference lane: not running (the next compare starts it)."
LANE_POLL_S = 2.0  # how soon the lane's line says that its warm-up is over, while the page is shown
CALIBRATED = "calibrated confidence"  # the answers table's column when a calibrator is picked
# Each column of the answers table (lab.kinds.compare.result.COLUMNS, and the calibrated confidence) its width: at 1440 px
# the answer and its probabilities are in view, and no header breaks mid-word.
ANSWER_WIDTHS = {"#": "48px", "model": "140px", "prediction": "160px", "confidence": "116px", CALIBRATED: "126px",
                 "correct": "90px", "answer": "320px", "option probabilities": "220px", "answer prob.": "116px",
                 "1st-token prob.": "140px", "T": "60px", "question": "300px"}


# ---------------------------------------------------------------- handlers
def model_choices(root: Path) -> list[tuple[str, str]]:
    """(label, "model|adapter") for the named models and every saved model or adapter under ``root``:
    a full model is its own ``model``, an adapter names the base it was trained on."""
    found = list(NAMED)
    for m in runs.trained_models(root):
        if m.base is None:
            found.append((f"{m.name} (full)", f"{m.path}|"))
        else:
            found.append((f"{m.name} (LoRA on {m.base})", f"{m.base}|{m.path}"))
    return found


def model_entry(choice: Optional[str], temperature: Any) -> Optional[dict[str, Any]]:
    """One ``models`` entry of a compare config from a picked "model|adapter" and a temperature box."""
    if not choice or not isinstance(choice, str):
        return None
    model, _, adapter = choice.partition("|")
    entry: dict[str, Any] = {"model": model}
    if adapter:
        entry["adapter"] = adapter
    if isinstance(temperature, (int, float)) or (isinstance(temperature, str) and temperature.strip()):
        entry["temperature"] = temperature.strip() if isinstance(temperature, str) else temperature
    return entry


def request(ctx: LabContext, text: Any, models_and_temps: tuple[Any, ...]) -> tuple[Any, list[dict[str, Any]]]:
    """The validated compare config (every file it names inside the server's folders) and its questions.
    Raises ValueError (ConfigError included) with what to change."""
    questions = parse_questions(text if isinstance(text, str) else "")
    pairs = zip(models_and_temps[:MAX_MODELS], models_and_temps[MAX_MODELS:])
    config = {"kind": "compare", "questions": questions,
              "models": [e for e in (model_entry(m, t) for m, t in pairs) if e]}
    _, cfg = parse_config(config, roots=ctx.roots)
    return cfg, questions


def question_choices(result: dict[str, Any]) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {q['question'][:80]}", i) for i, q in enumerate(result["questions"])]


def _export_table(ctx: LabContext, table: pd.DataFrame, name: str) -> dict[str, Any]:
    text = csv_text(table)
    return export(ctx, f"compare-{Path(name).name}.csv", lambda path: path.write_text(text, encoding="utf-8"))


def answers_table(table: pd.DataFrame) -> dict[str, Any]:
    """The answers table with its columns' widths: which columns it has depends on the questions
    (options, a right answer) and on the calibrator picked."""
    return gr.update(value=table, column_widths=[ANSWER_WIDTHS.get(c, "120px") for c in table.columns])


def shown(ctx: LabContext, result: dict[str, Any], name: str) -> tuple[Any, ...]:
    """(question picker, plot, table, CSV download) for a comparison."""
    table = compare_answers(result)
    return (gr.update(choices=question_choices(result), value=0, visible=len(result["questions"]) > 1),
            compare_figure(result, 0), answers_table(table), _export_table(ctx, table, name))


def calibrated_confidences(result: dict[str, Any], cal: calibrators.Calibrator) -> list[Optional[float]]:
    """The calibrated confidence of every row of the answers table, in its order (question by
    question, each model: :func:`lab.kinds.compare.result.rows`), None for a free-text question. Each row's
    own question and options go with its probabilities, so a calibrator whose signal a comparison
    cannot give (full-vocabulary) raises ValueError, as it would on a cloze run."""
    cells: list[Optional[int]] = []
    probs, rows = [], []
    for q, item in enumerate(result["questions"]):
        for model in result["results"]:
            if not item["options"]:
                cells.append(None)
                continue
            cells.append(len(probs))
            probs.append(model["answers"][q]["probs"])
            rows.append({"question": item["question"], "choices": item["options"]})
    if not probs:
        return cells
    _, conf = calibrators.apply(cal, *metrics.padded(probs), rows)
    return [None if i is None else round(float(conf[i]), 4) for i in cells]


def with_calibrated(table: pd.DataFrame, result: dict[str, Any],
                    cal: calibrators.Calibrator) -> tuple[pd.DataFrame, str]:
    """The answers table with its "calibrated confidence" column beside the confidence, and what to
    say of it: that some questions are ones the calibrator was fitted on, or why it cannot apply."""
    if "confidence" not in table:
        return table, error("No question has options: there is no confidence to calibrate.")
    try:
        column = calibrated_confidences(result, cal)
    except ValueError as e:
        return table, error(f"{cal.describe()} cannot be applied here: {e}")
    table.insert(table.columns.get_loc("confidence") + 1, CALIBRATED, column)
    asked = [{"question": q["question"], "choices": q["options"]} for q in result["questions"] if q["options"]]
    warning = calibrators.fitted_on_same(cal, asked)
    return table, error(warning) if warning else ok(f"Calibrated by {cal.describe()}.")


def calibrated_answers(ctx: LabContext, result: Optional[dict[str, Any]], calibrator: Any,
                       name: Any) -> tuple[Any, Any, str]:
    """(table, CSV download, note) of the comparison shown, with the picked calibrator's column
    (none: the table as the models answered); redrawn from ``result``, the models not asked again."""
    if not result:
        return gr.skip(), gr.skip(), ""
    table, note = compare_answers(result), ""
    try:
        cal = picked_calibrator(ctx, calibrator)
    except (OSError, ValueError) as e:
        note = error(str(e))
    else:
        if cal is not None:
            table, note = with_calibrated(table, result, cal)
    csv = _export_table(ctx, table, name) if isinstance(name, str) and name else gr.skip()
    return answers_table(table), csv, note


def warming_line(warmup: Warmup, now: float) -> str:
    """The lane's line while it pre-loads: what it is doing, how long that took last time, and so far."""
    expected = (f"about {warmup.expected_s:.0f} s" if warmup.expected_s is not None
                else "the first time here takes seconds to a minute")
    return (f"Inference lane: warming up, {warmup.stage}… ({expected}; {now - warmup.started:.0f} s so far). "
            "A compare asked now starts as soon as it is ready.")


def describe_lane(status: dict[str, Any], warmup: Optional[Warmup]) -> str:
    """A running lane's device, what it holds and the memory that takes (the models a user may wait
    for), and how its warm-up went; or that it does not run."""
    failed = ""
    if warmup is not None and warmup.error:
        when = time.strftime("%H:%M", time.localtime(warmup.started))
        failed = f" The pre-load of {', '.join(warmup.models)} at {when} failed: {warmup.error}"
    if not status.get("running"):
        return NOT_RUNNING + failed
    warmed = warmup is not None and not warmup.error and warmup.pid == status["pid"]
    state = f"ready on {status['device']} (pid {status['pid']}), warmed up in {warmup.seconds:.1f} s" if warmed \
        else f"running on {status['device']} (pid {status['pid']})"
    if "held" not in status:
        return f"Inference lane: {state}.{failed}"
    held = ", ".join(f"{h['model']}{' + ' + Path(h['adapter']).name if h['adapter'] else ''} "
                     f"({size_text(h['bytes'])})" for h in reversed(status["held"])) or "nothing yet"
    return (f"Inference lane: {state}; holds {held}; {size_text(status['used'])} of {size_text(status['budget'])} "
            f"used.{failed}")


def lane_line(ctx: LabContext) -> str:
    """The lane's line, from what the server knows: never a request to the worker, whose idle
    timeout counts requests (this is the page's poll)."""
    warmup = ctx.lane.warmup
    if warmup is not None and not warmup.done:
        return warming_line(warmup, time.time())
    return describe_lane(ctx.lane.last_status(), warmup)


def lane_status(ctx: LabContext) -> str:
    """The lane's line after asking the worker what it holds (after a compare, which was a request anyway)."""
    ctx.lane.status()
    return lane_line(ctx)


def form_models(ctx: LabContext, pickers: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The models the form's pickers show, each once, as a pre-load names them ({model, adapter});
    validated as their compare will be, and none when one is not valid (the compare will say why)."""
    try:
        cfg, _ = request(ctx, EXAMPLE, (*pickers, *[""] * len(pickers)))
    except ValueError:
        return []
    entries = [{key: m[key] for key in ("model", "adapter") if m.get(key)} for m in cfg.models]
    return list({model_name(e): e for e in entries}.values())


def opened(ctx: LabContext, *pickers: Any) -> str:
    """The page was opened: the lane starts and loads the models the form shows, in the background
    (unless ``--lane-preload off``, or a lane runs already: it is warm), and its line says so."""
    if ctx.lane_options.preload != "off":
        ctx.lane.preload(form_models(ctx, pickers))
    return lane_line(ctx)


def run_compare(ctx: LabContext, text: Any, *models_and_temps: Any) -> Iterator[tuple[Any, ...]]:
    """Ask the lane; yields (message, question picker, plot, table, CSV, result, history picker,
    lane status) as news arrives and once more with the answer."""
    skip = (gr.skip(),) * 7
    try:
        cfg, questions = request(ctx, text, models_and_temps)
    except ValueError as e:
        yield (error(str(e)), *skip)
        return
    out = history_dir(ctx.runs, questions)
    news: queue.Queue = queue.Queue()
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["reply"] = ctx.lane.call("compare", {"config": cfg.to_dict(), "out": str(out)}, progress=news.put)
        except LaneError as e:
            answer["error"] = e
        finally:
            news.put(None)

    warmup = ctx.lane.warmup
    if warmup is not None and not warmup.done:
        first = f"The inference lane is still warming up ({warmup.stage}): the compare starts as soon as it is ready…"
    elif ctx.lane.pid is None:
        first = ("Starting the inference lane: torch and the models load once (seconds to a minute); "
                 "the next compares reuse them…")
    else:
        first = "Comparing…"
    threading.Thread(target=ask, daemon=True, name="compare").start()
    yield (ok(first), *skip)
    while (item := news.get()) is not None:
        yield (ok(f"{item}…"), *skip)
    if "error" in answer:
        if not any(out.iterdir()):
            out.rmdir()
        yield (error(str(answer["error"])), *skip[:-1], lane_status(ctx))
        return
    reply = answer["reply"]
    result = read_result(out) or reply.result
    name = out.relative_to(ctx.runs).as_posix()
    seconds = result.get("seconds")
    done = f"Done in {seconds:.1f} s; kept in History as {name}." if seconds is not None else "Done."
    message = ok(done) + (error(reply.notice) if reply.notice else "")
    yield (message, *shown(ctx, result, name), result,
           gr.update(choices=runs.comparison_choices(ctx.runs), value=name), lane_status(ctx))


def pick_question(result: Optional[dict[str, Any]], index: Any) -> Any:
    """Redraw the option bars for another question of the comparison shown."""
    if not result or not isinstance(index, int):
        return gr.skip()
    return compare_figure(result, index)


def reopen(ctx: LabContext, name: Any) -> tuple[Any, ...]:
    """A past comparison back on the page: its questions, models and answers."""
    path = runs.resolve(ctx.runs, name)
    result = read_result(path) if path is not None else None
    if result is None:
        return (gr.skip(),) * (7 + 2 * MAX_MODELS)
    entries = result["results"][:MAX_MODELS]
    pickers = [f"{r['model']}|{r.get('adapter') or ''}" for r in entries] + [None] * (MAX_MODELS - len(entries))
    temps = [("" if r.get("temperature") is None else str(r["temperature"])) for r in entries]
    temps += [""] * (MAX_MODELS - len(entries))
    return (format_questions(result["questions"]), ok(f"Reopened {name}."), *shown(ctx, result, str(name)), result,
            *[gr.update(value=p) for p in pickers], *temps)


def load_file(ctx: LabContext, file: Any) -> tuple[Any, str]:
    """An uploaded question file (the custom dataset's format) into the question box, right answers marked."""
    from lab.data import load

    if not file:
        return gr.skip(), ""
    try:
        upload = accept_upload(file, Path(file).name, ctx.uploads)
        records = load("custom", "test", [str(upload.path)]).records
    except USER_ERRORS as e:
        return gr.skip(), error(str(e))
    questions = [{"question": r.question, "options": list(r.choices), "answer": r.answer} for r in records]
    return format_questions(questions), ok(f"{len(questions)} questions read from {Path(file).name}.")


def rescan(ctx: LabContext, n: int = MAX_MODELS) -> list[dict[str, Any]]:
    """New choices for each of the ``n`` model pickers."""
    choices = model_choices(ctx.runs)
    return [gr.update(choices=choices) for _ in range(n)]


# ---------------------------------------------------------------- layout and wiring
class CompareControls(NamedTuple):
    """What the app wires around the page: History, and the event its opening (its tab's select)
    runs, which pre-loads the form's models."""

    history: gr.Dropdown
    on_open: dict[str, Any]  # keyword arguments of the tab's select event


def build_compare(ctx: LabContext) -> CompareControls:
    gr.Markdown(INTRO)
    with gr.Row():
        questions = gr.Textbox(label="Questions", value=EXAMPLE, lines=8, max_lines=30, elem_id="compare-question",
                               info=QUESTIONS_HELP, scale=3)
        upload = gr.File(label=f"…or a question file ({', '.join(ALLOWED_SUFFIXES)}, as the custom dataset)",
                         file_types=list(ALLOWED_SUFFIXES), type="filepath", scale=1)
    choices = model_choices(ctx.runs)
    models, temps = [], []
    with gr.Row():
        for i in range(MAX_MODELS):
            with gr.Column(min_width=160):
                models.append(gr.Dropdown(choices, value=FORM_MODELS[i], label=f"Model {i + 1}",
                                          allow_custom_value=True, elem_id=f"compare-model-{i + 1}"))
                temps.append(gr.Textbox(label=f"Temperature (number or {TEMPERATURE_FILE})", value="",
                                        elem_id=f"compare-temperature-{i + 1}"))
    with gr.Row():
        run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        rescan_button = gr.Button("Rescan trained models")
    status = gr.Markdown(NOT_RUNNING, elem_id="compare-lane")
    message = gr.HTML(elem_id="compare-message")
    question = gr.Dropdown([], label="Question drawn", visible=False, elem_id="compare-drawn")
    plot = gr.Plot(label="Option probabilities")
    calibrator, _ = run_picker(ctx, "Calibrator (applied to every model's confidence)", catalogue=calibrator_choices,
                               elem_id="compare-calibrator", pick_newest=False, value=NO_CALIBRATOR[1])
    calibrated_note = gr.HTML(elem_id="compare-calibrated-note")
    answers = gr.Dataframe(label="Answers: one row per question and model", interactive=False, wrap=True,
                           elem_id="compare-answers")
    csv = gr.File(label="CSV", visible=False)
    result = gr.State(None)
    history, _ = run_picker(ctx, "History (every comparison, also after a restart)",
                                        catalogue=runs.comparison_choices, elem_id="compare-history", pick_newest=False)

    # the table as the models answered, then with the picked calibrator's column (from the result kept)
    recalibrate = {"fn": functools.partial(calibrated_answers, ctx), "inputs": [result, calibrator, history],
                   "outputs": [answers, csv, calibrated_note]}
    run.click(functools.partial(run_compare, ctx), inputs=[questions, *models, *temps],
              outputs=[message, question, plot, answers, csv, result, history, status],
              concurrency_limit=None).then(**recalibrate)
    question.change(pick_question, inputs=[result, question], outputs=plot)
    history.input(functools.partial(reopen, ctx), inputs=history,
                  outputs=[questions, message, question, plot, answers, csv, result, *models, *temps]
                  ).then(**recalibrate)
    calibrator.change(**recalibrate)
    upload.upload(functools.partial(load_file, ctx), inputs=upload, outputs=[questions, message])
    rescan_button.click(functools.partial(rescan, ctx), outputs=models)
    gr.Timer(LANE_POLL_S, active=False).tick(functools.partial(lane_line, ctx), outputs=status, show_progress="hidden")
    if ctx.lane_options.preload == "start":  # the server is starting: the form will show its defaults
        ctx.lane.preload(form_models(ctx, FORM_MODELS))
    return CompareControls(history, {"fn": functools.partial(opened, ctx), "inputs": models, "outputs": status,
                                     "show_progress": "hidden"})
