"""The errors a user can cause, in one light module (no torch), so every entry point can catch
them without importing the model stack first."""
from lab.data.record import DataError
from lab.registry import UnknownNameError


class ModelLoadError(RuntimeError):
    """A model or adapter that cannot be loaded; the message says what to do instead."""


class ScoringError(ValueError):
    """A prompt that cannot be scored as asked (e.g. two options share their first token)."""


class Stopped(Exception):
    """The user asked a job to stop; raised at its next safe point, after saving what it has."""


USER_ERRORS = (DataError, ModelLoadError, ScoringError, UnknownNameError, ValueError, FileNotFoundError)
