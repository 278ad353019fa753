"""A comparison's result, ``compare.json``: where the compare page keeps one, reading it back in today's
shape, and the answers table (one row per question and model) that the pages and their CSV show.

``compare.json`` holds ``questions`` (each ``{question, options}``, and ``answer`` when marked), and
per model in ``results`` its ``label``, ``model``, ``adapter``, ``temperature`` and ``answers`` (one per
question, in order); :func:`lab.kinds.compare.run.compare` writes it. Without torch: the web server reads it.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

from lab.core import stored
from lab.core.layout import COMPARE_FILE, COMPARISONS_DIR
from lab.data.templates import option_letter
from lab.models.weights import SCRATCH


def upgrade(report: dict[str, Any]) -> dict[str, Any]:
    """A ``compare.json`` of one question written before lists existed, in today's shape."""
    if "questions" in report or "question" not in report:
        return report
    keys = ("probs", "raw_probs", "prediction", "option_mass", "generation")
    results = [{"label": r.get("label"), "model": r.get("model"), "adapter": r.get("adapter"),
                "temperature": r.get("temperature"),
                "answers": [{**{k: r[k] for k in keys if k in r},
                             **({"confidence": max(r["probs"])} if r.get("probs") else {})}]}
               for r in report.get("results", [])]
    return {"questions": [{"question": report["question"], "options": report.get("options") or []}], "results": results}


def shown_answer(generation: dict[str, Any], model: Optional[str]) -> Optional[str]:
    """The generated answer as a table shows it: a blank one says what was generated instead of
    leaving an empty cell (the untrained ``scratch`` model answers with newlines only)."""
    text = generation.get("text")
    if text or not generation.get("tokens"):
        return text
    why = (f"; {SCRATCH} has random weights until it is trained (the finetune-controlled preset)"
           if model == SCRATCH else "")
    return f"(blank: its {generation['tokens']} generated tokens are only whitespace or special tokens{why})"


# The answers table's columns, in order: the answer and its confidence first, the question last (it is the
# same for every model and the page shows it above the table, so first it only pushed the answers off-screen).
COLUMNS = ("#", "model", "prediction", "confidence", "correct", "answer", "option probabilities", "answer prob.",
           "1st-token prob.", "T", "question")


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per question and model, keys in :data:`COLUMNS` order: what a table (and its CSV)
    shows. A free-text question has no prediction, confidence or option probabilities."""
    table = []
    for q, item in enumerate(report["questions"]):
        for result in report["results"]:
            answer = result["answers"][q]
            generation = answer.get("generation") or {}
            row: dict[str, Any] = {"#": q + 1, "model": result["label"]}
            if item["options"]:
                p = answer["prediction"]
                row["prediction"] = f"{option_letter(p)}. {item['options'][p]}"
                row["confidence"] = answer["confidence"]
                if item.get("answer") is not None:
                    row["correct"] = p == item["answer"]
            row["answer"] = shown_answer(generation, result.get("model"))
            if item["options"]:
                row["option probabilities"] = " ".join(f"{option_letter(i)} {v:.3f}"
                                                       for i, v in enumerate(answer["probs"]))
            row.update({"answer prob.": generation.get("sequence_prob"),
                        "1st-token prob.": generation.get("first_token_prob"), "T": result.get("temperature"),
                        "question": item["question"]})
            table.append(row)
    return table


def history_dir(root: Path, questions: list[dict[str, Any]]) -> Path:
    """A new folder for one comparison of the compare page: ``<root>/comparisons/<time>-<first words>``."""
    words = re.sub(r"[^a-z0-9]+", "-", questions[0]["question"].lower()).strip("-")[:40].strip("-") or "question"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = Path(root) / COMPARISONS_DIR / f"{stamp}-{words}{'' if n == 1 else f'-{n}'}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: a thousand comparisons this second")


def read_result(run_dir: Optional[str | Path]) -> Optional[dict[str, Any]]:
    """A comparison's ``compare.json`` in today's shape; None when absent or damaged."""
    path = Path(run_dir or "") / COMPARE_FILE
    try:
        report = upgrade(stored.read_object(path))  # bounded: the page reopens any compare.json under runs/
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return report if isinstance(report.get("questions"), list) and isinstance(report.get("results"), list) else None
