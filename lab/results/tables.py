"""Tables read off stored evaluations: FIRST's Table 1 across every run (:func:`results_table`) and one
run's top tokens at the answer position (:func:`positionwise_topk`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.calibration.metrics import finite_or_none
from lab.data.templates import option_letter
from lab.results.predictions import Predictions, is_token_run
from lab.results.reports import csv_text
from lab.results.runs import find_evaluations

TOPK_COLUMNS = ["rank", "mean_prob", "answer_in_topk"]

# The run, the numbers a reader came for, then how it was made: at 1440 px the numbers were behind a scroll.
RESULTS_COLUMNS = ["run", "ECE", "ECE low", "ECE high", "accuracy", "Trust", "AURC", "AUROC", "n", "cw-ECE",
                   "oracle accuracy", "oracle ECE", "model", "dataset", "split", "scoring", "domain", "folder"]

ROUNDED = {column: 4 for column in ("ECE", "ECE low", "ECE high", "accuracy", "Trust", "AURC", "AUROC", "cw-ECE",
                                    "oracle accuracy", "oracle ECE")}

DOMAIN = {True: "in", False: "out", None: ""}


def results_table(root: Path) -> pd.DataFrame:
    """FIRST Table 1 across every evaluation under ``root``, newest first, numbers rounded to 4: each
    run by its label and folder, how it was scored, its ECE with the bootstrap interval
    (``ECE low``/``ECE high``; empty for a run evaluated without a bootstrap), and how well its top
    probability ranks right above wrong answers (AURC, lower is better; AUROC, higher is better;
    empty for a run evaluated before they were recorded); on data with known true distributions
    (the controlled task), the Bayes predictor's accuracy and ECE on the same questions."""
    records = [
        {"run": r.label, "folder": r.name, "model": r.model, "dataset": r.dataset_label, "split": r.split,
         "scoring": f"{r.scoring} ({r.template})" if r.scoring and r.template else r.scoring,
         "domain": DOMAIN[r.in_domain], "n": r.n, "ECE": r.ece, "ECE low": r.ece_ci[0] if r.ece_ci else None,
         "ECE high": r.ece_ci[1] if r.ece_ci else None, "accuracy": r.accuracy, "Trust": r.trust, "cw-ECE": r.cw_ece,
         "AURC": r.aurc, "AUROC": r.auroc, "oracle accuracy": r.oracle_accuracy, "oracle ECE": r.oracle_ece}
        for r in find_evaluations(root)
    ]
    return pd.DataFrame(records, columns=RESULTS_COLUMNS).round(ROUNDED)


def results_csv(df: pd.DataFrame) -> str:
    """The table as CSV text, for a download button; a run's name that a spreadsheet would run as a
    formula is written as text (:func:`lab.results.reports.csv_text`)."""
    return csv_text(df)


def _as_letter(token: Any) -> str:
    """A decoded token compared as a letter: it may carry a leading space, and some templates
    (``first_lower``) letter the options in lower case."""
    return str(token).strip().upper()


def _top_tokens(tokens: Any) -> bool:
    """Whether a row's ``top_tokens`` can be ranked: a non-empty list of ``{token, prob}`` with finite
    probabilities (a row without them, or with a damaged list, adds nothing to the table)."""
    return isinstance(tokens, list) and bool(tokens) and all(
        isinstance(t, dict) and "token" in t and finite_or_none(t.get("prob")) is not None for t in tokens)


def positionwise_topk(pred: Predictions) -> pd.DataFrame:
    """For rank k = 1..5 of the full-vocabulary top tokens at the answer position (letter scoring):
    ``mean_prob`` of the rank-k token, and ``answer_in_topk``, the fraction of questions whose
    answer letter is among the top k tokens. Empty when no row has ``top_tokens`` (cloze runs).
    """
    if is_token_run(pred):  # its top tokens are the vocabulary's at a target, not answer letters
        return pd.DataFrame(columns=TOPK_COLUMNS)
    tops = [(sorted(row["top_tokens"], key=lambda t: -t["prob"]), option_letter(row["answer"]))
            for row in pred.rows if _top_tokens(row.get("top_tokens"))]
    if not tops:
        return pd.DataFrame(columns=TOPK_COLUMNS)
    depth = max(len(tokens) for tokens, _ in tops)
    records = []
    for k in range(1, depth + 1):
        probs = [float(tokens[k - 1]["prob"]) for tokens, _ in tops if len(tokens) >= k]
        hits = [answer in {_as_letter(t["token"]) for t in tokens[:k]} for tokens, answer in tops]
        records.append({"rank": k, "mean_prob": float(np.mean(probs)), "answer_in_topk": float(np.mean(hits))})
    return pd.DataFrame(records, columns=TOPK_COLUMNS)
