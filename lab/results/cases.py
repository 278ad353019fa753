"""Case studies: one evaluation's questions as a table, filtered and sorted to show where the
model was sure and wrong, and one question followed across runs.

Built from :class:`lab.results.predictions.Predictions` (no model call); options are lettered as the
prompts letter them (:func:`lab.data.templates.option_letter`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import numpy as np
import pandas as pd

from lab.calibration import metrics
from lab.data.templates import option_letter
from lab.results.predictions import (Predictions, is_token_run, load_predictions, oracle_probs, reported_probs,
                                     require_options)

CaseKind = Literal["all", "overconfident_wrong", "correct", "wrong"]
CASE_KINDS: tuple[str, ...] = ("all", "overconfident_wrong", "correct", "wrong")
CASE_COLUMNS = ["id", "dataset", "question", "options", "answer", "prediction", "confidence", "correct",
                "overconfident_wrong"]
ORACLE_COLUMN = "true P(prediction)"
SAME_QUESTION_COLUMNS = ["run", "answer", "prediction", "confidence", "correct", "probs"]
# name → (columns, ascending): the orders a case table can be shown in, the first the default
SORT_ORDERS: dict[str, tuple[list[str], Any]] = {
    "most over-confident wrong first": (["overconfident_wrong", "confidence"], False),
    "confidence, high to low": (["confidence"], False),
    "confidence, low to high": (["confidence"], True),
    "dataset, then confidence high to low": (["dataset", "confidence"], [True, False]),
}
DEFAULT_SORT = "most over-confident wrong first"
TOKEN_CONTEXT_CHARS = 150  # of a token target's context, shown before it (the column is cut at 180 on the page)
TARGET_MARKS = ("⟦", "⟧")  # around a token target, after its context, in the question column


def _options_text(choices: Any) -> str:
    """The options lettered; a stored row's ``choices`` that is no list (``5``: a file edited by hand) is
    shown as the text it holds, since the case table's other columns still stand without it."""
    if not isinstance(choices, (list, tuple)):
        return "" if choices is None else str(choices)
    return " · ".join(f"{option_letter(i)}. {choice}" for i, choice in enumerate(choices))


def _row_dataset(row: dict[str, Any], fallback: Optional[str]) -> str:
    """Each row names its dataset (``source``: a pooled CFT set mixes several); older rows fall back
    to ``meta`` and then to the run's dataset."""
    meta = row.get("meta") if isinstance(row.get("meta"), dict) else {}
    return str(row.get("source") or meta.get("dataset") or meta.get("source") or fallback or "")


def token_text(token: Any) -> str:
    """A decoded token as a case shows it: quoted, so a leading space or a newline is seen."""
    return json.dumps(str(token), ensure_ascii=False)


def top_tokens_text(row: dict[str, Any]) -> str:
    """A token target's top tokens with their probabilities and the rest mass, to 3 significant
    digits: ``" Paris" 0.412 · " the" 0.1 · … · rest 0.3``."""
    def digits(p: Any) -> float:
        return float(f"{float(p):.3g}")

    tokens = row.get("top_tokens")  # the decoded text; the checked ids and probabilities stand without it
    tokens = tokens if isinstance(tokens, list) and len(tokens) == len(row["top_probs"]) else row["top_ids"]
    tops = [f"{token_text(t)} {digits(p)}" for t, p in zip(tokens, row["top_probs"])]
    return " · ".join(tops + [f"rest {digits(row['rest'])}"])


def token_question(row: dict[str, Any]) -> str:
    """A token target as a question: the end of its context, then the target between :data:`TARGET_MARKS`."""
    context = str(row.get("context", ""))
    if len(context) > TOKEN_CONTEXT_CHARS:
        context = "…" + context[-TOKEN_CONTEXT_CHARS:]
    return f"{context}{TARGET_MARKS[0]}{row.get('target', '')}{TARGET_MARKS[1]}"


def _token_case_table(pred: Predictions) -> pd.DataFrame:
    """:func:`case_table` of a token-level run: one row per target, its context as the question (the
    target marked), its top tokens as the options, the target as the answer, the top token as the
    prediction, and the run's own confidence and correctness."""
    conf = np.array([float(row["confidence"]) for row in pred.rows], dtype=np.float64)
    correct = np.array([bool(row["correct"]) for row in pred.rows])
    table = pd.DataFrame({
        "id": [str(row.get("id", i)) for i, row in enumerate(pred.rows)],
        "dataset": [_row_dataset(row, pred.dataset) for row in pred.rows],
        "question": [token_question(row) for row in pred.rows],
        "options": [top_tokens_text(row) for row in pred.rows],
        "answer": [token_text(row.get("target", "")) for row in pred.rows],
        "prediction": [token_text(row.get("pred", "")) for row in pred.rows],
        "confidence": conf,
        "correct": correct,
        "overconfident_wrong": np.where(correct, 0.0, conf),
    })
    return table[CASE_COLUMNS]


def case_table(pred: Predictions, probs: Optional[np.ndarray] = None) -> pd.DataFrame:
    """One row per question, for browsing what the model answered and how sure it was.

    ``probs`` (n, K): the probabilities to show, e.g. :func:`lab.results.analysis.recalibrate` at the
    slider's temperature; default the ones the run reported. ``overconfident_wrong`` is the
    confidence put on a wrong answer (0 for a right one): the sort key of :func:`filter_cases`.
    Questions with a known true distribution (the controlled task) add :data:`ORACLE_COLUMN`: the
    true probability that the predicted option is the stated answer, the confidence a calibrated
    model would give that prediction. A token-level run's rows are its targets (:func:`_token_case_table`);
    it takes no other ``probs``.
    """
    if is_token_run(pred):
        if probs is not None:
            require_options(pred, "showing its cases at other probabilities")
        return _token_case_table(pred)
    probs = reported_probs(pred) if probs is None else np.asarray(probs, dtype=np.float64)
    if probs.shape != pred.mask.shape:
        raise ValueError(f"Expected `probs` of shape {pred.mask.shape}, but got {probs.shape}")
    choice, conf = metrics.predictions(probs, pred.mask)
    correct = choice == pred.labels
    table = pd.DataFrame({
        "id": [str(row.get("id", i)) for i, row in enumerate(pred.rows)],
        "dataset": [_row_dataset(row, pred.dataset) for row in pred.rows],
        "question": [str(row.get("question", "")) for row in pred.rows],
        "options": [_options_text(row.get("choices")) for row in pred.rows],
        "answer": [option_letter(int(a)) for a in pred.labels],
        "prediction": [option_letter(int(c)) for c in choice],
        "confidence": conf,
        "correct": correct,
        "overconfident_wrong": np.where(correct, 0.0, conf),
    })
    truth = oracle_probs(pred)
    if truth is None:
        return table[CASE_COLUMNS]
    table[ORACLE_COLUMN] = truth[np.arange(len(choice)), choice]
    return table[CASE_COLUMNS + [ORACLE_COLUMN]]


def _scope(df: pd.DataFrame, dataset: Optional[str]) -> pd.DataFrame:
    return df if dataset is None else df[df["dataset"] == dataset]


def overconfidence_threshold(df: pd.DataFrame, dataset: Optional[str] = None) -> float:
    """The confidence above which :func:`filter_cases` calls a wrong answer over-confident: the
    accuracy of the table (of ``dataset`` when given), the hit rate the model actually reaches."""
    scope = _scope(df, dataset)
    return float(scope["correct"].mean()) if len(scope) else 0.0


def filter_cases(df: pd.DataFrame, kind: CaseKind = "all", conf_range: tuple[float, float] = (0.0, 1.0),
                 dataset: Optional[str] = None, by: str = "confidence") -> pd.DataFrame:
    """The cases of one kind, column ``by`` in ``conf_range`` (inclusive), most over-confident wrong first.

    ``"overconfident_wrong"``: wrong answers given with more confidence than the accuracy of the
    table (of ``dataset`` when given): the model claimed a hit rate it does not reach. Order: by
    ``overconfident_wrong`` then confidence, both descending, so wrong answers lead, surest first.
    ``by``: the column the range applies to, ``confidence`` or another confidence signal the
    caller added (:mod:`lab.calibration.confidence`), so that a threshold set on that signal elsewhere keeps
    the same questions here.
    """
    if kind not in CASE_KINDS:
        raise ValueError(f"Expected `kind` to be one of {CASE_KINDS}, but got {kind!r}")
    df = _scope(df, dataset)
    lo, hi = conf_range
    keep = df[by].between(lo, hi)
    if kind == "correct":
        keep &= df["correct"]
    elif kind == "wrong":
        keep &= ~df["correct"]
    elif kind == "overconfident_wrong":
        keep &= ~df["correct"] & (df["confidence"] > overconfidence_threshold(df))
    return sort_cases(df[keep], DEFAULT_SORT)


def sort_cases(df: pd.DataFrame, order: str = DEFAULT_SORT) -> pd.DataFrame:
    """``df`` in one of the :data:`SORT_ORDERS` (stable: ties keep their order), index reset."""
    if not isinstance(order, str) or order not in SORT_ORDERS:  # a list from a browser is not hashable
        raise ValueError(f"Expected `order` to be one of {tuple(SORT_ORDERS)}, but got {order!r}")
    columns, ascending = SORT_ORDERS[order]
    return df.sort_values(columns, ascending=ascending, kind="mergesort").reset_index(drop=True)


def _share(part: int, whole: int) -> str:
    return f"{part} of {whole}" + (f" ({part / whole:.0%})" if whole else "")


def describe_cases(df: pd.DataFrame, shown: pd.DataFrame, kind: CaseKind, conf_range: tuple[float, float],
                   dataset: Optional[str] = None, by: str = "confidence", unit: str = "questions") -> str:
    """What :func:`filter_cases` kept, in words: the rule with its threshold, how many of the
    questions of that kind it covers and at which confidences, e.g. "44 of 60 wrong answers (73%),
    at confidence 0.28–0.39". Numbers to 3 significant digits; ``by`` names the column the range
    applied to, as :func:`filter_cases` takes it; ``unit`` what a row is (a token run's: ``targets``)."""
    scope = _scope(df, dataset)
    wrong, right = int((~scope["correct"]).sum()), int(scope["correct"].sum())
    lo, hi = conf_range
    threshold = overconfidence_threshold(df, dataset)
    rule = {
        "all": f"every {unit[:-1]}",  # every question, every target
        "correct": "the right answers",
        "wrong": "the wrong answers",
        "overconfident_wrong": (f"wrong answers given with a confidence above {threshold:.3g}, the accuracy of "
                                "these questions: the model claimed a hit rate it does not reach"),
    }[kind]
    if (lo, hi) != (0.0, 1.0):
        rule += f", {by} {lo:.3g}–{hi:.3g}"
    of = {"correct": f"{_share(len(shown), right)} right answers",
          "all": f"{_share(len(shown), len(scope))} {unit}"}.get(kind, f"{_share(len(shown), wrong)} wrong answers")
    where = f" at confidence {shown['confidence'].min():.3g}–{shown['confidence'].max():.3g}" if len(shown) else ""
    return f"Keeps {rule}{f' (dataset {dataset})' if dataset else ''}. Shown: {of}{where}."


def same_question(runs: Sequence[Path], question_id: Any, labels: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One question across runs: what each answered, as reported (after its own temperature).

    Runs without the question are left out; the first row with the id counts. Ids are compared as
    text, since a custom dataset may store them as numbers. ``labels``: what to call each run in
    the ``run`` column (default its path).
    """
    wanted, records = str(question_id), []
    names = list(labels) if labels is not None else [Path(run).as_posix() for run in runs]
    if len(names) != len(runs):
        raise ValueError(f"Expected one label per run ({len(runs)}), but got {len(names)}")
    for run, name in zip(runs, names):
        pred = load_predictions(Path(run))
        found = next((i for i, row in enumerate(pred.rows) if str(row.get("id")) == wanted), None)
        if found is None:
            continue
        row = pred.rows[found]
        if is_token_run(pred):  # "probs": its top tokens as text, the options it had
            records.append({"run": name, "answer": token_text(row.get("target", "")),
                            "prediction": token_text(row.get("pred", "")), "confidence": float(row["confidence"]),
                            "correct": bool(row["correct"]), "probs": top_tokens_text(row)})
            continue
        probs = [float(p) for p in row["probs"]]
        choice = int(np.argmax(probs))
        records.append({"run": name, "answer": option_letter(row["answer"]),
                        "prediction": option_letter(choice), "confidence": probs[choice],
                        "correct": choice == row["answer"], "probs": probs})
    return pd.DataFrame(records, columns=SAME_QUESTION_COLUMNS)
