"""Which files a browser request may make the server (or its jobs) read.

A job config submitted from the browser names files: data files, adapters, local models,
temperature files, preference pairs. Left unchecked, a form would let anyone who can reach the
page make a job read any file the server's user can. So every path-valued field must resolve
(after ``..`` and symlinks) inside an allowed root: the runs directory, the upload area, the
model cache, or a directory the operator passed with ``--allow-path``. Hub ids (``org/name``
that are not local paths) are not files and pass.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

# Config keys whose values are files or directories (or, for models, possibly hub ids).
PATH_KEYS = ("data_files", "val_data_files", "preferences", "adapter", "teacher_adapter", "temperature")
MODEL_KEYS = ("model", "teacher", "student")


class PathNotAllowed(ValueError):
    """A config names a file outside the allowed roots."""


def _strip_split(entry: str) -> str:
    """``split=path`` → ``path`` (the loaders' syntax for saying which split a file holds)."""
    head, sep, tail = entry.partition("=")
    return tail if sep and "/" not in head and os.sep not in head else entry


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", ".", "~")) or Path(value).exists()


def _candidates(config: Any) -> Iterator[tuple[str, str]]:
    """(key, path) for every path-valued entry, in nested sections (in_domain, ood, training) too."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key in PATH_KEYS:
                values = value if isinstance(value, list) else [value]
                for v in values:  # anything but text (a temperature given as a number, None) names no file
                    if isinstance(v, str) and v.strip():
                        yield key, _strip_split(v.strip())
            elif key in MODEL_KEYS and isinstance(value, str) and value != "bundled" and _looks_like_path(value):
                yield key, value
            else:
                yield from _candidates(value)
    elif isinstance(config, list):
        for item in config:
            yield from _candidates(item)


def _fixed_part(pattern: str) -> str:
    """The directory part of a glob before its first wildcard."""
    if not glob.has_magic(pattern):
        return pattern
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next(i for i, p in enumerate(parts) if glob.has_magic(p))]]
    return str(Path(*fixed)) if fixed else "."


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def check_paths(config: dict[str, Any], roots: Iterable[Path]) -> None:
    """Raise :class:`PathNotAllowed` naming the first path outside ``roots``; temperature numbers pass."""
    resolved_roots = [Path(os.path.realpath(os.path.expanduser(r))) for r in roots]
    for key, value in _candidates(config):
        if key == "temperature":
            try:
                float(value)
                continue
            except ValueError:
                pass
        real = Path(os.path.realpath(os.path.expanduser(_fixed_part(value))))
        if not _inside(real, resolved_roots):
            allowed = ", ".join(str(r) for r in resolved_roots)
            raise PathNotAllowed(f"`{key}`: {value!r} is outside the folders this server may read ({allowed}). "
                                 "Upload the file on the launch page, or ask the operator to start the app with "
                                 "--allow-path for its folder.")
