"""A dataset's local files: the ``data_files`` entries of a load, expanded into the files of one split.

An entry is a file, a folder (its files with the dataset's extensions), a glob, ``split=path`` to say
which split it holds, or ``bundled``, the sample that ships with the package (:mod:`lab.data.samples`).
:func:`lab.data.loading.load` reads local files through :func:`files_for` whenever they are given, and
Submit's path checks (:mod:`lab.jobkit.paths`) read the same entries with :func:`split_entry` and
:func:`list_folder`, so that a job is refused for the files it would fail on. Every error a user can
cause (a missing file, an empty folder, a split no entry holds) is a :class:`DataError` whose message
says what was expected, what arrived and what to do.
"""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Sequence

from lab.core.errors import DataError

from . import samples
from .registry import with_sample
from .spec import DatasetSpec
from .split import canonical_split

# `split=path`: a bare word before "=", so that paths that merely contain "=" stay paths.
_NAMED_ENTRY = re.compile(r"([A-Za-z]\w*)=(.+)")


def split_entry(entry: str) -> tuple[str | None, str]:
    """``"test=/d/x.jsonl"`` → ``("test", "/d/x.jsonl")``; an entry naming an existing path is a path."""
    m = _NAMED_ENTRY.fullmatch(entry)
    if m and not os.path.exists(entry):
        return m[1], m[2]
    return None, entry


def files_for(spec: DatasetSpec, files: Sequence[str | os.PathLike[str]], source: str,
              subject: str | None) -> list[Path]:
    """The files holding split ``source``, expanded and (for ``subject``) filtered."""
    if isinstance(files, (str, os.PathLike)):  # one path given where a list was meant
        files = [files]
    by_split: dict[str | None, list[str]] = {}
    for entry in samples.expand(spec, map(os.fspath, files), with_sample()):
        split, path = split_entry(entry)
        if path == samples.BUNDLED:
            raise samples.misplaced(entry)
        key = None if split is None else canonical_split(split, spec.own_splits, f" in data file entry {entry!r}")
        by_split.setdefault(key, []).append(path)
    entries = by_split.get(None, []) + by_split.get(source, [])
    if not entries:
        raise _no_split(spec, source, sorted(k for k in by_split if k is not None),
                        all(samples.is_sample(Path(p)) for paths in by_split.values() for p in paths))
    paths = [path for entry in entries for path in _expand(entry, spec.extensions)]
    if subject is None:
        return paths
    assert spec.subject_of_file is not None  # load checked
    kept = [f for f in paths if spec.subject_of_file(f) == subject]
    if not kept:
        found = sorted({spec.subject_of_file(f) for f in paths})
        raise DataError(f"No {spec.name} file for subject {subject!r} among {len(paths)} files. "
                        f"Subjects found: {', '.join(found)}.")
    return kept


def _no_split(spec: DatasetSpec, source: str, given: list[str], bundled: bool) -> DataError:
    """No entry holds split ``source``: name the splits there are, and how to get this one anyway."""
    if bundled:
        carve_from = "validation" if "validation" in given else given[0]
        return DataError(f"The bundled sample of {spec.name} has no {source!r} split; it has: {', '.join(given)}. "
                         f"Ask for one of those, or carve one from it, e.g. split '{carve_from}:{source}'.")
    return DataError(f"No data files for split {source!r}: the files given are for {', '.join(given)}. "
                     f"Pass {source}=PATH as well, or ask for one of those splits.")


def list_folder(path: Path, extensions: tuple[str, ...], shown: str) -> list[Path]:
    """The files in folder ``path`` ending in ``extensions``, sorted; none is a DataError."""
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(extensions))
    if not files:
        subdirs = sorted(p.name for p in path.iterdir() if p.is_dir())
        hint = f" It has the folders {', '.join(subdirs)}: pass one of them." if subdirs else ""
        raise DataError(f"The folder {shown!r} has no {' or '.join(extensions)} files.{hint}")
    return files


def _expand(entry: str, extensions: tuple[str, ...]) -> list[Path]:
    """A file, a directory (its files ending in ``extensions``, sorted) or a glob, as files.

    An existing path is taken as it is, so a config whose globs were already expanded (what the
    job store keeps) is never globbed again, even where a file name holds ``[`` or ``*``.
    """
    path = Path(entry).expanduser()
    if glob.has_magic(entry) and not os.path.lexists(path):
        matches = sorted(glob.glob(os.path.expanduser(entry), recursive=True))
        if not matches:
            raise DataError(f"No files match the pattern {entry!r}.")
        return [f for m in matches for f in (_expand(m, extensions) if os.path.isdir(m) else [Path(m)])]
    if path.is_dir():
        return list_folder(path, extensions, entry)
    if not path.is_file():
        raise DataError(f"Data file not found: {entry!r} (looked for {path.resolve()}, which does not exist).")
    return [path]


def describe_files(files: list[Path]) -> str:
    """Where the rows came from: the file or folder, or "the bundled sample" and its file(s) in it."""
    if files and all(samples.is_sample(f) for f in files):
        where = describe_files([f.resolve().relative_to(samples.ROOT) for f in files])
        return f"the bundled sample ({where})"
    if len(files) == 1:
        return str(files[0])
    return f"{len(files)} files in {os.path.commonpath([str(f.parent) for f in files])}"
