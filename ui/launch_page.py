"""Launch: one form per job kind, generated from its description, with presets, uploads and the YAML.

Tabs follow the kinds' registration order (the order a user meets them); each form shows the
kind's key fields first and the rest under "More options" (:mod:`ui.forms`). Picking a preset says
what it names that this machine lacks (a data file to supply, a model to download). The handlers are
module-level functions of plain values, so they are tested without a browser; each answers what a
user can cause with a message, never with Gradio's bare "Error".
"""
from __future__ import annotations

import functools
import re
import shutil
import sqlite3
from typing import Any, Optional

import gradio as gr

from jobs.preflight import submit_notes
from jobs.rebuild import check_gpus
from lab.core.errors import USER_ERRORS
from lab.core.yamlio import load_yaml
from lab.data import DataError
from lab.data.templates import template_names
from lab.jobkit import kinds
from lab.models.weights import NAMED_MODELS
from ui import forms
from ui.context import LabContext
from ui.messages import error, note, ok, refusal, store_fault
from ui.plan_view import plan_html
from ui.uploads import accept_upload, refused_notes, upload_notes

UPLOAD_TYPES = [".jsonl", ".json", ".csv"]
FOLLOW_DATASET = ("scoring", "template", "data_files", "subject", "lm_eval_include")  # forms.dataset_fields
LM_EVAL_INFO = (" or lm-eval:<task>: type to search lm-eval's tasks (the ones that ship with the lab run offline; "
                "the whole list is added the first time the box is opened, which takes a few seconds)")
# What a user can cause while a config is checked: a refused field, unreadable data, a file that vanished
# or cannot be listed. Answered as a message; anything else is a bug and keeps its traceback.
FORM_ERRORS = (*USER_ERRORS, OSError)
REFUSED = "lab-refused"  # the class of the field a refusal names (ui.messages.CSS outlines it in red)
FIELD_PATH = re.compile(r"([A-Za-z_]\w*)[\[.:]")  # a refusal starts with its field's path: `limit: …`, `ood[0].…`
# Once the marks are drawn: the refused field (opened under "More options" if there) is brought into view.
SCROLL_TO_REFUSED = f"""() => setTimeout(() => [...document.querySelectorAll('.{REFUSED}')]
    .find(field => field.offsetParent !== null)?.scrollIntoView({{block: 'center'}}), 300)"""
CONFIG_BOX = "lab-config"  # the class of "Show config"'s YAML box
# "Show config" prints the YAML under a form taller than the window: the box is brought into view (its top at
# the window's), or, when the config was refused, the field named.
SCROLL_TO_CONFIG = f"""() => setTimeout(() => {{
    const shown = (selector) => [...document.querySelectorAll(selector)].find(e => e.offsetParent !== null);
    const refused = shown('.{REFUSED}');
    if (refused) refused.scrollIntoView({{block: 'center'}});
    else shown('.{CONFIG_BOX}')?.scrollIntoView({{block: 'start'}});
}}, 300)"""


# ---------------------------------------------------------------- handlers
def show_config(ctx: LabContext, kind: str, *values: Any) -> tuple[str, Any]:
    """"Show config": the validated YAML that would run, or the message naming the bad field."""
    try:
        config = forms.config_from_values(kind, list(values), ctx.roots, ctx.runs)
    except FORM_ERRORS as e:
        return error(str(e)), gr.update(visible=False)
    return "", gr.update(value=forms.config_yaml(config), visible=True)


def submit_form(ctx: LabContext, kind: str, gpus: Any, processes: Any, *values: Any, executor: Any = "local",
                slurm: Optional[dict[str, Any]] = None) -> str:
    """Queue the form's config; the store validates and resolves it once, as for the CLI."""
    try:
        job = ctx.submit(forms.form_config(kind, list(values)), gpus=forms.number_value(gpus),
                         processes=forms.number_value(processes), executor=executor, slurm=slurm)
    except FORM_ERRORS as e:
        return error(str(e))
    except sqlite3.Error as e:
        return error(store_fault(ctx.runs, e))
    where = " for Slurm; the Jobs tab shows its Slurm id once submitted" if job.executor == "slurm" else ""
    notes = submit_notes(job.kind, job.config_dict, job.gpus)  # its GPU memory and checkpoints' disk
    return ok(f"Job {job.id} queued ({kind}){where}; follow it on the Jobs tab.") + "".join(map(note, notes))


def plan_form(ctx: LabContext, kind: str, gpus: Any, *values: Any) -> str:
    """"Plan": the form's config checked as Submit checks it, and what it would hold per GPU, in host memory and
    on disk on the GPUs asked for (:mod:`ui.plan_view`), before anything is queued or downloaded."""
    try:
        config = forms.config_from_values(kind, list(values), ctx.roots, ctx.runs)
        return plan_html(kind, config, check_gpus(forms.number_value(gpus)), ctx.roots)
    except FORM_ERRORS as e:
        return error(str(e))


SLURM_FIELDS = ("partition", "nodes", "gpus_per_node", "minutes", "account", "extra")
SLURM_NUMBERS = ("nodes", "gpus_per_node", "minutes")  # typed as text, like every number on the form


def submit_anywhere(ctx: LabContext, kind: str, gpus: Any, processes: Any, executor: Any, *rest: Any) -> str:
    """The form with its "Run on" choice: Slurm's fields (the first of ``rest``) go along only for
    Slurm, blank ones left to the cluster's defaults; the store checks every one."""
    given = {k: forms.number_value(v) if k in SLURM_NUMBERS else v for k, v in zip(SLURM_FIELDS, rest)}
    values = rest[len(SLURM_FIELDS):]
    if isinstance(given["extra"], str):
        given["extra"] = [line for line in given["extra"].splitlines() if line.strip()]
    slurm = {k: v for k, v in given.items() if v not in (None, "", [])} if executor == "slurm" else None
    return submit_form(ctx, kind, gpus, processes, *values, executor=executor, slurm=slurm)


def _info(kind: str, field: forms.Field) -> str:
    """The line under a field's label: its help (a model field also says what else it takes; a dataset field
    that takes lm-eval tasks, how to find them), as written. Gradio 6 shows an info line as text (only
    Markdown's code spans are read): ``run:<id>`` and quotes show as typed, and HTML-escaping them put
    ``&lt;id&gt;`` and ``&#x27;`` on the form (seen in Chromium). The same line is drawn again after a
    refusal is cleared (:func:`field_marks`), so it is made here once."""
    extra = {"model": " (type a hub id, a path or run:<id>)"}.get(field.role or "", "")
    if field.name == "dataset" and forms.takes_lm_eval(kind):
        extra = LM_EVAL_INFO
    return field.help + extra


def field_marks(kind: str, shown: str) -> list[Any]:
    """An update per form field (:func:`ui.forms.fields` order), then one for "More options": the
    field a refusal names is marked and its info line says why, its accordion opened; every other
    field is as it was drawn. A refusal naming no field of the form (gpus, slurm.nodes) marks none:
    the message beside Submit names it."""
    text = refusal(shown)
    path = FIELD_PATH.match(text) if text else None
    form = forms.fields(kind)
    named = next((f for f in form if path and f.name == path.group(1)), None)
    marks = [gr.update(elem_classes=[REFUSED], info=f"⚠️ {text}") if f is named else
             gr.update(elem_classes=[], info=_info(kind, f)) for f in form]
    return [*marks, gr.update(open=True) if named and not forms.is_key(kind, named.name) else gr.skip()]


def clear_refusal(kind: str, shown: str) -> tuple[Any, ...]:
    """A field was changed: a refusal beside Submit (and the field it marked) no longer describes the
    form, so both go until Submit or "Show config" checks it again; any other message (a job queued)
    stays true and stays, and nothing is redrawn."""
    if refusal(shown or "") is None:  # shown: None until Submit or "Show config" first said something
        return (gr.skip(), *[gr.skip()] * (len(forms.fields(kind)) + 1))
    return ("", *field_marks(kind, ""))


def submit_and_mark(ctx: LabContext, kind: str, *args: Any) -> tuple[Any, ...]:
    """Submit (:func:`submit_anywhere`), and mark the field a refusal names (:func:`field_marks`)."""
    said = submit_anywhere(ctx, kind, *args)
    return (said, *field_marks(kind, said))


def show_and_mark(ctx: LabContext, kind: str, *values: Any) -> tuple[Any, ...]:
    """"Show config" (:func:`show_config`), marking the field a refusal names as Submit does."""
    said, yaml_box = show_config(ctx, kind, *values)
    return (said, yaml_box, *field_marks(kind, said))


def submit_pipeline(ctx: LabContext, text: str, gpus: Any) -> str:
    """Queue every stage of the pipeline in the box (a preset, as edited); the store checks the whole
    file before it queues any stage."""
    try:
        queued = ctx.submit_pipeline(load_yaml(text or "", "the pipeline"), gpus=forms.number_value(gpus))
    except FORM_ERRORS as e:
        return error(str(e))
    except sqlite3.Error as e:
        return error(store_fault(ctx.runs, e))
    stages = ", ".join(f"{job.id} ({job.kind}" + (f", after {', '.join(map(str, job.waits_for))})" if job.waits_for
                                                   else ")") for job in queued)
    return ok(f"Jobs {stages} queued: each starts once the stages it waits for have succeeded; follow them on the "
              "Jobs tab.")


def choose_preset(ctx: LabContext, kind: str, preset: Optional[str]) -> list[Any]:
    """A preset's values for every field, then what it needs that this machine lacks (or nothing)."""
    problems = forms.preset_problems(kind, preset, ctx.roots)
    note = error(f"{preset} needs what this machine lacks (examples/README.md says where each file comes from; "
                 "the …-quick presets run offline): " + " · ".join(problems)) if problems else ""
    return [*forms.preset_values(kind, preset), note]


def change_task(kind: str, task: Optional[str], dataset: Optional[str], split: Optional[str]) -> tuple[Any, Any]:
    """The task changed: the dataset dropdown offers what that task reads, and the dataset and split
    show what the job would resolve them to (clm: text, test) rather than only "Show config" saying so."""
    dataset, split = forms.task_fields(task or forms.dataset_task(kind), dataset, split)
    return gr.update(choices=forms.dataset_choices(kind, task), value=dataset), gr.update(value=split)


def fill_tasks(kind: str, task: Optional[str], filled: bool) -> tuple[Any, bool]:
    """The dataset picker was opened: on its first opening in this page, lm-eval's whole task list joins the
    ones that ship (read once per server, ~13 s the first time; the shipped ones are offered meanwhile).
    ``filled`` (this page's state) keeps the ~1 MB list from being sent again at every opening."""
    if filled or not forms.takes_lm_eval(kind, task):
        return gr.skip(), filled
    forms.lm_eval_index()
    return gr.update(choices=forms.dataset_choices(kind, task)), True


def change_dataset(kind: str, dataset: Optional[str], *values: Any) -> list[Any]:
    """The dataset changed: the fields it decides (:func:`ui.forms.dataset_fields`: an lm-eval task's cloze
    scoring, its own template, no data files) show what the job will use, so that Submit is not refused
    for a field the user never touched. ``values``: the widgets of :data:`FOLLOW_DATASET`, where present."""
    names = [n for n in FOLLOW_DATASET if n in {f.name for f in forms.fields(kind)}]
    changed = forms.dataset_fields(dataset, dict(zip(names, values)))
    return [gr.update(value=changed[n]) if n in changed else gr.skip() for n in names]


def upload_questions(ctx: LabContext, path: Optional[str]) -> tuple[Any, Any, str, Any]:
    """A question file dropped on the form: checked, stored, and set as the ``custom`` dataset's file."""
    if not path:
        return gr.update(), gr.update(), "", gr.update(visible=False)
    try:
        up = accept_upload(path, path, ctx.uploads)
    except DataError as e:
        return gr.update(), gr.update(), refused_notes(e), gr.update(visible=False)
    except OSError as e:
        return gr.update(), gr.update(), error(str(e)), gr.update(visible=False)
    return "custom", str(up.path), upload_notes(up), gr.update(value=up.preview, visible=True)


# ---------------------------------------------------------------- layout
def _widget(kind: str, field: forms.Field, value: Any) -> gr.components.Component:
    label, info, elem_id = field.name, _info(kind, field), f"{kind}-{field.name}"
    if field.name == "dataset":
        # What the kind (and its task) accepts, and what is typed is kept: a dropdown refusing it put the
        # old name back without a word, and Submit ran a job on that; the store refuses an unknown name.
        return gr.Dropdown(forms.dataset_choices(kind), value=value, label=label, info=info, allow_custom_value=True,
                           filterable=True, elem_id=elem_id)
    if field.name == "template":
        return gr.Dropdown([""] + template_names(), value=value or "", label=label, info=info,
                           allow_custom_value=True, elem_id=elem_id)
    if field.role == "model":
        return gr.Dropdown(list(NAMED_MODELS), value=value, label=label, info=info,
                           allow_custom_value=True, elem_id=elem_id)
    if field.widget == "choice":
        return gr.Dropdown(list(field.choices), value=value, label=label, info=info, elem_id=elem_id)
    if field.widget == "multi":
        return gr.CheckboxGroup(list(field.choices), value=value, label=label, info=info, elem_id=elem_id)
    if field.widget == "bool":
        return gr.Checkbox(value=bool(value), label=label, info=info, elem_id=elem_id)
    if field.widget in ("int", "float"):
        # Text rather than gr.Number: an empty box means "unset" for optional fields, and a
        # non-number is answered with a message that names the field instead of a red box.
        return gr.Textbox(value=value, label=label, info=info, elem_id=elem_id)
    lines = 4 if field.widget in ("lines", "yaml") else 1
    return gr.Textbox(value=value, label=label, info=info, lines=lines, max_lines=20, elem_id=elem_id)


def _fields(kind: str) -> tuple[list[gr.components.Component], gr.Accordion]:
    """The kind's widgets in :func:`ui.forms.fields` order: key fields, then "More options" (returned
    too: a refusal naming a field in it opens it)."""
    form, values = forms.fields(kind), forms.preset_values(kind, None)
    with gr.Group():
        components = [_widget(kind, f, v) for f, v in zip(form, values) if forms.is_key(kind, f.name)]
    with gr.Accordion("More options", open=False) as more:
        components += [_widget(kind, f, v) for f, v in zip(form, values) if not forms.is_key(kind, f.name)]
    return components, more


def _upload_box(ctx: LabContext, kind: str, components: list[gr.components.Component]) -> None:
    """For kinds that read a dataset's files: drop a question file to use it as ``custom``."""
    names = [f.name for f in forms.fields(kind)]
    if "dataset" not in names or "data_files" not in names or forms.dataset_task(kind) != "mcq":
        return  # sft's instruction pairs are no questions: its `instructions` dataset reads them
    with gr.Accordion("Your own questions (JSONL / JSON / CSV)", open=False):
        upload = gr.File(label="Question file", file_types=UPLOAD_TYPES, type="filepath")
        message = gr.Markdown()
        preview = gr.Dataframe(interactive=False, visible=False)
    upload.upload(functools.partial(upload_questions, ctx), inputs=upload,
                  outputs=[components[names.index("dataset")], components[names.index("data_files")], message,
                           preview])


def _kind_tab(ctx: LabContext, kind: str) -> None:
    with gr.Row():
        preset = gr.Dropdown(forms.preset_choices(forms.presets(kind)), value="defaults", label="Preset", scale=3,
                             info="defaults, or an example config (…-quick: offline on a CPU, with the time "
                                  "bench/presets.py measured; …-paper: the paper's recipe)")
        # Text, not gr.Number, as every number of the form: gr.Number raises on NaN or text before any
        # handler runs (a bare "Error"); the store answers each bad value naming the field.
        gpus = gr.Textbox(value="0", label="GPUs", scale=1, info="0: run on the CPU", elem_id=f"launch-gpus-{kind}")
        processes = gr.Textbox(value="1", label="CPU processes", scale=1, visible=kinds.get(kind).data_parallel,
                               info="data-parallel on the CPU (gloo); a GPU job runs one per GPU",
                               elem_id=f"launch-processes-{kind}")
    with gr.Accordion("Run on Slurm", open=ctx.executor == "slurm", visible=shutil.which("sbatch") is not None):
        with gr.Row():
            executor = gr.Radio(["local", "slurm"], value=ctx.executor, label="Run on", scale=1,
                                info="slurm: the scheduler submits it with sbatch; runs/ must be shared with the nodes",
                                elem_id=f"launch-executor-{kind}")
            partition = gr.Textbox(label="partition", placeholder="the cluster's default", scale=1)
            nodes = gr.Textbox(value="1", label="nodes", scale=1, elem_id=f"launch-nodes-{kind}")
            per_node = gr.Textbox(value="0", label="GPUs per node", scale=1, elem_id=f"launch-gpus-per-node-{kind}")
            minutes = gr.Textbox(value=str(24 * 60), label="time limit (minutes)", scale=1,
                                 elem_id=f"launch-minutes-{kind}")
            account = gr.Textbox(label="account", placeholder="yours", scale=1)
        extra = gr.Textbox(label="more #SBATCH options, one per line", placeholder="--mem=32G", lines=2)
    components, more = _fields(kind)
    _upload_box(ctx, kind, components)
    yaml_box = gr.Code(label="Config (YAML): what will run; copy it to run from a terminal", language="yaml",
                       visible=False, elem_id=f"launch-config-{kind}", elem_classes=[CONFIG_BOX])
    # Kept at the foot of the window while the form scrolls (it is taller than a screen): Submit, and
    # what it answered, are always in view; the field a refusal names is marked and brought into view.
    with gr.Column(elem_classes=["lab-submit-bar"], elem_id=f"launch-bar-{kind}"):
        message = gr.HTML(elem_id=f"launch-message-{kind}")
        with gr.Row():
            show = gr.Button("Show config", variant="secondary")
            plan = gr.Button("Plan memory and disk", variant="secondary", elem_id=f"plan-{kind}")
            submit = gr.Button(f"Submit {kind} job", variant="primary", elem_id=f"submit-{kind}")
    marked = [*components, more]  # outputs for the marks only: the form must not dim while Submit runs
    show.click(functools.partial(show_and_mark, ctx, kind), inputs=components, outputs=[message, yaml_box, *marked],
               show_progress_on=message).then(None, js=SCROLL_TO_CONFIG)
    submit.click(functools.partial(submit_and_mark, ctx, kind),
                 inputs=[gpus, processes, executor, partition, nodes, per_node, minutes, account, extra, *components],
                 outputs=[message, *marked], show_progress_on=message).then(None, js=SCROLL_TO_REFUSED)
    plan.click(functools.partial(plan_form, ctx, kind), inputs=[gpus, *components], outputs=message,
               show_progress_on=message)
    preset.change(functools.partial(choose_preset, ctx, kind), inputs=preset, outputs=[*components, message])
    # What the user types or picks (a preset filling the form says its own note): one event for the whole form, not
    # one a field. As it opens, the page walks every event for every component; with one a field the app had 413
    # events (173 now), and the page answered its first click after 2.12 s, not 1.60 s (median of 8 openings, both
    # trees in one run: bench/results/page_load_events_cpu.txt).
    gr.on([component.input for component in components], functools.partial(clear_refusal, kind), inputs=message,
          outputs=[message, *marked], show_progress="hidden", trigger_mode="always_last")
    _follow_task(kind, components)
    _follow_dataset(kind, components)


def _follow_task(kind: str, components: list[gr.components.Component]) -> None:
    """For a kind with a task field (evaluate): the dataset dropdown and the split follow it."""
    names = [f.name for f in forms.fields(kind)]
    if not {"task", "dataset", "split"} <= set(names):
        return
    task, dataset, split = (components[names.index(n)] for n in ("task", "dataset", "split"))
    task.change(functools.partial(change_task, kind), inputs=[task, dataset, split], outputs=[dataset, split])


def _follow_dataset(kind: str, components: list[gr.components.Component]) -> None:
    """For a kind whose dataset takes lm-eval tasks: the picker fills in lm-eval's list when opened, and
    the fields an lm-eval task decides follow the dataset picked (:func:`change_dataset`)."""
    names = [f.name for f in forms.fields(kind)]
    if not forms.takes_lm_eval(kind):
        return
    dataset = components[names.index("dataset")]
    task = components[names.index("task")] if "task" in names else gr.State(None)
    filled = gr.State(False)
    dataset.focus(functools.partial(fill_tasks, kind), inputs=[task, filled], outputs=[dataset, filled],
                  show_progress="hidden")
    followers = [components[names.index(n)] for n in FOLLOW_DATASET if n in names]
    dataset.change(functools.partial(change_dataset, kind), inputs=[dataset, *followers], outputs=followers,
                   show_progress="hidden")


def _pipeline_tab(ctx: LabContext) -> None:
    """A pipeline preset's YAML, to edit, and one button that queues every stage of it."""
    presets = forms.pipelines()
    first = next(iter(presets), None)
    with gr.Row():
        preset = gr.Dropdown(forms.preset_choices(presets), value=first, label="Pipeline", scale=3,
                             info="several jobs in one go; `model: stage:NAME` starts a stage from an earlier one's "
                                  "trained weights")
        gpus = gr.Textbox(value="0", label="GPUs", scale=1, info="for each stage; 0: the CPU",
                          elem_id="launch-gpus-pipeline")
    text = gr.Code(value=presets.get(first, ""), label="Stages (YAML)", language="yaml", interactive=True)
    message = gr.HTML(elem_id="launch-message-pipeline")
    submit = gr.Button("Queue every stage", variant="primary", elem_id="submit-pipeline")
    preset.change(lambda name: presets.get(name, ""), inputs=preset, outputs=text)
    submit.click(functools.partial(submit_pipeline, ctx), inputs=[text, gpus], outputs=message,
                 show_progress_on=message)


def build_launch(ctx: LabContext) -> None:
    gr.Markdown("Pick a job, a preset, and change what you need. Jobs run in the background: you can close the tab.")
    with gr.Tabs():
        for kind in kinds.all_kinds():
            with gr.Tab(kind.name, id=f"launch-{kind.name}", elem_id=f"launch-{kind.name}"):
                gr.Markdown(f"**{kind.name}** — {kind.description}")
                _kind_tab(ctx, kind.name)
        with gr.Tab("pipeline", id="launch-pipeline", elem_id="launch-pipeline"):
            gr.Markdown("**pipeline** — a chain of jobs queued at once (base → SFT → DPO → CFT): each stage waits for "
                        "the one it starts from and does not start if that one fails")
            _pipeline_tab(ctx)
