"""Where a running job may read: the folders its job was submitted under, checked as each file opens.

A config is checked when it is submitted (:mod:`lab.jobkit.paths`), but a job may wait in the queue for
hours, and a file it names can meanwhile be swapped for a symbolic link to anywhere. So the worker
checks its config again against the folders stored with the job (:func:`restricted`, entered by
:mod:`lab.jobkit.worker`), and every file a job reads its data from is opened through :func:`open_text`.
That opens first and checks after, from the open descriptor itself, so no swap between a check
and the open can slip through: a final component that became a link is not followed at all
(``O_NOFOLLOW``), a folder above it that became one is caught by where the descriptor really
points, and nothing is read from a file that is not a regular file inside the folders (a FIFO
would block the open, so it opens non-blocking). A model folder, which ``from_pretrained`` opens
itself, is walked again just before it is loaded (:func:`check_folder`).

Outside :func:`restricted` (the command line, a config run by hand) every path is allowed, as
before: the user who types the path is the one who reads the file.
"""
from __future__ import annotations

import errno
import itertools
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional

from lab.core.config import ConfigError

_roots: Optional[tuple[Path, ...]] = None  # None: this process may read anywhere


class PathNotAllowed(ConfigError):
    """A config names a file outside the folders this server may read."""


@contextmanager
def restricted(roots: Optional[Iterable[Path]]) -> Iterator[None]:
    """Within the block, this process reads data only inside ``roots`` (None: anywhere); after it,
    as before (a job run inside a test's process leaves the process as it found it)."""
    global _roots
    before = _roots
    _roots = None if roots is None else tuple(Path(os.path.realpath(r)) for r in roots)
    try:
        yield
    finally:
        _roots = before


def inside(real: Path, roots: Optional[Iterable[Path]]) -> bool:
    """Whether the resolved path ``real`` is one of ``roots`` or lies in one; None allows everything."""
    return roots is None or any(real == r or r in real.parents for r in roots)


def allowed(real: Path) -> bool:
    return inside(real, _roots)


def _outside(path: Path, real: Path) -> PathNotAllowed:
    return PathNotAllowed(f"{path} now leads to {real}, outside the folders this job was submitted under "
                          f"({', '.join(map(str, _roots or ()))}); it was changed after the job was queued, "
                          "so the job does not read it")


def _descriptor_path(fd: int, given: Path) -> Path:
    """Where an open descriptor really points: from /proc on Linux; elsewhere the path resolved now,
    accepted only if it is the very file opened (same device and inode)."""
    proc = Path(f"/proc/self/fd/{fd}")
    if sys.platform.startswith("linux") and proc.exists():
        return Path(os.readlink(proc))
    real = Path(os.path.realpath(given))
    opened, now = os.fstat(fd), os.stat(real)
    if (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino):
        raise PathNotAllowed(f"{given} changed while it was being opened; run the job again")
    return real


def open_text(path: Path, encoding: str = "utf-8-sig", newline: Optional[str] = None) -> IO[str]:
    """``path`` opened for reading text, once it is known to be a regular file inside the job's folders."""
    if _roots is None:
        return open(path, encoding=encoding, newline=newline)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PathNotAllowed(f"{path} was replaced by a symbolic link after the job was queued; the job reads "
                                 "only the files it was submitted with. Submit it again") from None
        raise
    try:
        real = _descriptor_path(fd, Path(path))
        if not allowed(real):
            raise _outside(Path(path), real)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathNotAllowed(f"{path} is no longer a regular file; submit the job again")
        os.set_blocking(fd, True)
        return open(fd, encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path, encoding: str = "utf-8-sig") -> str:
    with open_text(path, encoding=encoding) as f:
        return f.read()


def resolved_entries(folder: Path) -> Iterator[tuple[Path, Path]]:
    """``(entry, where it resolves)`` for every file and folder under ``folder``: what a check that
    no link leads out of the allowed folders walks, at submit (:mod:`lab.jobkit.paths`) and here."""
    for parent, dirs, files in os.walk(folder):
        for name in itertools.chain(dirs, files):
            entry = Path(parent, name)
            yield entry, Path(os.path.realpath(entry))


def check_folder(folder: Path) -> None:
    """Every entry of ``folder`` (a model, an adapter) resolves inside the job's folders: no link leads
    out. ``from_pretrained`` opens the files itself, so this runs just before it does."""
    if _roots is None:
        return
    real = Path(os.path.realpath(folder))
    if not allowed(real):
        raise _outside(Path(folder), real)
    for entry, resolved in resolved_entries(real):
        if not allowed(resolved):
            raise _outside(entry, resolved)
