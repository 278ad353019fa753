"""Every file a job config names, resolved to concrete files and checked before the job is queued.

The fields that name files are found from the config classes' own declarations (a field whose
role is ``data_files``, ``files``, ``dir``, ``temperature``, ``calibrator`` or ``model``, in nested
entries too), never from a list of key names kept here. Each value is turned into concrete, realpath-resolved
files: ``~`` expanded, a glob expanded and *every match* checked, a folder listed and every file
in it checked, ``SPLIT=PATH`` kept with its split, ``..`` and symlinks followed to where they
lead. With ``roots`` (a config from a browser) every one of them must lie inside a root, and a
glob's fixed folder is checked before it is listed, so a refusal never tells what exists
outside; inside them, a path that does not exist is named as not found, with where it was
looked for. The resolved config is what the job store keeps and the worker reads; since its
entries are existing files, the loader takes them literally and never globs again.

The entry ``bundled`` (a whole entry, never a path prefix) names the package's own sample of the
dataset (:mod:`lab.data.samples`), as ``model: bundled`` names the bundled model: it is checked
here (the dataset has one) and kept as written, so that a stored config resolves to itself when it
is cloned or run, and reads the same on another clone; the loader expands it to the sample's
``SPLIT=PATH`` files. Those lie in ``lab/data/bundled/``, which is always an allowed root, read-only,
so naming one of them by its path is allowed too.

A saved temperature or calibrator may also be named as the pages name it, relative to the job
store's folder (``00012-evaluate``, ``calibrators/<name>``): a browser's user knows no other folder of
the server. Messages name every file as :func:`lab.core.reads.shown` does, from the allowed folder
holding it, never by the server's absolute path.

A model field may name another job's result instead, ``run:<id>`` (:mod:`lab.jobkit.chain`): it is
checked against the job store the config is submitted to and kept as written, for the worker
resolves it again when the job starts.

Only the shapes :func:`lab.core.config.validate` lets through arrive here (text, lists of text,
numbers for a temperature): a mapping, a nested list or an alias never reaches a path check.
"""
from __future__ import annotations

import glob
import itertools
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from lab.core.config import PATH_ROLES, ConfigError, spec_of, validate, walk
from lab.core.errors import ModelLoadError
from lab.core.layout import CALIBRATOR_FILE, TEMPERATURE_FILE
from lab.core.reads import PathNotAllowed, inside, resolved_entries, shown, shown_roots
from lab.data import DATASETS, DataError, harness, samples, task_folders, with_sample
from lab.data.files import list_folder, split_entry
from lab.data.hub_copy import hub_copy_problem
from lab.jobkit import chain
from lab.models.tokenizers import check_folder_template
from lab.models.weights import NAMED_MODELS, check_model_folder

MAX_FILES = 10_000  # files one config may resolve to (a glob over a huge tree is refused, not walked)
MAX_TREE = 10_000  # entries of a model or adapter folder checked for symlinks leading out
DATA_EXTENSIONS = (".jsonl", ".json", ".csv")
PAIR_EXTENSIONS = (".jsonl", ".json")
# A Hugging Face repo id: org/name or name, letters, digits, "-", "_", "." (no "..", no "--").
HUB_ID = re.compile(r"(?!.*(\.\.|--))[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


class Policy:
    """Where files may be: anywhere this process can read (``roots`` None), or inside ``roots``; and
    the job store ``run:<id>`` is looked up in (``runs`` None: none, so a reference is refused)."""

    def __init__(self, roots: Optional[Iterable[Path]], runs: Optional[chain.Runs] = None) -> None:
        given = None if roots is None else [*roots, samples.ROOT]
        self.roots = None if given is None else [Path(os.path.realpath(os.path.expanduser(r))) for r in given]
        self.named = given  # as the operator named them: what messages call them (:meth:`shown`)
        self.runs = runs

    def allows(self, real: Path) -> bool:
        return inside(real, self.roots)

    def shown(self, real: Path) -> str:
        """How a message names the resolved path ``real`` (:func:`lab.core.reads.shown`): from the
        allowed folder holding it (``calibration-lab/data/mmlu/test``), never the server's absolute
        path; on a command line run without roots (the operator's own shell), the path itself."""
        return shown(real, self.named)

    def check(self, field: str, real: Path, given: str) -> None:
        if self.allows(real):
            return
        # Only a question file can be uploaded (the Launch page's "Your own questions"); a model, an
        # adapter or an output folder has to be where the server may read it.
        upload = ("Upload it on the Launch page (\"Your own questions\"), put it under one of those folders"
                  if field.startswith("data_files") else "Put it under one of those folders")
        raise PathNotAllowed(f"{field}: {given!r} leads outside the folders this server may read "
                             f"({shown_roots(self.named)}). "
                             f"{upload}, or ask the operator to start the app with --allow-path for its folder.")

    def check_tree(self, field: str, folder: Path, given: str) -> None:
        """Every entry of ``folder`` (a model, an adapter) resolves inside the roots: no symlink leads out."""
        if self.roots is None:
            return
        for seen, (_, resolved) in enumerate(resolved_entries(folder), 1):
            if seen > MAX_TREE:
                raise ConfigError(f"{field}: {given!r} holds more than {MAX_TREE:,} entries; is it a model folder?")
            self.check(field, resolved, given)


def _real(text: str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(text)))


def _expand(field: str, given: str, extensions: tuple[str, ...], policy: Policy) -> list[Path]:
    """One entry (a file, a folder or a glob) as checked, realpath-resolved files."""
    text = os.path.expanduser(given)
    literal = os.path.lexists(text) or not glob.has_magic(text)
    if literal:
        candidates = [text]
    else:
        parts = Path(text).parts
        first_wild = next(i for i, p in enumerate(parts) if glob.has_magic(p))
        if ".." in parts[first_wild:]:  # glob would list the folder it climbs to before any check could
            raise ConfigError(f"{field}: {given!r} has '..' after a wildcard; write the folder out instead")
        glob_root = str(Path(*parts[:first_wild])) if first_wild else "."
        policy.check(field, _real(glob_root), given)  # the folder the glob lists, before it is listed
        candidates = list(itertools.islice(glob.iglob(text, recursive=True), MAX_FILES + 1))
        if len(candidates) > MAX_FILES:
            raise ConfigError(f"{field}: {given!r} matches more than {MAX_FILES:,} files")
        if not candidates:
            raise ConfigError(f"{field}: no files match the pattern {given!r}")
    files: list[Path] = []
    for candidate in sorted(candidates):
        real = _real(candidate)
        policy.check(field, real, given)  # every match, before it is opened or listed
        if real.is_dir():
            try:
                listed = list_folder(real, extensions, given)
            except DataError as e:
                raise ConfigError(f"{field}: {e}") from None
            for path in listed:
                resolved = _real(str(path))
                policy.check(field, resolved, given)
                files.append(resolved)
        elif real.is_file():
            files.append(real)
        elif literal:  # inside the roots (checked above): saying it is missing tells nothing outside
            raise ConfigError(f"{field}: file not found: {given!r} (looked for {policy.shown(real)})")
    for path in files:
        if glob.has_magic(str(path)):
            raise ConfigError(f"{field}: {policy.shown(path)!r} has a wildcard character (*, ? or [) in its name; "
                              "rename it")
    return files


def _dataset_extensions(holder: dict[str, Any], owner: type) -> tuple[str, ...]:
    """The file extensions a folder of the holder's dataset is listed by."""
    name = _dataset_name(holder, owner)
    return DATASETS.get(name).extensions if isinstance(name, str) and name in DATASETS else DATA_EXTENSIONS


def _resolve_entries(field: str, value: list[str], extensions: tuple[str, ...], policy: Policy,
                     with_split: bool) -> list[str]:
    """Each entry (``SPLIT=PATH`` too, ``with_split``) as the checked files it names, in order."""
    out: list[str] = []
    for i, entry in enumerate(value):
        if entry == samples.BUNDLED:  # the package's own sample (checked by the caller), kept as written
            out.append(entry)
            continue
        split, given = split_entry(entry) if with_split else (None, entry)
        out += [f"{split}={p}" if split else str(p) for p in _expand(f"{field}[{i}]", given, extensions, policy)]
        if len(out) > MAX_FILES:
            raise ConfigError(f"{field}: resolves to more than {MAX_FILES:,} files")
    return out


def _dataset_name(holder: dict[str, Any], owner: type) -> Any:
    default = next((f.default for f in fields(owner) if f.name == "dataset"), None)
    return holder.get("dataset", default)


def _check_bundled(field: str, value: list[str], holder: dict[str, Any], owner: type) -> None:
    """``bundled`` stands alone (not ``SPLIT=bundled``) and names a sample the dataset has."""
    for i, entry in enumerate(value):
        if split_entry(entry)[1] == samples.BUNDLED and entry != samples.BUNDLED:
            raise ConfigError(f"{field}[{i}]: {samples.misplaced(entry)}")
    if samples.BUNDLED in value:
        try:
            samples.require(DATASETS.get(_dataset_name(holder, owner)), with_sample())
        except DataError as e:
            raise ConfigError(f"{field}[{value.index(samples.BUNDLED)}]: {e}") from None


def _data_files(field: str, value: list[str], holder: dict[str, Any], owner: type, policy: Policy) -> list[str]:
    name = _dataset_name(holder, owner)
    if harness.is_task(name) and value == [samples.BUNDLED]:
        return []  # the default [bundled] with an lm-eval task, whose YAML names its data (lm_eval_include)
    # No files here nor in data_files (val_data_files falls back on those): the job reads the hub copy,
    # so where it cannot (offline, say) Submit refuses now rather than the job failing once started.
    problem = None if value or holder.get("data_files") or name not in DATASETS else hub_copy_problem(name)
    if problem:
        raise ConfigError(f"{field}: empty, so {problem}")
    _check_bundled(field, value, holder, owner)
    return _resolve_entries(field, value, _dataset_extensions(holder, owner), policy, with_split=True)


def _files(field: str, value: list[str], holder: dict[str, Any], owner: type, policy: Policy) -> list[str]:
    # `bundled` in a files field (preference pairs, the only one) is the sample of their dataset,
    # ultrafeedback (lab.data.preferences), which the loader expands; it is kept as written, as in data_files.
    return _resolve_entries(field, value, PAIR_EXTENSIONS, policy, with_split=False)


def _folder(field: str, value: str, policy: Policy, what: str) -> str:
    """An existing folder, resolved, with nothing in it leading outside the roots."""
    real = _real(value)
    policy.check(field, real, value)
    if not real.is_dir():
        raise ConfigError(f"{field}: {value!r} is not {what} on this machine")
    policy.check_tree(field, real, value)
    return str(real)


def _dir(field: str, value: str, holder: dict[str, Any], owner: type, policy: Policy) -> str:
    return _folder(field, value, policy, "a folder")


def _tasks(field: str, value: str, holder: dict[str, Any], owner: type, policy: Policy) -> str:
    """An lm-eval include folder: allowed, trusted with code where roots apply (a browser's config), every YAML
    in it well-formed, its ``!function`` modules and includes inside it, and the data its YAMLs name allowed."""
    real = Path(_folder(field, value, policy, "a folder"))
    if policy.roots is not None and not inside(real, harness.trusted_folders()):
        raise ConfigError(f"{field}: {value!r} is not a folder this server trusts with code. An lm-eval include "
                          "folder runs the Python its YAMLs name (!function); ask the operator to start the app with "
                          "--trust-tasks for it")
    try:
        scan = task_folders.scan_folder(real, policy.shown(real))
    except DataError as e:
        raise ConfigError(f"{field}: {e}") from None
    for what, path in scan.data:
        if not policy.allows(path):
            raise PathNotAllowed(f"{field}: {what} leads outside the folders this server may read "
                                 f"({shown_roots(policy.named)}); put the data under one of them")
    return str(real)


def _names_a_path(text: str) -> bool:
    """Whether text reads as a path (a folder in it, ~, a dot, a .json name), not as a stray word."""
    return os.sep in text or "/" in text or text.startswith(("~", ".")) or text.lower().endswith(".json")


def _temperature(field: str, value: Any, holder: dict[str, Any], owner: type, policy: Policy) -> Any:
    """A number (the validator made numeric text one), or an existing temperature.json or its folder.

    A stray word (``hot``) outside the roots is answered as a bad temperature, not as a path leading
    outside: that would say nothing useful, and "not found" there would tell what exists outside."""
    if isinstance(value, float):
        return value
    expected = f"{field}: expected a positive number or a {TEMPERATURE_FILE} (file or folder), got {value!r}"
    try:
        real = _artefact(value, policy)
    except OSError:  # a relative value, and the server's working folder is gone: nothing to find it in
        raise ConfigError(expected) from None
    if not policy.allows(real) and not _names_a_path(value):
        raise ConfigError(expected)
    found = _saved_file(field, real, value, policy, TEMPERATURE_FILE)
    if found:
        return found
    if not _names_a_path(value):
        raise ConfigError(expected)
    raise ConfigError(f"{expected}: there is none at {policy.shown(real)}. Fit one first (the CFT job's ts/ folder "
                      "or the temperature lab's Save button writes one)")


def _calibrator(field: str, value: str, holder: dict[str, Any], owner: type, policy: Policy) -> str:
    """An existing calibrator.json, or a folder holding one, as the file's resolved path: a job then
    reads exactly the file that was checked, even if a folder gains another later."""
    expected = f"{field}: expected a {CALIBRATOR_FILE} (file or folder)"
    try:
        real = _artefact(value, policy)
    except OSError:  # a relative value, and the server's working folder is gone: nothing to find it in
        raise ConfigError(f"{expected}, got {value!r}") from None
    found = _saved_file(field, real, value, policy, CALIBRATOR_FILE)
    if found:
        return found
    raise ConfigError(f"{expected}, but there is none at {policy.shown(real)}. Fit one in the Recalibration "
                      "workbench and save it")


def _artefact(value: str, policy: Policy) -> Path:
    """Where a saved temperature or calibrator ``value`` names is, resolved: the path as given where it
    exists; else, for a relative one, in the job store's folder. Pages name what they save from there
    (``00012-evaluate/temperature.json``, ``calibrators/<name>``), and a browser's user knows no other
    folder of the server to type. A ``..`` is never looked for there: it climbs out of the store."""
    text = os.path.expanduser(value)
    if policy.runs is None or os.path.isabs(text) or os.path.lexists(text) or ".." in Path(text).parts:
        return _real(value)
    return _real(str(Path(policy.runs.folder) / text))


def _saved_file(field: str, real: Path, given: str, policy: Policy, name: str) -> Optional[str]:
    """A saved artefact (``name``, e.g. temperature.json) at ``real`` or in the folder ``real``, as its
    resolved path, inside the roots; None when there is none."""
    policy.check(field, real, given)
    if real.is_dir():
        real = _real(str(real / name))
        policy.check(field, real, given)
    return str(real) if real.is_file() else None


def looks_like_path(value: str, policy: Policy) -> bool:
    """A path rather than a hub id: it says so (``/``, ``.``, ``~``), or it names something that
    exists inside the allowed folders. Whether it exists *outside* them is never asked: ``secret``
    must get the same answer whether or not a folder of that name lies outside."""
    if value.startswith(("/", ".", "~")):
        return True
    real = _real(value)
    return policy.allows(real) and os.path.lexists(real)


def _model(field: str, value: str, holder: dict[str, Any], owner: type, policy: Policy) -> str:
    if value in NAMED_MODELS:
        return value
    if value.startswith(chain.PREFIX):
        return _run_reference(field, value, holder, owner, policy)
    if looks_like_path(value, policy):
        folder = _folder(field, value, policy, "a model folder")
        _check_model_folder(field, Path(folder))
        return folder
    if not HUB_ID.fullmatch(value):
        raise ConfigError(f"{field}: {value!r} is neither {', '.join(map(repr, NAMED_MODELS))}, a model folder, nor a "
                          "Hugging Face hub id (org/name)")
    _check_hub_model(field, value)
    return value


def _check_model_folder(field: str, folder: Path) -> None:
    """A model folder's config.json, weights' headers and chat template, read as the job will read them, are
    what they claim (:func:`lab.models.weights.check_model_folder`, :func:`lab.models.tokenizers.check_folder_template`):
    refused now, naming the file inside the folder, instead of failing the job once it loads them."""
    try:
        check_model_folder(folder)
        check_folder_template(folder)
    except ModelLoadError as e:
        raise ConfigError(f"{field}: in the model folder, {e}") from None


def _run_reference(field: str, value: str, holder: dict[str, Any], owner: type, policy: Policy) -> str:
    """``run:<id>``, kept as written once checked (:meth:`lab.jobkit.chain.Runs.check`): the worker
    resolves it again when the job starts, as the earlier job will have moved on by then."""
    chain.job_of(field, value)  # a malformed one is refused as such, with or without a store
    spec = spec_of(next(f for f in fields(owner) if f.name == field.rpartition(".")[2]))
    if spec.adapter_field and holder.get(spec.adapter_field) is not None:
        raise ConfigError(f"{field}: {value} brings its own weights (a LoRA run's adapter too); leave "
                          f"{spec.adapter_field} unset")
    if policy.runs is None:
        raise ConfigError(f"{field}: {value} names a job of the job store, and this config is not run from one: "
                          "submit it (python -m jobs submit, or the Launch page), or name the run's model/ folder")
    policy.check(field, policy.runs.check(field, value), value)
    return value


def _check_hub_model(field: str, name: str) -> None:
    """A hub id this machine cannot load — not in the Hugging Face cache, the hub unreachable — is
    refused now, instead of failing seconds after the job starts."""
    from huggingface_hub import try_to_load_from_cache

    from lab.core.hub import hub_reachable

    if isinstance(try_to_load_from_cache(name, "config.json"), str) or hub_reachable():
        return
    raise ConfigError(f"{field}: unknown model {name!r}: not a local folder, not in the Hugging Face cache, and the "
                      "hub cannot be reached from this machine. Use 'bundled', a folder under the runs folder, or a "
                      "hub id once online.")


RESOLVERS: dict[str, Callable[..., Any]] = {"data_files": _data_files, "files": _files, "dir": _dir, "tasks": _tasks,
                                            "temperature": _temperature, "calibrator": _calibrator, "model": _model}
assert set(RESOLVERS) == set(PATH_ROLES)


def resolve_paths(cls: type, values: dict[str, Any], roots: Optional[Iterable[Path]] = None,
                  runs: Optional[chain.Runs] = None) -> dict[str, Any]:
    """``values`` (already through :func:`lab.core.config.validate`) with every file-naming field
    resolved; with ``roots``, anything that leads outside them raises :class:`PathNotAllowed`;
    ``runs``: the job store a ``run:<id>`` names a job of."""
    policy = Policy(roots, runs)
    for field, spec, holder, key, owner in walk(cls, values):
        if spec.role in RESOLVERS and holder[key] is not None:
            try:
                holder[key] = RESOLVERS[spec.role](field, holder[key], holder, owner, policy)
            except OSError as e:  # a folder that cannot be listed, a file vanishing while it is checked
                raise ConfigError(f"{field}: cannot read {holder[key]!r}: {e.strerror or type(e).__name__}") from None
    return values


def path_problems(cls: type, values: Any, roots: Optional[Iterable[Path]] = None) -> list[str]:
    """Every file-naming entry of ``values`` that :func:`resolve_paths` would refuse, each with its
    message: what a preset needs that this machine lacks, all at once rather than one per Submit."""
    policy, problems = Policy(roots), []
    for field, spec, holder, key, owner in walk(cls, validate(cls, values)):
        value = holder[key]
        if spec.role not in RESOLVERS or value is None:
            continue
        singles = [(f"{field}[{i}]", [entry]) for i, entry in enumerate(value)] if isinstance(value, list) else [
            (field, value)]
        for where, single in singles:
            try:
                RESOLVERS[spec.role](field, single, holder, owner, policy)
            except ConfigError as e:  # a one-entry list is refused as entry [0]: name it by its own index
                problems.append(where + str(e).removeprefix(f"{field}[0]" if isinstance(value, list) else field))
            except OSError as e:
                problems.append(f"{where}: cannot read {single!r}: {e.strerror or type(e).__name__}")
    return problems


def checked_config(cls: type, values: Any, roots: Optional[Iterable[Path]] = None,
                   runs: Optional[chain.Runs] = None) -> dict[str, Any]:
    """Validated, then resolved: the keyword arguments of ``cls`` for a config from anywhere."""
    return resolve_paths(cls, validate(cls, values), roots, runs)
