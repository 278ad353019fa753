"""A controlled task whose true answer distribution is known: calibration with a ground truth.

Each question asks which colour a named object looks in a given light: "Card 48213. In bright light,
which colour does the kettle look?" with the options red, green, blue, gold (in that order). A fixed,
seeded rule maps every object to its colour (learnable: 8 objects by default), and the *stated*
answer is the rule's with probability q, else one of the other colours at random. q depends on a
feature the question shows, the light: bright (q = 0.95 by default) or dim (q = 0.6). So every
record carries its true answer distribution (``meta["true_probs"]``: q on the rule's colour,
(1 − q)/(K − 1) on each other), and the Bayes-optimal model — the rule, with confidence q — has a
known accuracy and a population ECE of 0. A model that learns the rule and reads the light is
calibrated; one that memorises the noisy labels of dim-light questions becomes over-confident: the
tuning-induced mis-calibration of the FIRST and CFT papers, on a task a CPU trains in minutes.
The card number carries no information; it makes every question a text of its own, as in a real
dataset, so that a model *can* memorise each noisy label (without it, the 64 distinct questions
would average their labels back to q, and fine-tuning could not over-fit them).

:func:`generate` writes the task's splits as JSON Lines in the ``custom`` format (question,
choices, answer, id, and the true distribution and the light as extra fields, kept in ``MCQRecord.meta``); the
``synthetic`` dataset reads them, and ``data_files: [bundled]`` the copy that ships in
``lab/data/bundled/synthetic/`` (made by ``scripts/make_synthetic_data.py``). ``shifted`` is the
out-of-domain variant: the same rule under other noise levels. The Bayes predictor's figures
(:mod:`lab.calibration.oracle`) are computed from the ``true_probs`` this module writes.

The token tasks (:mod:`lab.data.texts`, ``task: clm`` / ``facts``) read the same files as statements,
"Card 48213. In bright light, the kettle looks red.", the stated colour being the entity
(:func:`statement`), so that the oracle applies to facts on this task too.
"""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from lab.core.errors import RowProblem

from .custom import custom_row
from .registry import register
from .record import MCQRecord
from .rows import BadRow, read_json
from .spec import DatasetSpec
from .texts import TEXT_TASKS, TextRecord, TextRow, text_readers

COLOURS = ("red", "green", "blue", "gold", "grey", "pink")
OBJECTS = ("kettle", "lantern", "saddle", "anchor", "violin", "teapot", "compass", "ladder", "bucket", "helmet",
           "barrel", "candle", "mirror", "basket", "hammer", "pillow", "wagon", "trumpet", "button", "feather",
           "ribbon", "marble", "thimble", "whistle", "spoon", "kite", "drum", "bell", "scarf", "glove", "shovel",
           "bottle")
IN_DOMAIN = (("bright", 0.95), ("dim", 0.6))  # light → how often the stated answer is the rule's
SHIFTED = (("bright", 0.8), ("dim", 0.45))  # the out-of-domain variant: same rule, other noise
SOURCE = "synthetic"  # the records' (and prediction rows') source: the one dataset whose truths are known
SIZES = {"train": 2000, "validation": 500, "test": 1000, "shifted": 1000}
SPLIT_SEEDS = {"train": 1, "validation": 2, "test": 3, "shifted": 4}
FORMAT = "JSON Lines written by scripts/make_synthetic_data.py: question, choices, answer, id, true_probs, light"


@dataclass(frozen=True)
class Task:
    """One controlled task: the rule (``seed``, ``n_options``, ``n_objects``) and the noise per light."""

    seed: int = 0
    n_options: int = 4
    # 8 objects: the small scratch model learns their rule in 2-3 epochs of 600 questions (with 32 it
    # sat at chance for 6 epochs first), leaving the rest of a CPU run to the effects under study.
    n_objects: int = 8
    levels: tuple[tuple[str, float], ...] = IN_DOMAIN

    def __post_init__(self) -> None:
        if not 2 <= self.n_options <= len(COLOURS):
            raise ValueError(f"n_options must be 2..{len(COLOURS)}, got {self.n_options}")
        if not 1 <= self.n_objects <= len(OBJECTS):
            raise ValueError(f"n_objects must be 1..{len(OBJECTS)}, got {self.n_objects}")
        for name, q in self.levels:
            if not 1 / self.n_options <= q <= 1:
                raise ValueError(f"light {name!r}: q = {q} must lie in [1/K, 1] so the rule's answer stays likeliest")

    def rule(self) -> dict[str, int]:
        """Object → the index of its colour: a seeded assignment, every colour used about equally."""
        rng = np.random.default_rng([self.seed, 0])
        objects = list(OBJECTS[: self.n_objects])
        colours = rng.permutation(np.arange(self.n_objects) % self.n_options)
        return {obj: int(c) for obj, c in zip(objects, colours)}

    def true_probs(self, colour: int, q: float) -> list[float]:
        """The answer distribution of a question whose rule colour is ``colour`` and noise ``q``."""
        probs = [(1 - q) / (self.n_options - 1)] * self.n_options
        probs[colour] = q
        return probs


def question_text(obj: str, light: str, card: int) -> str:
    return f"Card {card}. In {light} light, which colour does the {obj} look?"


QUESTION = re.compile(r"Card (\d+)\. In (\w+) light, which colour does the (\w+) look\?")  # question_text's


def statement_prefix(obj: str, light: str, card: int | str) -> str:
    """The statement of a question up to its colour: "Card 48213. In bright light, the kettle looks "."""
    return f"Card {card}. In {light} light, the {obj} looks "


def statement(record: MCQRecord, task: str = "facts") -> TextRecord:
    """A question of the task as the text the token tasks read: "Card 48213. In bright light, the
    kettle looks red." with the *stated* answer's colour, which is its one entity (for facts).

    ``meta`` keeps the question's (the light, and for facts ``true_probs``, the true distribution
    over the colours) with ``choices`` (the colours, in the order of ``true_probs``) and ``answer``
    (the index of the stated one), so that the Bayes predictor applies to the colour's first token
    as to the question. For clm, whose positions are random, ``true_probs`` is left out: it is the
    distribution of the colour, not of a token drawn anywhere in the text.
    """
    found = QUESTION.fullmatch(record.question)
    if not found:
        raise BadRow(f"not a question of the controlled task ({question_text('<object>', '<light>', 0)!r} "
                     "expected), so it has no statement form")
    card, light, obj = found.groups()
    prefix, colour = statement_prefix(obj, light, card), record.choices[record.answer]
    meta = {**record.meta, "choices": list(record.choices), "answer": record.answer}
    if task != "facts":
        meta.pop("true_probs", None)
    entities = ((len(prefix), len(prefix) + len(colour)),) if task == "facts" else ()
    return TextRecord(record.id, f"{prefix}{colour}.", entities, SOURCE, meta, record.origin)


def synthetic_texts(path: Path, task: str) -> Iterator[TextRow]:
    """A file of the task's questions (:func:`synthetic_row`) as statements (:func:`statement`)."""
    for row in read_json(path, synthetic_row):
        if isinstance(row, RowProblem):
            yield row
            continue
        try:
            yield statement(row, task)
        except BadRow as e:
            file, line = row.origin or (str(path), 0)
            yield RowProblem(file, line, str(e))


def generate(task: Task, n: int, split_seed: int, split: str = "test") -> list[dict[str, Any]]:
    """``n`` questions (custom-format rows): object and light drawn uniformly, the stated answer drawn
    from the true distribution, which each row keeps with its light and the rule's answer."""
    rng = np.random.default_rng([task.seed, split_seed])
    rule, objects = task.rule(), list(task.rule())
    rows = []
    for i in range(n):
        obj = objects[rng.integers(len(objects))]
        light, q = task.levels[rng.integers(len(task.levels))]
        truth = task.true_probs(rule[obj], q)
        card = int(rng.integers(10_000, 100_000))
        rows.append({"id": f"{split}-{i}", "question": question_text(obj, light, card),
                     "choices": list(COLOURS[: task.n_options]), "answer": int(rng.choice(task.n_options, p=truth)),
                     "true_probs": [round(p, 6) for p in truth], "light": light})
    return rows


def split_seed(split: str) -> int:
    """The seed of a split's questions: fixed for the shipped splits, the name's CRC-32 for any other."""
    return SPLIT_SEEDS.get(split, zlib.crc32(split.encode()))


def write_splits(out: Path, task: Task = Task(), sizes: Optional[dict[str, int]] = None) -> list[Path]:
    """The task's splits as ``<split>.jsonl`` in ``out``: train/validation/test and the shifted test
    split by default, or the names and sizes in ``sizes`` (``shifted``: the shifted noise levels)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split, n in (sizes or SIZES).items():
        variant = Task(task.seed, task.n_options, task.n_objects, SHIFTED) if split == "shifted" else task
        target = out / f"{split}.jsonl"
        target.write_text("".join(json.dumps(r) + "\n" for r in generate(variant, n, split_seed(split), split)),
                          encoding="utf-8")
        written.append(target)
    return written


def is_distribution(truth: Any, n_options: int) -> bool:
    """Whether ``truth`` is ``n_options`` probabilities (numbers in [0, 1]) summing to 1 (within 1e-4)."""
    return (isinstance(truth, list) and len(truth) == n_options > 0
            and all(isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1 for p in truth)
            and abs(sum(truth) - 1) <= 1e-4)


def true_distributions(rows: Sequence[dict[str, Any]]) -> Optional[list[list[float]]]:
    """Every prediction row's true answer distribution (``meta.true_probs``, kept from the record), or
    None unless all of them carry one: only the controlled task's runs have an oracle. A row read from
    any other dataset (its ``source``: "custom" for an upload) has none, whatever its extra fields say, and
    a truth that is no distribution over the row's choices is none either (a file edited by hand)."""
    def truth(row: Any) -> Any:
        if not isinstance(row, dict) or row.get("source", SOURCE) != SOURCE or not isinstance(row.get("meta"), dict):
            return None
        value, choices = row["meta"].get("true_probs"), row.get("choices")
        return value if is_distribution(value, len(choices) if isinstance(choices, list) else len(value or [])) else None

    truths = [truth(row) for row in rows]
    if not rows or any(t is None for t in truths):
        return None
    return truths


def statement_truth(record: TextRecord) -> Optional[tuple[list[float], int]]:
    """A statement's true distribution over its colours and the stated one (:func:`statement`), or None
    for a text of any other dataset: a user's row carrying ``true_probs`` or ``answer`` has no oracle."""
    if record.source != SOURCE:
        return None
    truth, choices, answer = (record.meta.get(key) for key in ("true_probs", "choices", "answer"))
    if not isinstance(choices, list) or not is_distribution(truth, len(choices)):
        return None
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        return None
    return truth, answer


def synthetic_row(row: Any, default_id: str) -> MCQRecord:
    """A custom-format row whose ``true_probs`` is a distribution over its options (checked: the
    oracle's numbers are only as good as it)."""
    record = custom_row(row, default_id)
    truth = record.meta.get("true_probs")
    if not is_distribution(truth, len(record.choices)):
        raise BadRow(f"'true_probs' must be {len(record.choices)} probabilities summing to 1, got {truth!r}")
    return replace(record, source=SOURCE)


register(DatasetSpec(
    name="synthetic",
    description="a controlled task with known true confidence: object → colour by a fixed rule, answers "
                "noisy by the light (bright q = 0.95, dim 0.6); splits train, validation, test, shifted",
    hub_path=None, hub_config=None, hub_splits={},
    local_format=FORMAT,
    readers={"mcq": partial(read_json, convert=synthetic_row), **text_readers(synthetic_texts, FORMAT, TEXT_TASKS)},
    from_hub=None, bundled=tuple((split, f"synthetic/{split}.jsonl") for split in SIZES), extra_splits=("shifted",)))
