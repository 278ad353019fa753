"""How long a hostile config can hold the submit path: parse + validate + resolve, in-process.

Before the bounds, a 357-byte YAML alias bomb held ``/submit_job`` for 242 s and a 50 MB config
was accepted after minutes. Each case below goes through what every entry point runs
(``load_yaml`` then ``parse_config`` with the server's roots); the figure is the median of 5 runs,
with a typical config measured in the same run as the baseline.

    .venv/bin/python -m bench.submit_bounds
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench._harness import parser, timed
from lab.core.config import ConfigError
from lab.jobkit.kinds import parse_config
from lab.core.yamlio import MAX_BYTES, MAX_DEPTH, load_yaml

BOMB = ("a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
        "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: [*g,*g,*g,*g,*g,*g,*g,*g,*g]\nkind: evaluate\n")


def submit_once(text: str, roots: list[Path]) -> str:
    try:
        parse_config(load_yaml(text), roots)
    except ConfigError as e:
        return "refused: " + str(e)[:70]
    return "accepted"


def main() -> None:
    parser(__doc__).parse_args()
    roots = [Path(tempfile.mkdtemp())]
    (roots[0] / "q.jsonl").write_text('{"question": "2+2?", "choices": ["4", "5"], "answer": "A"}\n')
    long_list = "kind: evaluate\ndata_files:\n" + ("- " + "x" * 60 + "\n") * ((MAX_BYTES - 40) // 64)
    cases = {
        "typical evaluate config": f"kind: evaluate\ndataset: custom\ndata_files: [{roots[0]}/q.jsonl]\nlimit: 50\n",
        f"alias bomb ({len(BOMB)} bytes)": BOMB,
        f"{len(long_list) / 2**20:.2f} MiB list of paths (the largest size accepted)": long_list,
        f"nesting {MAX_DEPTH * 100} deep": "data_files: " + "[" * MAX_DEPTH * 100 + "]" * MAX_DEPTH * 100,
        "50 MB config": "kind: evaluate\n" + "#" * 50_000_000,
    }
    baseline = None
    print(f"{'case':<58} {'median s':>9} {'× typical':>10}  answer")
    for name, text in cases.items():
        answers: list[str] = []
        median = statistics.median(timed(lambda: answers.append(submit_once(text, roots))) for _ in range(5))
        answer = answers[-1]
        baseline = baseline or median
        print(f"{name:<58} {median:>9.4f} {median / baseline:>10.1f}  {answer}")


if __name__ == "__main__":
    main()
