"""Regenerate the dataset samples bundled in ``lab/data/bundled/`` from the originals in ../shared/data
(and the controlled task's splits, which are generated: :mod:`lab.data.synthetic`).

    python scripts/make_bundled_data.py [--source ../shared/data] [--check]

The lab must run its defaults on a machine with no network and no ../shared, so a few small
samples of datasets whose licences allow redistribution ship inside the package (see
``lab/data/bundled/SOURCES.md`` for their origins and licences). Every sampled file keeps its rows
byte for byte and in their original order: a seeded ``random.Random(SEED).sample`` of the line
numbers, sorted, so the readers read them as they read the originals and the sample is the same on
every machine. A whole file that ../shared/data lacks (ARC-Easy's dev file) is pinned by the sha256
of the official release file instead, so it is checked on every machine, ../shared/data or not.
``--check`` regenerates into a temporary folder and compares it with the bundled files instead of
writing, for CI or review.
"""
from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.data.synthetic import write_splits  # noqa: E402

TARGET = REPO / "lab" / "data" / "bundled"
SEED = 0

# (file or folder under the source, the same under the target, rows kept: None = all)
FILES: tuple[tuple[str, str, int | None], ...] = (
    ("openbookqa/train.jsonl", "openbookqa/train.jsonl", 2000),
    ("openbookqa/dev.jsonl", "openbookqa/dev.jsonl", None),
    ("openbookqa/test.jsonl", "openbookqa/test.jsonl", None),
    ("mmlu/dev", "mmlu/dev", None),
    ("mmlu/val", "mmlu/val", None),
    ("medmcqa/dev.jsonl", "medmcqa/dev.jsonl", 1000),
    ("arc_challenge/dev.jsonl", "arc_challenge/dev.jsonl", None),
    ("arc_challenge/test.jsonl", "arc_challenge/test.jsonl", None),
    ("boolq/dev.jsonl", "boolq/dev.jsonl", 500),
)
# Whole original files that ../shared/data does not hold, each checked by the sha256 of the official
# release file (the OpenCompass data copy's Git LFS pointer, lab/data/bundled/SOURCES.md): (the same
# path under the source and the target, sha256).
PINNED: tuple[tuple[str, str], ...] = (
    ("arc_easy/dev.jsonl", "f4364b808a68df6bf500ce1070fb0105d40cacd2391c210deb00ff83ba75d1f4"),
)
# Preference pairs for the CFT win rate offline: each OpenBookQA dev question with its right
# answer as `chosen` and one wrong answer (seeded) as `rejected`.
PAIRS_SOURCE, PAIRS_TARGET = "openbookqa/dev.jsonl", "preferences/openbookqa_dev_pairs.jsonl"


def sample_lines(lines: list[bytes], keep: int | None, seed: int = SEED) -> list[bytes]:
    """``keep`` of ``lines`` drawn without replacement, in their original order (all when None)."""
    if keep is None or keep >= len(lines):
        return lines
    return [lines[i] for i in sorted(random.Random(seed).sample(range(len(lines)), keep))]


def _lines(path: Path) -> list[bytes]:
    """The file's non-empty lines, each ending in a newline (a last line without one gets it)."""
    return [line if line.endswith(b"\n") else line + b"\n" for line in path.read_bytes().splitlines(keepends=True)
            if line.strip()]


def copy_sample(source: Path, target: Path, keep: int | None) -> None:
    """A file sampled line by line, or a folder's files copied whole (MMLU's per-subject CSVs)."""
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(source.iterdir()):
            shutil.copyfile(path, target / path.name)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"".join(sample_lines(_lines(source), keep)))


def copy_pinned(rel: str, sha256: str, source: Path, target: Path) -> None:
    """A pinned file copied whole, from ``source`` where it has one, else the bundled copy (which so checks
    itself); refused unless it is the release file, so a changed or damaged copy never ships."""
    found = [path for path in (source / rel, TARGET / rel) if path.is_file()]
    if not found:
        raise ValueError(f"{source / rel}: missing; it is the release file with sha256 {sha256} "
                         "(lab/data/bundled/SOURCES.md says where to get it)")
    data = found[0].read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{found[0]}: sha256 {hashlib.sha256(data).hexdigest()}, not the release file's {sha256}")
    (target / rel).parent.mkdir(parents=True, exist_ok=True)
    (target / rel).write_bytes(data)


def preference_pairs(source: Path, seed: int = SEED) -> list[dict[str, str]]:
    """(question, right answer, a wrong answer) of every AI2-format question in ``source``."""
    rng = random.Random(seed)
    pairs = []
    for line in _lines(source):
        row = json.loads(line)
        choices = {c["label"]: c["text"] for c in row["question"]["choices"]}
        wrong = sorted(label for label in choices if label != row["answerKey"])
        pairs.append({"id": row["id"], "prompt": row["question"]["stem"], "chosen": choices[row["answerKey"]],
                      "rejected": choices[rng.choice(wrong)]})
    return pairs


def build(source: Path, target: Path) -> None:
    for src, dst, keep in FILES:
        copy_sample(source / src, target / dst, keep)
    for rel, sha256 in PINNED:
        copy_pinned(rel, sha256, source, target)
    pairs = target / PAIRS_TARGET
    pairs.parent.mkdir(parents=True, exist_ok=True)
    pairs.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preference_pairs(source / PAIRS_SOURCE)),
                     encoding="utf-8")
    write_splits(target / "synthetic")  # generated, not sampled: the controlled task (lab.data.synthetic)


def _differences(made: Path, bundled: Path) -> list[str]:
    """Data files that differ between two trees (the notes beside the data are not generated)."""
    out = []
    for path in sorted(p for p in made.rglob("*") if p.is_file()):
        rel = path.relative_to(made)
        if not (bundled / rel).is_file() or not filecmp.cmp(path, bundled / rel, shallow=False):
            out.append(str(rel))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--check", action="store_true", help="compare with the bundled files instead of writing")
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        print(f"error: no source folder at {args.source}", file=sys.stderr)
        return 2
    try:
        if not args.check:
            build(args.source, TARGET)
            print(f"wrote {TARGET}")
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            build(args.source, Path(tmp))
            differ = _differences(Path(tmp), TARGET)
    except ValueError as e:  # a pinned file that is not the release file
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(f"differs: {d}" for d in differ) or "the bundled files are as this script makes them")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
