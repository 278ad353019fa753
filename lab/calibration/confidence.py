"""Confidence signals: the number a run offers as "how sure is the model of its answer".

The top option probability is the usual one, but not the only one a user may trust: the margin
between the two best options, the (normalised) entropy of the option distribution, and for letter
scoring the probability of the answer token over the *whole vocabulary* (the FIRST authors'
confidence, which also drops when the model wanted to say something else). Each is a
:class:`Signal` in :data:`SIGNALS`, so the selective-prediction panel, the recalibration workbench
and the evaluation itself offer every registered signal without knowing them; a later signal
(verbalized confidence, P(True)) that cannot be derived from the option probabilities is stored
per prediction row under ``signals`` and read back from there (:func:`values`).

Every signal is oriented "higher = more confident" and lies in [0, 1]; only those with
``probability=True`` claim to be a probability of being right, so only those have a meaningful
ECE before recalibration (the others can still be ranked, and calibrated by the workbench).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from lab.calibration import metrics
from lab.core.registry import Registry

DEFAULT = "max_prob"
TOKEN_SIGNALS = ("max_prob", "margin")  # what a token-level run (task clm or facts) can give


@dataclass(frozen=True)
class Signal:
    """One confidence signal: ``compute(probs, mask, rows)`` → (n,) values, or None where the run
    lacks what it needs (``needs`` says what, for the message)."""

    name: str
    title: str
    description: str
    probability: bool
    compute: Callable[[np.ndarray, np.ndarray, Sequence[dict[str, Any]]], Optional[np.ndarray]]
    needs: str = ""


SIGNALS: Registry[Signal] = Registry("confidence signal")


def _sorted_present(probs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each row's present probabilities in descending order; absent options sort last as -inf."""
    return -np.sort(-np.where(mask, probs, -np.inf), axis=1)


def _max_prob(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    return _sorted_present(probs, mask)[:, 0]


def _margin(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    top = _sorted_present(probs, mask)
    return top[:, 0] - top[:, 1]


def _certainty(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """``1 − H(p)/log K``: 1 for a one-hot row, 0 for a uniform one (K the row's own option count)."""
    p = np.where(mask, probs, 0.0)
    p = p / p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return 1.0 - h / np.log(mask.sum(axis=1))


def _full_vocab(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> Optional[np.ndarray]:
    if not all("option_vocab_probs" in row for row in rows):
        return None
    pred = metrics.predictions(probs, mask)[0]
    return np.array([float(row["option_vocab_probs"][k]) for row, k in zip(rows, pred)])


for _signal in (
    Signal("max_prob", "top probability", "probability of the predicted option (over the options)", True, _max_prob),
    Signal("margin", "margin", "top-1 minus top-2 option probability", False, _margin),
    Signal("certainty", "1 − entropy", "1 − entropy of the option distribution / log(number of options)", False,
           _certainty),
    Signal("full_vocab", "full-vocabulary probability", "probability of the answer token over the whole vocabulary "
           "(FIRST's confidence)", True, _full_vocab, needs="letter scoring (option_vocab_probs)"),
):
    SIGNALS.add(_signal.name, _signal)


def token_rows(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether ``rows`` are a token-level run's (one target token each: ``target_id``, ``confidence``,
    ``top_probs``, :mod:`lab.kinds.evaluate.tokens`), not questions with options."""
    return bool(rows) and all(isinstance(row, dict) and "target_id" in row for row in rows)


def _token_values(signal: Signal, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """A token-level run's signal, from its rows: the top probability over the whole vocabulary (the
    row's ``confidence``) or the margin between the two best tokens; no other (they need options)."""
    if signal.name not in TOKEN_SIGNALS:
        titles = " and the ".join(SIGNALS.get(n).title for n in TOKEN_SIGNALS)
        raise ValueError(f"This run has no {signal.title} confidence: it needs the options of a multiple-choice run; "
                         f"a token-level run (task clm or facts) offers the {titles}.")
    if signal.name == "max_prob":
        return np.array([float(row["confidence"]) for row in rows], dtype=np.float64)
    top = [sorted((float(p) for p in row["top_probs"]), reverse=True) + [0.0] for row in rows]
    return np.array([t[0] - t[1] for t in top], dtype=np.float64)


def values(name: str, probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """The signal ``name`` for every question, computed from ``probs`` (so a recalibrated set gets
    its own), else read from the rows' stored ``signals`` (a signal no probability gives, such as a
    verbalized one); ValueError when this run has neither (e.g. full-vocabulary on cloze). A
    token-level run's rows (:func:`token_rows`) give :data:`TOKEN_SIGNALS` only, read from the rows."""
    signal = SIGNALS.get(name)
    if token_rows(rows):
        return _token_values(signal, rows)
    computed = signal.compute(np.asarray(probs, dtype=np.float64), np.asarray(mask, dtype=bool), rows)
    if computed is not None:
        return computed
    stored = [row["signals"].get(name) if isinstance(row.get("signals"), dict) else None for row in rows]
    if rows and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in stored):
        return np.asarray(stored, dtype=np.float64)
    raise ValueError(f"This run has no {signal.title} confidence: it needs {signal.needs}.")


def all_values(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Every signal this run can give (:func:`values`), by name, in registration order."""
    out = {}
    for name in SIGNALS.in_order():
        try:
            out[name] = values(name, probs, mask, rows)
        except ValueError:
            continue
    return out


def available(probs: np.ndarray, mask: np.ndarray, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The names of the signals this run can give, in registration order."""
    return list(all_values(probs, mask, rows))


def row_signals(probs: Sequence[float], row: dict[str, Any]) -> dict[str, float]:
    """Every signal one prediction row can give, for storing in it (``row["signals"]``)."""
    p = np.asarray(probs, dtype=np.float64)[None, :]
    return {name: float(v[0]) for name, v in all_values(p, np.ones(p.shape, dtype=bool), [row]).items()}
