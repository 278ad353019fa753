"""Write the controlled task's splits (lab.data.synthetic) as JSON Lines.

    python scripts/make_synthetic_data.py                  # the copy that ships: lab/data/bundled/synthetic/
    python scripts/make_synthetic_data.py --out DIR --seed 1 --options 5 --objects 20

The files are the ``synthetic`` dataset's own format; give the folder as ``data_files`` (or its files
as ``SPLIT=PATH``) to use a task other than the bundled one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.data.synthetic import OBJECTS, Task, write_splits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "lab" / "data" / "bundled" / "synthetic")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rule and of every split")
    parser.add_argument("--options", type=int, default=4, help="colours to choose from (2–6)")
    parser.add_argument("--objects", type=int, default=Task().n_objects, help=f"objects in the rule (1–{len(OBJECTS)})")
    args = parser.parse_args()
    for path in write_splits(args.out, Task(args.seed, args.options, args.objects)):
        print(path)


if __name__ == "__main__":
    main()
