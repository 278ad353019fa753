"""``python -m lab evaluate …`` and ``python -m lab run CONFIG.yaml``: the lab's command line.

Flags are generated from ``EvalConfig``'s fields so the defaults and help live in one place.
Bad input (unknown dataset or model, malformed file, wrong option) ends with one line on stderr
and exit code 2, running out of memory with exit code 3; only a bug in the lab itself shows a
traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from pathlib import Path
from typing import Optional, Sequence

from lab.errors import USER_ERRORS
from lab.evaluate import EvalConfig, evaluate


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        args = typing.get_args(kind)
        kwargs: dict = {"dest": f.name, "help": f"{f.metadata.get('help', '')} (default: %(default)s)"}
        if typing.get_origin(kind) is list:
            kwargs.update(nargs="+", default=[])
        elif typing.get_origin(kind) is typing.Literal:
            kwargs.update(choices=args, default=f.default)
        else:
            base = next((a for a in args if a is not type(None)), kind)  # Optional[X] -> X
            kwargs.update(type=base, default=f.default)
        parser.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description="Calibration Lab command line")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="accuracy and calibration of a model on a multiple-choice dataset")
    _add_config_flags(ev, EvalConfig)
    ev.add_argument("--out", type=Path, default=None, help="run directory (default: runs/evaluate-<time>)")
    rn = sub.add_parser("run", help="run a job config (YAML with `kind` and its fields), as the job system does")
    rn.add_argument("config", type=Path)
    rn.add_argument("--out", "--run-dir", dest="run_dir", type=Path, default=None,
                    help="run directory (default: runs/<config name>-<time>)")
    return parser


def _progress_bar(total: int):
    from tqdm import tqdm

    bar = tqdm(total=total, file=sys.stderr, unit="q", desc="scoring", dynamic_ncols=True)
    return bar.update


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = vars(build_parser().parse_args(argv))
    if args.pop("command") == "run":
        from lab.run import run

        default = Path("runs") / f"{args['config'].stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        return run(args["config"], args["run_dir"] or default)
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # ours is the one progress bar on stderr
    out = args.pop("out")
    try:
        cfg = EvalConfig.from_dict(args)
        out = out or Path("runs") / f"evaluate-{time.strftime('%Y%m%d-%H%M%S')}"
        result = evaluate(cfg, out, progress_factory=_progress_bar, log=lambda m: print(m, file=sys.stderr))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, torch.OutOfMemoryError):
        print(f"error: out of memory at --batch-size {args['batch_size']}; lower it (or use a smaller "
              "--dtype such as bfloat16 on a GPU)", file=sys.stderr)
        return 3
    keys = ("n", "accuracy", "ece", "cw_ece", "mce", "brier", "nll", "trust")
    print(" ".join(f"{k}={result[k]:.4f}" if isinstance(result[k], float) else f"{k}={result[k]}" for k in keys))
    print(f"wrote {out}/metrics.json and {out}/predictions.jsonl", file=sys.stderr)
    return 0
