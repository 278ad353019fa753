"""lm-evaluation-harness tasks as one more source of questions: ``dataset: lm-eval:<task>``.

A task (or a group such as ``mmlu``, or a tag) is looked up and built by lm-eval's own
``TaskManager`` — its ``doc_to_text``, ``doc_to_choice``, ``doc_to_target``, delimiters,
``description``, ``fewshot_split`` and few-shot sampler — and every document becomes an
:class:`MCQRecord` whose ``requests`` are the (context, continuation) pairs lm-eval itself built
(``Task.build_all_requests``): the lab scores those with its own batched scorer, so its argmax is
lm-eval's ``acc`` and its length-normalised argmax lm-eval's ``acc_norm``, document by document.

Only ``output_type: multiple_choice`` tasks have options to be confident about; the others
(``generate_until``, ``loglikelihood``, ``loglikelihood_rolling``) are refused, naming the type.

Where tasks come from: lm-eval's installed tasks, the ones that ship with the lab over its bundled
samples (``lab/data/bundled/lm_eval/``, ``bundled_*``: they run offline on the first day), and a
folder of the user's own YAMLs (``lm_eval_include``, as lm-eval's ``--include_path``). Such a folder is
code: a ``!function`` runs Python from it, so it is read without running it first
(:mod:`lab.data.task_folders`). Relative data files are read from the include folder (lm-eval reads them
from wherever it runs; a server has no such place).
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import yaml

from lab.core.errors import DataError, RowProblem
from lab.core.files import files_stamp

from . import samples
from .hub_copy import hub_unavailable
from .record import Load, MCQRecord
from .task_index import cached_index
from .task_folders import LOCAL_BUILDERS, local_data, names_local, yaml_loader
from .templates import Prompt

PREFIX = "lm-eval:"
SHIPPED = samples.ROOT / "lm_eval"  # the task YAMLs over the bundled samples (trusted: they ship with the lab)
NAME = re.compile(r"[A-Za-z0-9][\w.\-]{0,127}")  # a task, group or tag name as lm-eval's YAMLs spell them
FEWSHOT_SEED = 1234  # lm-eval's own default (simple_evaluate's fewshot_random_seed): the same shots as `lm_eval`
MAX_FEWSHOT = 64
MULTIPLE_CHOICE = "multiple_choice"
TRUSTED_ENV = "CALIBRATION_LAB_TRUSTED_TASKS"  # os.pathsep-separated folders whose task code a server may run


def trusted_folders() -> list[Path]:
    """The folders a server may read task YAMLs (code) from: the lab's own and those its operator named
    (``app.py --trust-tasks DIR``, which sets :data:`TRUSTED_ENV` for the server and its workers)."""
    named = [p for p in os.environ.get(TRUSTED_ENV, "").split(os.pathsep) if p]
    return [SHIPPED, *(Path(os.path.realpath(os.path.expanduser(p))) for p in named)]


def is_task(dataset: object) -> bool:
    """Whether a ``dataset`` value names an lm-eval task (``lm-eval:<task>``) rather than a lab dataset."""
    return isinstance(dataset, str) and dataset.startswith(PREFIX)


def task_name(dataset: str) -> str:
    """The task named by ``lm-eval:<task>``, its spelling checked (the name reaches lm-eval's index only)."""
    name = dataset[len(PREFIX):]
    if not NAME.fullmatch(name):
        raise DataError(f"{dataset!r}: after {PREFIX!r} comes a task, group or tag name (letters, digits, '_', "
                        "'-', '.'), e.g. lm-eval:bundled_arc_easy or lm-eval:mmlu")
    return name


# ---------------------------------------------------------------- lm-eval's index


def _folders(include: Optional[str]) -> tuple[str, ...]:
    return (str(SHIPPED),) + ((include,) if include else ())


def _stamp(folders: Sequence[str]) -> tuple:
    """Changes when a YAML in ``folders`` does (an index cached across submissions must see an edit)."""
    return files_stamp(p for f in folders for p in sorted(Path(f).rglob("*.yaml")))


def full_index(include: Optional[str] = None) -> Any:
    """lm-eval's ``TaskManager`` with its installed tasks, the lab's and ``include``'s."""
    folders = _folders(include)
    return cached_index(folders, True, _stamp(folders))


def manager(name: str, include: Optional[str]) -> Any:
    """lm-eval's ``TaskManager`` that knows ``name``: the lab's and the include folder's tasks alone where they hold
    it, else with lm-eval's ~15,000 installed ones (:func:`lab.data.task_index.cached_index`: ~13 s to build once,
    0.5 s to read back). Raises a :class:`DataError` with the closest names when no index has it."""
    folders = _folders(include)
    stamp = _stamp(folders)
    small = cached_index(folders, False, stamp)
    if name in small.all_tasks:
        return small
    full = cached_index(folders, True, stamp)
    if name in full.all_tasks:
        return full
    close = difflib.get_close_matches(name, full.all_tasks, n=3)
    hint = f" Did you mean {', '.join(PREFIX + c for c in close)}?" if close else ""
    where = " or in lm_eval_include" if include else ""
    raise DataError(f"unknown lm-eval task {name!r}: not among lm-eval's {len(full.all_tasks):,} tasks, groups and "
                    f"tags{where}.{hint} The offline ones that ship with the lab: "
                    f"{', '.join(PREFIX + t for t in shipped_tasks())}")


@functools.lru_cache(maxsize=1)
def shipped_tasks() -> tuple[str, ...]:
    """The tasks and groups over the bundled samples (``bundled_…``), a group's members left out. Read once:
    the files ship with the lab, and parsing their 63 YAMLs took 77 ms each time the Launch form drew a picker."""
    names, members = [], set()
    for path in sorted(SHIPPED.glob("*.yaml")):
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml_loader([]))  # noqa: S506 (SafeLoader)
        if isinstance(cfg, dict) and isinstance(cfg.get("group"), str):
            names.append(cfg["group"])
            members.update(m for m in cfg.get("task") or [] if isinstance(m, str))
        elif isinstance(cfg, dict) and isinstance(cfg.get("task"), str):
            names.append(cfg["task"])
    return tuple(n for n in names if n not in members)


def task_list(include: Optional[str] = None) -> list[tuple[str, str]]:
    """Every task, group and tag lm-eval knows here, each with a note: ``offline`` (its data is on this
    machine or shipped), ``hub`` (its dataset comes from the Hugging Face hub, or its data files from a
    URL such as ``hf://``: needs the network once), ``group`` / ``tag``, or, for a task the lab cannot
    score, its output type (``generate_until``, …). For the Launch form's searchable picker."""
    index = full_index(include)
    notes = []
    for name in index.all_tasks:
        entry = index.task_index[name]
        kind = getattr(getattr(entry, "kind", None), "name", "")
        if kind in ("GROUP", "TAG"):
            notes.append((name, kind.lower()))
            continue
        cfg = getattr(entry, "cfg", None) or {}
        if cfg.get("output_type", MULTIPLE_CHOICE) != MULTIPLE_CHOICE:
            notes.append((name, str(cfg["output_type"])))
            continue
        kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
        remote = any("://" in f for f in local_data(kwargs.get("data_files")))
        local = (cfg.get("dataset_path") in LOCAL_BUILDERS and not remote) or "custom_dataset" in cfg
        notes.append((name, "offline" if local else "hub"))
    return notes


# ---------------------------------------------------------------- building the tasks


def _leaves(loaded: dict, groups: dict[str, list[str]], owners: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(name, Task) of every leaf of ``get_task_dict``'s nested result; each group's leaves go in ``groups``."""
    for key, value in loaded.items():
        if isinstance(value, dict):  # a group: {ConfigurableGroup: {member: Task or a nested group}}
            name = getattr(key, "group_name", None) or str(key)
            groups.setdefault(name, [])
            yield from _leaves(value, groups, owners + (name,))
        else:
            for owner in owners:
                groups[owner].append(key)
            yield key, value


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's info and warnings (a custom dataset's "--metadata" hint, a metric's default aggregation) and
    its request-building progress bar (a line per task: 57 for MMLU) are about its own command line: a job's
    log keeps the lab's lines. The bar is lm-eval's module-level ``tqdm``, handed ``disable`` here."""
    from lm_eval.api import task as task_module

    logger = logging.getLogger("lm_eval")
    level, bar = logger.level, getattr(task_module, "tqdm", None)
    logger.setLevel(logging.ERROR)
    if bar is not None:
        task_module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        logger.setLevel(level)
        if bar is not None:
            task_module.tqdm = bar


def _build(name: str, include: Optional[str]) -> dict:
    from lm_eval.tasks import get_task_dict

    tm = manager(name, include)
    with warnings.catch_warnings(), contextlib.chdir(include or SHIPPED), _quiet():
        warnings.simplefilter("ignore", DeprecationWarning)  # get_task_dict: the one API every 0.4 release has
        try:
            return get_task_dict([name], tm)
        except (OSError, ValueError, KeyError, TypeError) as e:  # a missing file, a bad YAML field, no network
            raise DataError(f"lm-eval could not build task {name!r}: {type(e).__name__}: {e}") from None


def _gold(task: Any, doc: dict, choices: list[str]) -> int | str:
    """The correct option's index, as lm-eval's ``process_results`` finds it, or why there is none."""
    gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
    if isinstance(gold, list):
        if len(gold) != 1:
            return f"{len(gold)} correct options (a multiple-target document): the lab scores one answer a question"
        gold = gold[0]
    if isinstance(gold, str):
        gold = choices.index(gold) if gold in choices else gold
    if not isinstance(gold, int) or not 0 <= gold < len(choices):
        return f"target {gold!r} is not one of its {len(choices)} options"
    return gold


def _records(name: str, task: Any) -> tuple[list[MCQRecord], list[RowProblem]]:
    by_doc: dict[int, list[Any]] = {}
    for inst in task.instances:
        by_doc.setdefault(inst.doc_id, []).append(inst)
    records, problems = [], []
    for doc_id, insts in by_doc.items():
        insts.sort(key=lambda i: i.idx)
        doc = insts[0].doc
        choices = [str(c) for c in task.doc_to_choice(doc)]
        requests = tuple((str(i.arguments[0]), str(i.arguments[1])) for i in insts[: len(choices)])
        gold = _gold(task, doc, choices)
        if isinstance(gold, str):
            problems.append(RowProblem(name, doc_id, gold))
            continue
        question = task.doc_to_target(doc) if task.multiple_input else task.doc_to_text(doc)
        records.append(MCQRecord(
            id=f"{name}/{doc_id}", question=str(question), choices=tuple(choices), answer=gold, source=name,
            meta={"task": name, "doc_id": doc_id}, requests=requests, origin=(name, doc_id),
        ))
    return records, problems


def read_task(dataset: str, include: Optional[str] = None, num_fewshot: Optional[int] = None,
              limit: Optional[int] = None) -> Load:
    """The documents of ``lm-eval:<task>`` (each leaf of a group) as records, with lm-eval's requests, and
    each leaf's shots, split, metrics and size, each group's leaves: :func:`lab.data.loading.load`'s source
    for lm-eval tasks (load one through it).

    ``num_fewshot`` overrides the task's own (as ``lm_eval --num_fewshot`` does, which leaves a task whose
    YAML sets ``num_fewshot: 0`` zero-shot: simple_evaluate's rule); the shots are drawn by
    lm-eval's sampler with its default seed, so the contexts are those ``lm_eval`` builds. ``limit``: the
    first N documents of each task, as ``lm_eval --limit N``.
    """
    name = task_name(dataset)
    groups: dict[str, list[str]] = {}
    leaves = list(_leaves(_build(name, include), groups))
    records: list[MCQRecord] = []
    problems: list[RowProblem] = []
    tasks: dict[str, dict[str, Any]] = {}
    for leaf, task in leaves:
        if task.OUTPUT_TYPE != MULTIPLE_CHOICE:
            raise DataError(not_multiple_choice(leaf, task.OUTPUT_TYPE))
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:  # lm-eval keeps a task's own 0
            task.set_config(key="num_fewshot", value=num_fewshot)
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
        try:
            with contextlib.chdir(include or SHIPPED), _quiet():
                task.build_all_requests(limit=limit, rank=0, world_size=1)
            got, bad = _records(leaf, task)
        except (IndexError, KeyError, TypeError, ValueError, AttributeError) as e:  # the task's own templates
            raise DataError(f"lm-eval task {leaf!r} could not build its prompts: {type(e).__name__}: {e}. Check its "
                            "doc_to_text / doc_to_target / doc_to_choice against the data (a target index past "
                            "the choices, a field the rows lack)") from None
        records += got
        problems += bad
        split = task.config.test_split or task.config.validation_split
        tasks[leaf] = {"shots": int(task.config.num_fewshot or 0), "split": split, "n": len(got),
                       "metrics": sorted(k for k in task._metric_fn_list if k in ("acc", "acc_norm"))}
    if not records:
        raise DataError(f"lm-eval task {name!r} gave no usable document ({len(problems)} skipped"
                        + (f": {problems[0]}" if problems else "") + ")")
    shots = sorted({t["shots"] for t in tasks.values()})
    source = (f"lm-eval:{name} ({len(tasks)} task{'s' if len(tasks) > 1 else ''}, "
              f"{'/'.join(map(str, shots))}-shot, {len(records)} documents, {len(problems)} skipped)")
    return Load(records, problems, source, tasks, {g: m for g, m in groups.items() if m})


def not_multiple_choice(name: str, output_type: str) -> str:
    return (f"lm-eval task {name!r} is a {output_type} task: the lab measures calibration of the options' "
            f"probabilities, so only output_type {MULTIPLE_CHOICE} tasks can be scored")


# ---------------------------------------------------------------- checks before a job is queued


def _entry_config(index: Any, name: str) -> dict:
    """The task's YAML config, includes resolved, without importing any ``!function`` (lm-eval's reader)."""
    entry = index.task_index[name]
    path = getattr(entry, "yaml_path", None)
    if path is None:
        return dict(getattr(entry, "cfg", None) or {})
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(path, resolve_func=False)


def _members(index: Any, name: str, seen: set[str]) -> Iterator[str]:
    """The leaf tasks of a task, group or tag, from the index alone (nothing built, nothing downloaded)."""
    if name in seen or name not in index.task_index:
        return
    seen.add(name)
    entry = index.task_index[name]
    kind = getattr(getattr(entry, "kind", None), "name", "TASK")
    if kind == "TAG":
        for other, e in index.task_index.items():
            if name in getattr(e, "tags", ()):
                yield from _members(index, other, seen)
    elif kind == "GROUP":
        members = (_entry_config(index, name) or {}).get("task") or []
        for member in members if isinstance(members, list) else [members]:
            member = member.get("task") if isinstance(member, dict) else member
            if isinstance(member, str):
                yield from _members(index, member, seen)
    else:
        yield name


def check_task(dataset: str, include: Optional[str] = None) -> None:
    """What Submit can know of ``lm-eval:<task>`` before the job runs: it exists (with the closest names
    if not), every leaf is multiple choice, and a leaf whose data comes from the hub can reach it.
    Raises a :class:`DataError` saying which."""
    name = task_name(dataset)
    index = manager(name, include)
    for leaf in _members(index, name, set()):
        cfg = _entry_config(index, leaf)
        output_type = cfg.get("output_type", "generate_until")
        if output_type != MULTIPLE_CHOICE:
            raise DataError(not_multiple_choice(leaf, output_type))
        path = cfg.get("dataset_path")
        why = hub_unavailable(path) if _reads_hub(cfg, include) else None
        if why is not None:
            raise DataError(f"lm-eval task {leaf!r} reads dataset {path!r} from the Hugging Face hub, but {why}. "
                            "Write a task YAML over local files (dataset_path: json, dataset_kwargs.data_files) in "
                            f"an include folder, or use an offline one: {', '.join(shipped_tasks())}")


def _reads_hub(cfg: dict, include: Optional[str]) -> bool:
    """Whether a task's dataset comes from the hub: not a builder over local files, a ``custom_dataset``, nor a
    ``dataset_path`` folder on this machine (relative: the include folder's, where the task is built)."""
    path = cfg.get("dataset_path")
    return ("custom_dataset" not in cfg and isinstance(path, str) and path not in LOCAL_BUILDERS
            and not names_local(path, Path(include) if include else SHIPPED))


# ---------------------------------------------------------------- what the scorer reads


def prompts_of(records: Iterable[MCQRecord]) -> tuple[list[Prompt], list[list[tuple[int, int]]]]:
    """The prompts to score for records with lm-eval ``requests``: one per distinct context of a record
    (a usual task: one context, every option after it; ``multiple_input`` tasks such as Winogrande:
    one context per option, the same continuation after each), and where each option's score lands:
    ``owners[r][j] = (prompt, option)``. Trailing whitespace of a context moves to its continuations
    when tokenised, as lm-eval's ``_encode_pair`` moves it (``Prompt.spaces``)."""
    prompts: list[Prompt] = []
    owners: list[list[tuple[int, int]]] = []
    for record in records:
        at: dict[str, int] = {}
        options: dict[str, list[str]] = {}
        spots = []
        for context, continuation in record.requests:
            if context not in at:
                at[context] = len(at)
                options[context] = []
            spots.append((at[context], len(options[context])))
            options[context].append(continuation)
        base = len(prompts)
        prompts += [Prompt(context, tuple(options[context]), spaces=None) for context in at]
        owners.append([(base + p, o) for p, o in spots])
    return prompts, owners

