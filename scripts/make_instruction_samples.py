"""Make the bundled samples of instruction data (lab/data/instructions.py) from their public sources.

    python scripts/make_instruction_samples.py [--alpaca FILE] [--dolly FILE] [--check]

* ``lab/data/bundled/alpaca/{train,validation}.jsonl`` (dataset ``alpaca``): Stanford Alpaca rows
  (CC BY-NC 4.0: non-commercial use only), drawn from ``alpagasus_random_9k.json`` — a random subset of
  Alpaca, ``gpt4life/alpagasus`` @ 95ad3e52 : ``data/random/random_9k.json``, the copy in
  ``../shared/data/alpaca/`` by default. Its rows whose output is blank or Alpaca's ``<nooutput>``
  placeholder (11 of 9,229) are left out: they have no response to learn. Written as JSON Lines, each
  row's fields as in the source, preceded by an ``id`` naming its place there
  (``alpagasus_random_9k-<0-based index>``).
* ``lab/data/bundled/dolly/{train,validation}.jsonl`` (dataset ``dolly``), only with ``--dolly``:
  rows of databricks-dolly-15k (CC BY-SA 3.0), from its ``databricks-dolly-15k.jsonl``: the file is
  Git LFS content in ``Wilderdbb/databricks-dolly-15k`` (a copy of the Hugging Face repository
  ``databricks/databricks-dolly-15k``), whose pointer at d72c16e4 pins its sha256 and size
  (DOLLY_SHA256). It must hold DOLLY_ROWS rows of exactly the fields instruction, context, response and
  category; rows are kept byte for byte (the loader reads Dolly's own layout, its context as Alpaca's
  input). Those with a blank instruction or response are left out. The Dolly sample bundled with the
  lab was not made by this script (the official file was not at hand): it is 193 short rows taken from
  a full copy of the file by the rule that ``lab/data/bundled/SOURCES.md`` describes. ``--dolly`` makes
  other files (500 seeded rows), written over the bundled ones (update SOURCES.md then), and
  ``--check --dolly FILE`` reports the bundled ones as differing.

From each source's candidate rows ``random.Random(SEED).sample`` draws ROWS: the first TRAIN drawn are
the train split and the rest the validation split, each in the source's order. Every source is checked
by its sha256 (another file is named in the output, and makes other samples). ``--check`` makes the
files in a temporary folder and compares them with the bundled ones: Alpaca's always, Dolly's only
with ``--dolly``.
"""
from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "lab" / "data" / "bundled"
SEED = 0
ROWS, TRAIN = 500, 400  # 400 train + 100 validation per dataset

ALPACA = REPO.parent / "shared" / "data" / "alpaca" / "alpagasus_random_9k.json"
ALPACA_SHA256 = "dbb217523fb750e4c56013844e22f5f3363c8c8b01013df5b39e8cabec0e48b0"
ALPACA_FIELDS = {"instruction", "input", "output"}
NO_OUTPUT = "<nooutput>"  # Alpaca's placeholder where the instruction has no text answer

DOLLY_SHA256 = "2df9083338b4abd6bceb5635764dab5d833b393b55759dffb0959b6fcbf794ec"  # 13,085,339 bytes
DOLLY_ROWS = 15_011
DOLLY_FIELDS = {"instruction", "context", "response", "category"}


def _checked(path: Path, pinned: str, what: str) -> bytes:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned:
        print(f"note: {path} is not the pinned {what} (sha256 {digest}, pinned {pinned})", file=sys.stderr)
    return data


def draw(lines: list[str], keep: Callable[[int], bool], rows: int = ROWS, train: int = TRAIN,
         seed: int = SEED) -> dict[str, str]:
    """{split: file text}: ``rows`` of the ``lines`` that ``keep`` (by index), drawn with ``seed``; the
    first ``train`` drawn are train, the rest validation, each in the source's order."""
    candidates = [i for i in range(len(lines)) if keep(i)]
    drawn = [candidates[k] for k in random.Random(seed).sample(range(len(candidates)), rows)]
    return {split: "".join(lines[i] + "\n" for i in sorted(part))
            for split, part in (("train", drawn[:train]), ("validation", drawn[train:]))}


def alpaca_splits(source: bytes, stem: str = "alpagasus_random_9k") -> dict[str, str]:
    """The Alpaca sample (see the module docstring) from the source file's bytes."""
    rows = json.loads(source.decode("utf-8"))
    if not all(isinstance(r, dict) and set(r) == ALPACA_FIELDS for r in rows):
        raise ValueError(f"not an Alpaca file: every row should have exactly the fields {sorted(ALPACA_FIELDS)}")
    lines = [json.dumps({"id": f"{stem}-{i}", **row}, ensure_ascii=False) for i, row in enumerate(rows)]
    return draw(lines, lambda i: rows[i]["output"].strip() not in ("", NO_OUTPUT))


def dolly_splits(source: bytes) -> dict[str, str]:
    """The Dolly sample (see the module docstring) from databricks-dolly-15k.jsonl's bytes."""
    lines = source.decode("utf-8").split("\n")  # not splitlines(): a row's text may hold U+2028 and the like
    if lines and not lines[-1]:
        lines.pop()
    rows = [json.loads(line) for line in lines]
    if len(rows) != DOLLY_ROWS or not all(isinstance(r, dict) and set(r) == DOLLY_FIELDS for r in rows):
        raise ValueError(f"not databricks-dolly-15k.jsonl: it has {DOLLY_ROWS:,} rows of exactly the fields "
                         f"{sorted(DOLLY_FIELDS)}; this file has {len(rows):,} rows")
    return draw(lines, lambda i: bool(rows[i]["instruction"].strip() and rows[i]["response"].strip()))


def build(alpaca: Path, dolly: Path | None, target: Path) -> list[str]:
    """Write the samples under ``target``; the files written, relative to it."""
    made = {"alpaca": alpaca_splits(_checked(alpaca, ALPACA_SHA256, "AlpaGasus random 9k file"))}
    if dolly is not None:
        made["dolly"] = dolly_splits(_checked(dolly, DOLLY_SHA256, "databricks-dolly-15k.jsonl"))
    written = []
    for name, splits in made.items():
        (target / name).mkdir(parents=True, exist_ok=True)
        for split, text in splits.items():
            (target / name / f"{split}.jsonl").write_text(text, encoding="utf-8", newline="\n")
            written.append(f"{name}/{split}.jsonl")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpaca", type=Path, default=ALPACA, help="alpagasus_random_9k.json (default: ../shared's)")
    parser.add_argument("--dolly", type=Path, default=None,
                        help="databricks-dolly-15k.jsonl (default: no Dolly sample)")
    parser.add_argument("--check", action="store_true", help="compare with the bundled files instead of writing")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            print("\n".join(str(TARGET / f) for f in build(args.alpaca, args.dolly, TARGET)))
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            made = build(args.alpaca, args.dolly, Path(tmp))
            differ = [f for f in made
                      if not (TARGET / f).is_file() or not filecmp.cmp(Path(tmp) / f, TARGET / f, shallow=False)]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(f"differs: {f}" for f in differ) or "the bundled files are as this script makes them")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
