"""Launch: one form per job kind, generated from its config, with presets, uploads and the YAML."""
from __future__ import annotations

from typing import Any

import gradio as gr

from lab.config import ConfigError
from lab.data import DataError, dataset_names
from lab.run import JOB_KINDS
from lab.templates import template_names
from ui import forms
from ui.context import LabContext
from ui.messages import error, ok
from ui.uploads import accept_upload, upload_notes

ORDER = ("evaluate", "finetune", "first", "cft", "extract", "compare")  # the workflow's order, then any others


def _component(kind: str, field: forms.Field, value: Any) -> gr.components.Component:
    label, info = field.name, field.help
    component = _widget(field, value, label, info)
    component.elem_id = f"{kind}-{field.name}"
    return component


def _widget(field: forms.Field, value: Any, label: str, info: str) -> gr.components.Component:
    if field.name in ("dataset",):
        return gr.Dropdown(dataset_names(), value=value, label=label, info=info)
    if field.name == "template":
        return gr.Dropdown([""] + template_names(), value=value or "", label=label, info=info, allow_custom_value=True)
    if field.role == "model":
        return gr.Dropdown(["bundled"], value=value, label=label, info=info + " (type a hub id or a path)",
                           allow_custom_value=True)
    if field.widget == "choice":
        return gr.Dropdown(list(field.choices), value=value, label=label, info=info)
    if field.widget == "multi":
        return gr.CheckboxGroup(list(field.choices), value=value, label=label, info=info)
    if field.widget == "bool":
        return gr.Checkbox(value=bool(value), label=label, info=info)
    if field.widget in ("int", "float"):
        # Text rather than gr.Number: an empty box means "unset" for optional fields, and a
        # non-number is answered with a message that names the field instead of a red box.
        return gr.Textbox(value=value, label=label, info=info)
    lines = 4 if field.widget in ("lines", "yaml") else 1
    return gr.Textbox(value=value, label=label, info=info, lines=lines, max_lines=20)


def _kind_tab(ctx: LabContext, kind: str) -> None:
    form = forms.fields(kind)
    defaults = forms.preset_values(kind, None)
    presets = list(forms.presets(kind))
    with gr.Row():
        preset = gr.Dropdown(presets, value="defaults", label="Preset", scale=3,
                             info="defaults, or an example config (…-quick: offline on a CPU; …-paper: the paper's recipe)")
        gpus = gr.Number(value=0, precision=0, minimum=0, label="GPUs", scale=1, info="0: run on the CPU")
    components: list[gr.components.Component] = []
    with gr.Group():
        for field, value in zip(form, defaults):
            if forms.is_key(kind, field.name):
                components.append(_component(kind, field, value))
    with gr.Accordion("More options", open=False):
        for field, value in zip(form, defaults):
            if not forms.is_key(kind, field.name):
                components.append(_component(kind, field, value))
    order = [f for f in form if forms.is_key(kind, f.name)] + [f for f in form if not forms.is_key(kind, f.name)]
    position = [form.index(f) for f in order]

    def values_in_field_order(widget_values: tuple) -> list[Any]:
        out: list[Any] = [None] * len(form)
        for i, v in zip(position, widget_values):
            out[i] = v
        return out

    names = [f.name for f in order]
    if "dataset" in names and any(f.name == "data_files" and f.role == "data_files" for f in order):
        with gr.Accordion("Your own questions (JSONL / JSON / CSV)", open=False):
            upload = gr.File(label="Question file", file_types=[".jsonl", ".json", ".csv"], type="filepath")
            upload_msg = gr.Markdown()
            upload_preview = gr.Dataframe(interactive=False, visible=False)
        data_index, dataset_index = names.index("data_files"), names.index("dataset")

        def on_upload(path: str | None):
            if not path:
                return gr.update(), gr.update(), "", gr.update(visible=False)
            try:
                up = accept_upload(path, path, ctx.uploads)
            except (DataError, OSError) as e:
                return gr.update(), gr.update(), error(str(e)), gr.update(visible=False)
            return "custom", str(up.path), upload_notes(up), gr.update(value=up.preview, visible=True)

        upload.upload(on_upload, inputs=upload,
                      outputs=[components[dataset_index], components[data_index], upload_msg, upload_preview])
    with gr.Row():
        show = gr.Button("Show config", variant="secondary")
        submit = gr.Button(f"Submit {kind} job", variant="primary", elem_id=f"submit-{kind}")
    message = gr.HTML(elem_id=f"launch-message-{kind}")
    yaml_box = gr.Code(label="Config (YAML): what will run; copy it to run from a terminal", language="yaml",
                       visible=False)

    def on_show(*widget_values):
        try:
            config = forms.config_from_values(kind, values_in_field_order(widget_values), ctx.roots)
        except ConfigError as e:
            return error(str(e)), gr.update(visible=False)
        return "", gr.update(value=forms.config_yaml(config), visible=True)

    def on_submit(n_gpus, *widget_values):
        try:
            job = ctx.submit(forms.form_config(kind, values_in_field_order(widget_values)), gpus=n_gpus)
        except ConfigError as e:
            return error(str(e))
        return ok(f"Job {job.id} queued ({kind}); follow it on the Jobs tab.")

    def on_preset(name: str):
        values = forms.preset_values(kind, name)
        return [values[i] for i in position]

    show.click(on_show, inputs=components, outputs=[message, yaml_box], api_visibility="private")
    submit.click(on_submit, inputs=[gpus, *components], outputs=message, api_visibility="private")
    preset.change(on_preset, inputs=preset, outputs=components, api_visibility="private")


def build_launch(ctx: LabContext) -> None:
    gr.Markdown("Pick a job, a preset, and change what you need. Jobs run in the background: you can close the tab.")
    with gr.Tabs():
        for kind in [*ORDER, *(k for k in JOB_KINDS.names() if k not in ORDER)]:
            with gr.Tab(kind, id=f"launch-{kind}", elem_id=f"launch-{kind}"):
                gr.Markdown(f"**{kind}** — {JOB_KINDS.get(kind).description}")
                _kind_tab(ctx, kind)
