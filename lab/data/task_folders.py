"""A folder of lm-eval task YAMLs (``lm_eval_include``), read without running any of it.

Such a folder is code: lm-eval imports the Python a YAML's ``!function`` names, from beside the YAML
or from any installed module. :func:`scan_folder` parses every YAML with a loader that records each
``!function`` instead of importing it, and refuses a malformed file (named with its line), a
``!function`` whose module is not a ``.py`` file inside the folder and an ``include`` leading outside
it; it returns the local data the YAMLs name, for the caller's allowed-folder check
(:func:`lab.jobkit.paths`). Which folders a server runs at all is its operator's call
(:func:`lab.data.harness.trusted_folders`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from lab.core.errors import DataError
from lab.core.reads import inside

MAX_YAML_FILES = 5000  # YAMLs one include folder may hold
MAX_YAML_BYTES = 1 << 20  # ... each at most
LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas"}  # dataset_path values that read local files


@dataclass
class FolderScan:
    """What the YAMLs of an include folder name: the local data they read (resolved paths)."""

    data: list[tuple[str, Path]] = field(default_factory=list)  # (file:key, resolved path)


class _Function(str):
    """A ``!function`` value as written (module.function), recorded instead of imported."""


def yaml_loader(found: list[tuple[int, str]]) -> type:
    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> _Function:
        value = loader.construct_scalar(node)  # type: ignore[arg-type]
        found.append((node.start_mark.line + 1, str(value)))
        return _Function(value)

    Loader.add_constructor("!function", function)
    return Loader


def _function_file(qual: str, yaml_dir: Path) -> Path:
    """The file lm-eval imports for ``!function qual`` from a YAML in ``yaml_dir`` (its first lookup)."""
    module = qual.rpartition(".")[0]
    return Path(os.path.realpath(yaml_dir / f"{module.replace('.', '/')}.py"))


def _yaml_files(folder: Path) -> list[Path]:
    files: list[Path] = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".yaml", ".yml") or (path.is_file() and path.name.endswith("_yaml")):
            files.append(path)
            if len(files) > MAX_YAML_FILES:
                raise DataError(f"holds more than {MAX_YAML_FILES:,} YAML files; is it a folder of task YAMLs?")
    return files


def local_data(value: Any) -> Iterator[str]:
    """The paths a ``data_files`` value holds: a path, a list of them, or split → path(s)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from local_data(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from local_data(item)


def names_local(dataset_path: str, folder: Path) -> bool:
    """A ``dataset_path`` that is a folder on this machine rather than a hub id (``org/name``)."""
    return dataset_path.startswith(("/", ".", "~")) or (folder / dataset_path).exists()


def scan_folder(folder: Path, shown: str) -> FolderScan:
    """Read every task YAML under ``folder`` (a resolved path) without running any of it.

    Refused with a :class:`DataError` naming the file (as ``shown`` + its path inside, and the
    line): a file too large or not YAML, a ``!function`` whose module is not a ``.py`` file inside
    the folder, an ``include`` leading outside it. The local data each YAML names
    (``dataset_kwargs.data_files``/``data_dir``, a ``dataset_path`` folder) is returned for the
    caller's allowed-folder check; relative paths are the folder's.
    """
    scan = FolderScan()
    for path in _yaml_files(folder):
        where = f"{shown}/{path.relative_to(folder)}"
        real = Path(os.path.realpath(path))
        if not inside(real, [folder]):
            raise DataError(f"{where} leads outside the folder (a link): keep the task YAMLs inside it")
        if not real.is_file():
            continue
        if real.stat().st_size > MAX_YAML_BYTES:
            raise DataError(f"{where} is over {MAX_YAML_BYTES >> 20} MiB; a task YAML is a few KB")
        functions: list[tuple[int, str]] = []
        try:
            text = real.read_bytes().decode("utf-8")
            cfg = yaml.load(text, Loader=yaml_loader(functions))  # noqa: S506 (a SafeLoader + !function)
        except UnicodeDecodeError:
            raise DataError(f"{where} is not UTF-8 text") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise DataError(f"{where}:{line} is not valid YAML ({getattr(e, 'problem', None) or e})") from None
        for line, qual in functions:
            module = _function_file(qual, real.parent)
            if "." not in qual or not inside(module, [folder]) or not module.is_file():
                raise DataError(f"{where} line {line}: '!function {qual}' must name a function in a .py file inside "
                                "the include folder (module.function, the module beside the YAML); lm-eval would "
                                "otherwise import it from anywhere, and an include folder is trusted as code")
        if not isinstance(cfg, dict):
            continue
        _check_includes(cfg, real, folder, where)
        _collect_data(cfg, folder, where, scan)
    return scan


def _check_includes(cfg: dict, real: Path, folder: Path, where: str) -> None:
    includes = cfg.get("include")
    for inc in includes if isinstance(includes, list) else [includes] if includes is not None else []:
        target = Path(os.path.realpath(real.parent / str(inc)))
        if not inside(target, [folder]):
            raise DataError(f"{where}: 'include: {inc}' leads outside the include folder; copy the file into it")


def _collect_data(cfg: dict, folder: Path, where: str, scan: FolderScan) -> None:
    kwargs = cfg.get("dataset_kwargs") if isinstance(cfg.get("dataset_kwargs"), dict) else {}
    named = [("data_files", p) for p in local_data(kwargs.get("data_files"))]
    named += [("data_dir", p) for p in local_data(kwargs.get("data_dir"))]
    path = cfg.get("dataset_path")
    if isinstance(path, str) and path not in LOCAL_BUILDERS and names_local(path, folder):
        named.append(("dataset_path", path))
    for key, given in named:
        real = Path(os.path.realpath(folder / os.path.expanduser(given)))
        scan.data.append((f"{where}: {key} {_as_written(given, real, folder)!r}", real))


def _as_written(given: str, real: Path, folder: Path) -> str:
    """How a message names a data path a YAML holds: as written when relative, else from the include folder, or
    by its last part alone (an absolute path is the server's, which a browser's user must not see)."""
    if not os.path.isabs(os.path.expanduser(given)):
        return given
    return str(real.relative_to(folder)) if inside(real, [folder]) else f".../{real.name}"
