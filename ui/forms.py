"""Job configs ⇄ form values, without Gradio: what the launch page shows and submits.

Each job kind's config is a dataclass whose fields carry their help text, so the form for a kind
is generated from it: a field's type decides its widget (choice, checkbox, number, text, a list
one entry per line, or YAML for nested values). Values come back as strings and numbers from
the browser; :func:`form_config` turns them into the config mapping Submit hands the job store,
which validates it with the same code as ``python -m jobs submit`` (and :func:`config_from_values`
for "Show config"), so the form cannot queue what the command line would refuse — and every
refusal is a message naming the field, never a traceback.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import threading
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from lab.core.config import ConfigError, spec_of, unwrap_optional
from lab.core.yamlio import dump_yaml, load_yaml, read_yaml_file
from lab.data import DATASETS, dataset_names, harness
from lab.data.templates import LM_EVAL
from lab.jobkit import kinds
from lab.jobkit.kinds import parse_config
from lab.jobkit.paths import path_problems
from lab.jobkit.pipeline import is_pipeline
from lab.jobkit.sections import DEFAULT_DATA_FILES
from lab.kinds.evaluate.config import MCQ_DATASET, MCQ_SPLIT, TOKEN_DATASETS, TOKEN_SPLIT

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# How long an example took, as bench/presets.py measured it and the example's comment says it:
# "# Measured (bench/presets.py, on a loaded 2-core CPU): 7m02s wall, 4m10s CPU".
MEASURED = re.compile(r"^# Measured \(bench/presets\.py, on (?P<where>[^)]+)\): "
                      r"(?P<wall>\d+)m(?P<wall_s>\d\d)s wall, (?P<cpu>\d+)m(?P<cpu_s>\d\d)s CPU", re.MULTILINE)
# What an evaluation's dataset and split resolve to for each task when left at the defaults
# (lab.kinds.evaluate.config: a token task given ARC-Easy's validation split reads its own).
TASK_DEFAULTS = {"mcq": (MCQ_DATASET, MCQ_SPLIT),
                 **{task: (name, TOKEN_SPLIT) for task, name in TOKEN_DATASETS.items()}}
# What an lm-eval task's picker label says of it (lab.data.harness.task_list's notes): what needs the network.
SHIPPED_NOTE = "offline, ships with the lab"
TASK_NOTES = {"offline": "offline", "hub": "hub (needs the network)",
              "group": "group (needs the network unless its tasks are offline)",
              "tag": "tag: a set of tasks (needs the network unless they are offline)"}
_INDEX: list[tuple[str, str]] = []  # lm-eval's whole task list as picker choices, once read (lm_eval_index)
_INDEX_LOCK = threading.Lock()  # two sessions opening the picker at once read the ~13 s index once


@dataclass(frozen=True)
class Field:
    """One form field: the widget it needs and how its text comes back."""

    name: str
    widget: str  # choice | multi | bool | int | float | text | lines | yaml
    default: Any
    help: str
    choices: tuple = ()
    optional: bool = False
    role: Optional[str] = None  # the field's declared role (lab.core.config): model, data_files, ...


def _widget(kind: Any) -> tuple[str, tuple, bool]:
    kind, optional = unwrap_optional(kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Literal:
        return "choice", args, optional
    if origin is list and args and typing.get_origin(args[0]) is typing.Literal:
        return "multi", typing.get_args(args[0]), optional
    if origin is list and args and args[0] is str:
        return "lines", (), optional
    if origin in (list, dict) or kind is typing.Any:
        return "yaml", (), optional
    return {bool: "bool", int: "int", float: "float"}.get(kind, "text"), (), optional


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """A config class's resolved field types: resolving them is most of what :func:`fields` costs, and
    building the app asks for a kind's fields dozens of times."""
    return typing.get_type_hints(cls)


def fields(kind: str) -> list[Field]:
    """The form fields of a job kind, key fields first."""
    cls = kinds.get(kind).config
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        widget, choices, optional = _widget(hints[f.name])
        out.append(Field(f.name, widget, default, f.metadata.get("help", ""), choices, optional, spec_of(f).role))
    key = kinds.get(kind).key_fields
    return sorted(out, key=lambda f: key.index(f.name) if f.name in key else len(key))


def is_key(kind: str, name: str) -> bool:
    """Shown first on the form (the kind's description says which), the rest under "More options"."""
    return name in kinds.get(kind).key_fields


def dataset_task(kind: str, task: Optional[str] = None) -> str:
    """The task a kind's ``dataset`` field feeds, which decides what its dropdown offers: the form's
    ``task`` where the kind has one (evaluate: ``task`` as picked, its default otherwise), else the
    task of the dataset the kind defaults to (sft's alpaca: instruction pairs; the rest: questions)."""
    form = {f.name: f for f in fields(kind)}
    if "task" in form:
        return task or form["task"].default
    return DATASETS.get(form["dataset"].default).tasks[0]


def takes_lm_eval(kind: str, task: Optional[str] = None) -> bool:
    """Whether the kind's ``dataset`` field takes an lm-eval task (``lm-eval:<task>``) for ``task``: a
    multiple-choice dataset of a kind whose config has lm-eval's fields (``num_fewshot``)."""
    return "num_fewshot" in {f.name for f in fields(kind)} and dataset_task(kind, task) == "mcq"


def task_choice(name: str, note: str) -> tuple[str, str]:
    """An lm-eval task as the picker lists it: its ``lm-eval:`` value, labelled with what it needs."""
    return f"{harness.PREFIX}{name} — {note}", harness.PREFIX + name


def shipped_choices() -> list[tuple[str, str]]:
    """The lm-eval tasks that ship with the lab (offline on the first day), for the picker at once."""
    return [task_choice(name, SHIPPED_NOTE) for name in harness.shipped_tasks()]


def lm_eval_index() -> list[tuple[str, str]]:
    """Every other multiple-choice task, group and tag lm-eval knows (the only ones the lab scores), offline
    ones first, each labelled with what it needs. Reading lm-eval's index takes ~13 s once per process, so the page is built without it and the picker
    asks for it when first opened (:func:`ui.launch_page.fill_tasks`); later calls return it at once."""
    with _INDEX_LOCK:
        if not _INDEX:
            shipped = set(harness.shipped_tasks())
            listed = sorted(((n, note) for n, note in harness.task_list() if n not in shipped and note in TASK_NOTES),
                            key=lambda task: (task[1] != "offline", task[0]))
            _INDEX.extend(task_choice(name, TASK_NOTES[note]) for name, note in listed)
        return list(_INDEX)


def dataset_choices(kind: str, task: Optional[str] = None) -> list[str | tuple[str, str]]:
    """The registered datasets the kind's ``dataset`` field accepts, for ``task`` where it has one; where it
    takes lm-eval tasks, those that ship with the lab, then lm-eval's whole list once it has been read."""
    names: list[str | tuple[str, str]] = list(dataset_names(dataset_task(kind, task)))
    if not takes_lm_eval(kind, task):
        return names
    with _INDEX_LOCK:
        rest = list(_INDEX)
    return names + shipped_choices() + rest


def dataset_fields(dataset: Optional[str], current: dict[str, Any]) -> dict[str, Any]:
    """The fields that follow a dataset just picked, as the job would resolve them (only those that change):
    an lm-eval task brings its prompt, data and scoring (cloze, template lm_eval, no data files, no
    subject); leaving one for a lab dataset puts back the dataset's default template and bundled sample
    and drops the include folder, which only lm-eval tasks read. ``current``: the fields' widget values."""
    if harness.is_task(dataset):
        wanted = {"scoring": "cloze", "template": LM_EVAL, "data_files": "", "subject": ""}
    elif current.get("template") == LM_EVAL:
        wanted = {"template": "", "lm_eval_include": "",
                  "data_files": current.get("data_files") or "\n".join(DEFAULT_DATA_FILES)}
    else:
        return {}
    return {name: value for name, value in wanted.items() if name in current and current[name] != value}


def task_fields(task: str, dataset: Optional[str], split: Optional[str]) -> tuple[str, str]:
    """The dataset and split the form shows once its task becomes ``task``: a dataset that feeds it is
    kept with its split; any other becomes the task's own default (clm: text, test), and a split left
    at another task's default becomes this task's, as the job would resolve them."""
    if dataset in dataset_names(task):
        return dataset, split or ""
    default_dataset, default_split = TASK_DEFAULTS[task]
    defaults = {s for _, s in TASK_DEFAULTS.values()}
    return default_dataset, default_split if not split or split in defaults else split


def to_widget_value(field: Field, value: Any) -> Any:
    """A config value as its widget shows it."""
    if field.widget == "lines":
        return "\n".join(map(str, value or []))
    if field.widget == "yaml":
        return "" if value in (None, [], {}) else dump_yaml(value).strip()
    if field.widget in ("text", "int", "float"):  # numbers are typed into text boxes (see launch_page)
        return "" if value is None else str(value)
    return value


def number_value(value: Any) -> Any:
    """A number box's text as a number, or as it came: the config's validator then refuses it with
    the same message a YAML file or an API call gets (``limit: must be an integer ≥ 1, got inf``).
    Every number on the form is typed as text (gr.Number's own preprocessing raises on NaN or text,
    which the page could only show as a bare "Error")."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value.strip()


def from_widget_value(field: Field, value: Any) -> Any:
    """A widget's value as the config wants it; checking it is the config validator's job."""
    if field.widget == "lines":
        return [line.strip() for line in str(value or "").splitlines() if line.strip()]
    if field.widget == "yaml":
        text = str(value or "").strip()
        if not text:
            return None if field.optional else type(field.default)()
        return load_yaml(text, field.name)
    if field.widget in ("int", "float"):
        return number_value(value)
    if field.widget == "text":
        text = str(value or "").strip()
        return None if (field.optional and not text) else text
    if field.widget == "multi":
        return list(value or [])
    if field.widget == "choice" and value is None and field.optional:
        return None
    return value


def form_config(kind: str, values: list[Any]) -> dict[str, Any]:
    """Form values (in :func:`fields` order) → the config mapping they spell, with ``kind``, unchecked:
    what Submit hands the job store, which validates and resolves it once."""
    return {"kind": kind, **{f.name: from_widget_value(f, v) for f, v in zip(fields(kind), values)}}


def config_from_values(kind: str, values: list[Any], roots: Optional[Iterable[Path]] = None,
                       runs: Optional[Path] = None) -> dict[str, Any]:
    """Form values → a validated, complete config mapping with ``kind``, its files resolved inside
    ``roots`` (so even "Show config" never lists a folder outside them); ``run:<id>``: a job of the
    store in ``runs``."""
    job_kind, parsed = parse_config(form_config(kind, values), roots, runs)
    return {"kind": job_kind.name, **parsed.to_dict()}


def config_yaml(config: dict[str, Any]) -> str:
    return dump_yaml(config)


def _examples() -> tuple[tuple[str, str, Any], ...]:
    """Each readable example's name, text and parsed YAML (each parsed once per version of its file)."""
    return tuple((path.stem, *read) for path in sorted(EXAMPLES.glob("*.yaml")) if (read := read_yaml_file(path)))


def presets(kind: str) -> dict[str, dict[str, Any]]:
    """The example configs of a kind (``examples/*.yaml``), by file name: offline quick, paper recipe.
    Copies: a caller may change what it gets without changing the next caller's."""
    found = {"defaults": {}}
    for stem, _, data in _examples():
        if isinstance(data, dict) and data.get("kind") == kind:
            found[stem] = copy.deepcopy({k: v for k, v in data.items() if k != "kind"})
    return found


def preset_time(name: str) -> Optional[str]:
    """What an example's comment says it took, as the Launch page shows it beside the name: at most
    the whole minutes of its wall time or its CPU time, whichever is less, on two idle cores. Both
    bound it: a loaded machine's wall time is longer than an idle one's, and on two idle cores a run
    that keeps a core busy takes no longer than its CPU time (which load inflates, never shrinks).
    None where the example states no measurement."""
    read = read_yaml_file(EXAMPLES / f"{name}.yaml")
    found = MEASURED.search(read[0]) if read else None
    if not found:
        return None
    wall, cpu = (60 * int(found[key]) + int(found[f"{key}_s"]) for key in ("wall", "cpu"))
    return f"≤ {max(1, math.ceil(min(wall, cpu) / 60))} min on 2 idle cores (measured on {found['where']})"


def preset_choices(names: Iterable[str]) -> list[tuple[str, str]]:
    """The Launch page's preset list: each name with its measured time where its file states one."""
    return [(f"{name} · {took}" if (took := preset_time(name)) else name, name) for name in names]


def pipelines() -> dict[str, str]:
    """The example pipeline files (``examples/*.yaml`` with ``pipeline:``), by file name: their text,
    comments included, which the Launch page shows to edit before queueing every stage."""
    return {stem: text for stem, text, data in _examples() if is_pipeline(data)}


def preset_values(kind: str, preset: Optional[str]) -> list[Any]:
    """Widget values of a preset: its fields over the defaults."""
    chosen = presets(kind).get(preset or "defaults", {})
    return [to_widget_value(f, chosen.get(f.name, f.default)) for f in fields(kind)]


def preset_problems(kind: str, preset: Optional[str], roots: Optional[Iterable[Path]] = None) -> list[str]:
    """What a preset names that this machine lacks (a data file you supply, a model not downloaded),
    each refusal as Submit would give it, all of them, so it can be said when the preset is picked."""
    chosen = presets(kind).get(preset or "defaults", {})
    try:
        return path_problems(kinds.get(kind).config, chosen, roots)
    except ConfigError as e:
        return [str(e)]
