"""The errors a user can cause, in one light module (no torch), so every entry point can catch
them without importing the model stack first; and :class:`RowProblem`, a bad row of the user's data,
which a :class:`DataError` carries and every loader reports."""
from __future__ import annotations

from dataclasses import dataclass

from lab.core.config import ConfigError
from lab.core.registry import UnknownNameError


@dataclass(frozen=True)
class RowProblem:
    """A row that could not be turned into a record: where it is and why."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


class DataError(ValueError):
    """Bad input data. The message is meant for the user: what is wrong, where, what to do."""

    def __init__(self, message: str, problems: tuple[RowProblem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


class ModelLoadError(RuntimeError):
    """A model or adapter that cannot be loaded; the message says what to do instead."""


class ScoringError(ValueError):
    """A prompt that cannot be scored as asked (e.g. two options share their first token)."""


class Stopped(Exception):
    """The user asked a job to stop; raised at its next safe point, after saving what it has."""


class DiskFull(RuntimeError):
    """A checkpoint or the trained weights would not fit on the disk: said before writing, with the
    bytes needed and free, rather than filling the disk mid-file."""


# What the user can mend: reported as "bad input" (a full disk in its own words) with exit code 2 and
# no traceback. A plain ValueError is not here: raised by the lab's own code it is a bug, and keeps its
# traceback.
USER_ERRORS = (ConfigError, DataError, ModelLoadError, ScoringError, UnknownNameError, FileNotFoundError, DiskFull)
