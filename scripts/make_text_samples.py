"""Make the bundled samples of the token tasks (lab/data/texts.py) from their public sources.

    python scripts/make_text_samples.py --shakespeare input.txt --trex sample-output.json [--check]

* ``lab/data/bundled/text/{validation,test}.txt`` (dataset ``text``, task clm): paragraphs of Tiny
  Shakespeare, ``karpathy/char-rnn`` @ 6f9487a6 : ``data/tinyshakespeare/input.txt`` (public domain).
  The source's paragraphs are its runs of non-blank lines (a speaker's name and speech); those of at
  least MIN_WORDS words are candidates, ``random.Random(SEED).sample`` draws TEXT_DOCS of them, the
  first half drawn is the validation split and the second the test split, each in the source's order
  and byte for byte, separated by one blank line.
* ``lab/data/bundled/trex/test.jsonl`` (dataset ``trex``, task facts): the T-REx sample of its
  authors, ``hadyelsahar/t-rex`` @ 28c192a9 : ``samples/sample-output.json`` (CC BY-SA 4.0), one row
  per sentence (T-REx's own ``sentences_boundaries``) that holds an entity: ``text`` the sentence,
  ``entities`` the spans of its Wikidata entities and dates (annotators in ENTITY_ANNOTATORS; T-REx's
  predicate mentions and pronoun coreferences are not entities) shifted into the sentence, each
  checked against its ``surfaceform``; where two overlap the earlier (then longer) is kept.
  ``--trex`` also takes another T-REx JSON file (e.g. a file of the 10,000-document sample,
  https://doi.org/10.6084/m9.figshare.5151175) with ``--trex-rows N`` to draw N rows (seeded).

Every source is checked by its sha256 (the pinned ones below; another file is named in the output
of the run). ``--check`` makes the files in a temporary folder and compares them with the bundled ones.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "lab" / "data" / "bundled"
SEED = 0

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
MIN_WORDS = 40  # a paragraph long enough that a random position has context before it
TEXT_DOCS = 300  # 150 validation + 150 test

TREX_SHA256 = "2f1f31295aadf7ba1bbd3abb94d34c2f9041eafe7287f31e6fde5e4313f8d738"
ENTITY_ANNOTATORS = ("Wikidata_Spotlight_Entity_Linker", "Date_Linker")


def paragraphs(text: str) -> list[str]:
    """Runs of non-blank lines, as lab.data.texts reads a .txt file (lines kept as written)."""
    out, lines = [], []
    for line in text.split("\n"):
        if line.strip():
            lines.append(line)
        elif lines:
            out.append("\n".join(lines))
            lines = []
    if lines:
        out.append("\n".join(lines))
    return out


def shakespeare_splits(source: bytes, docs: int = TEXT_DOCS, seed: int = SEED) -> dict[str, str]:
    """{split: file text}: ``docs`` long paragraphs drawn with ``seed``, halved into validation and test."""
    candidates = [p for p in paragraphs(source.decode("utf-8")) if len(p.split()) >= MIN_WORDS]
    drawn = random.Random(seed).sample(range(len(candidates)), docs)
    half = docs // 2
    return {split: "\n\n".join(candidates[i] for i in sorted(part)) + "\n"
            for split, part in (("validation", drawn[:half]), ("test", drawn[half:]))}


def trex_rows(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per sentence of each T-REx document that holds an entity (see the module docstring)."""
    rows = []
    for doc in documents:
        text, qid = doc["text"], doc["docid"].rsplit("/", 1)[-1]
        found = []
        for entity in doc["entities"]:
            start, end = entity["boundaries"]
            if entity["annotator"] in ENTITY_ANNOTATORS:
                if text[start:end] != entity["surfaceform"]:
                    raise ValueError(f"{qid}: entity {entity['surfaceform']!r} is not at {start}:{end}")
                found.append((start, end, entity["uri"]))
        for k, (s, e) in enumerate(doc["sentences_boundaries"]):
            inside = sorted({(a - s, b - s, uri) for a, b, uri in found if s <= a and b <= e},
                            key=lambda x: (x[0], -(x[1] - x[0]), x[2]))
            kept: list[tuple[int, int, str]] = []
            for span in inside:
                if not kept or span[0] >= kept[-1][1]:
                    kept.append(span)
            if kept:
                rows.append({"id": f"{qid}-{k}", "text": text[s:e], "entities": [[a, b] for a, b, _ in kept],
                             "title": doc["title"], "docid": doc["docid"], "sentence": k,
                             "entity_uris": [uri for _, _, uri in kept]})
    return rows


def _sha256(path: Path, pinned: str, what: str) -> bytes:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned:
        print(f"note: {path} is not the pinned {what} (sha256 {digest}, pinned {pinned})", file=sys.stderr)
    return data


def build(shakespeare: Path, trex: Path, target: Path, trex_count: int | None = None) -> None:
    for split, text in shakespeare_splits(_sha256(shakespeare, SHAKESPEARE_SHA256, "Tiny Shakespeare")).items():
        (target / "text").mkdir(parents=True, exist_ok=True)
        (target / "text" / f"{split}.txt").write_text(text, encoding="utf-8", newline="\n")
    rows = trex_rows(json.loads(_sha256(trex, TREX_SHA256, "T-REx sample")))
    if trex_count is not None and trex_count < len(rows):
        rows = [rows[i] for i in sorted(random.Random(SEED).sample(range(len(rows)), trex_count))]
    (target / "trex").mkdir(parents=True, exist_ok=True)
    (target / "trex" / "test.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                                encoding="utf-8", newline="\n")


FILES = ("text/validation.txt", "text/test.txt", "trex/test.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shakespeare", type=Path, required=True, help="Tiny Shakespeare's input.txt")
    parser.add_argument("--trex", type=Path, required=True, help="a T-REx JSON file (the authors' sample-output.json)")
    parser.add_argument("--trex-rows", type=int, default=None, help="draw this many sentence rows (default: all)")
    parser.add_argument("--check", action="store_true", help="compare with the bundled files instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        build(args.shakespeare, args.trex, TARGET, args.trex_rows)
        print("\n".join(str(TARGET / f) for f in FILES))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(args.shakespeare, args.trex, Path(tmp), args.trex_rows)
        differ = [f for f in FILES if not filecmp.cmp(Path(tmp) / f, TARGET / f, shallow=False)]
    print("\n".join(f"differs: {f}" for f in differ) or "the bundled files are as this script makes them")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
