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

A message a browser or the API shows names a file as :func:`shown` does, from the allowed folder
holding it (``runs/00012-evaluate/temperature.json``), never by the server's absolute path: who reads
the message knows the folders by the names the operator gave them, not where they lie on the server.
"""
from __future__ import annotations

import errno
import itertools
import os
import re
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


def _forms(path: Path) -> list[Path]:
    """``path`` as written (made absolute) and as it resolves: a root named through a link, or a file
    reached through one, is recognised either way."""
    expanded = os.path.expanduser(path)
    return list(dict.fromkeys((Path(os.path.abspath(expanded)), Path(os.path.realpath(expanded)))))


def shown(path: Path | str, roots: Optional[Iterable[Path]]) -> str:
    """How a message a user may see names ``path``: from the folder of ``roots`` holding it, that folder
    by its own name as the operator gave it (``runs/00012-evaluate/temperature.json``, ``data/mmlu/test``),
    the innermost where they nest; outside every root, by its folder and its own name. Never the
    server's absolute path, which a page or the API would show to whoever is logged in.
    ``roots`` None: the operator's own shell (``python -m jobs``, ``python -m lab``), the path itself."""
    if roots is None:
        return str(path)
    path = Path(path)
    held = [(len(form.parts), Path(Path(os.path.abspath(os.path.expanduser(root))).name) / where.relative_to(form))
            for root in roots for form in _forms(Path(root)) for where in _forms(path)
            if where == form or form in where.parents]
    if held:
        return max(held, key=lambda h: h[0])[1].as_posix()
    return (Path(path.parent.name) / path.name).as_posix() if path.parent.name else path.name


def shown_here(path: Path | str) -> str:
    """:func:`shown` from the folders of the job this process runs (:func:`restricted`); by the file's
    folder and own name when there are none: a config's own checks run both in a server and on a
    command line, and cannot tell which."""
    return shown(path, _roots or ())


def shown_roots(roots: Iterable[Path]) -> str:
    """The allowed folders as a message lists them: each by its own name, never where it lies."""
    return ", ".join(dict.fromkeys(shown(root, [root]) for root in roots))


def shown_in(text: str, roots: Optional[Iterable[Path]]) -> str:
    """``text`` (a job's error, whatever raised it: a library's OSError names files by their paths)
    with every allowed folder's absolute path replaced by the folder's own name, as :func:`shown`
    names it; ``roots`` None: unchanged, the operator's own shell."""
    if roots is None:
        return text
    named = {str(form): shown(root, [root]) for root in roots for form in _forms(Path(root)) if form.parent != form}
    for where in sorted(named, key=len, reverse=True):  # the innermost first: runs/uploads before runs
        # where a path starts, not inside one (a root /data within /home/op/data)
        text = re.sub(r"(?<![\w.~/-])" + re.escape(where), lambda _: named[where], text)
    return text


def _outside(path: Path) -> PathNotAllowed:
    """Where the link now leads is not said: it is a place outside the folders, which no message names."""
    return PathNotAllowed(f"{shown(path, _roots)} now leads outside the folders this job was submitted under "
                          f"({shown_roots(_roots or ())}); it was changed after the job was queued, so the job "
                          "does not read it")


def _descriptor_path(fd: int, given: Path) -> Path:
    """Where an open descriptor really points: from /proc on Linux; elsewhere the path resolved now,
    accepted only if it is the very file opened (same device and inode)."""
    proc = Path(f"/proc/self/fd/{fd}")
    if sys.platform.startswith("linux") and proc.exists():
        return Path(os.readlink(proc))
    real = Path(os.path.realpath(given))
    opened, now = os.fstat(fd), os.stat(real)
    if (opened.st_dev, opened.st_ino) != (now.st_dev, now.st_ino):
        raise PathNotAllowed(f"{shown(given, _roots)} changed while it was being opened; run the job again")
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
            raise PathNotAllowed(f"{shown(path, _roots)} was replaced by a symbolic link after the job was queued; "
                                 "the job reads only the files it was submitted with. Submit it again") from None
        raise
    try:
        real = _descriptor_path(fd, Path(path))
        if not allowed(real):
            raise _outside(Path(path))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathNotAllowed(f"{shown(path, _roots)} is no longer a regular file; submit the job again")
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
        raise _outside(Path(folder))
    for entry, resolved in resolved_entries(real):
        if not allowed(resolved):
            raise _outside(entry)
