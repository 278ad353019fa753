"""The paper presets' plans: what each model of first-paper, sft-paper and cft-paper holds per GPU, in host
memory and on disk, sharded and not, before any download.

    python -m bench.paper_plans [--out bench/results/paper_plans.md]

Each preset as it ships (examples/), its hub models replaced by the config.json the lab ships for them
(lab/models/configs/: LLaMA-2 7B and 13B; Llama-3-8B's for the CFT paper's 8B, the shape of Tulu-3-8B), planned
by :func:`jobs.preflight.dry_run` (what ``python -m jobs submit PRESET --gpus N --dry-run`` prints) on the GPUs the
preset says, against GPUs of the memory the paper used; then the same with ``fsdp_offload`` and unsharded; and the
issue's check, a 7B full fine-tune at 2 × 1,024 tokens a GPU on 8 GPUs.
"""
from __future__ import annotations

import copy
from typing import Any

from bench._harness import RESULTS, parser, preset, write_result
from jobs.preflight import GIB, dry_run
from lab.models.weights import SHIPPED_CONFIGS

CONFIGS = {name: str(SHIPPED_CONFIGS / name) for name in
           ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B-Instruct")}
STAND_IN = {"allenai/Llama-3.1-Tulu-3-8B-DPO": CONFIGS["meta-llama/Meta-Llama-3-8B-Instruct"]}
# (preset, GPUs, GiB of each GPU): FIRST's 8 RTX A6000s, the alignment paper's 4 GPUs (80 GB here), one GPU for CFT.
PRESETS = (("first-paper", 8, 48), ("sft-paper", 4, 80), ("cft-paper", 1, 80))
# The check (tests/jobs/test_dry_run.py): a 7B full fine-tune from LLaMA-2-7B's config.json alone, on 8 GPUs.
CHECK = {"kind": "finetune", "model": CONFIGS["meta-llama/Llama-2-7b-hf"], "method": "full", "batch_size": 2,
         "max_length": 1024, "sharding": "fsdp"}


def _local(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each hub model replaced by the folder of its shipped config.json."""
    return {k: (CONFIGS.get(v) or STAND_IN.get(v) or v) if k in ("model", "teacher", "student") else v
            for k, v in config.items()}


def _variant(config: dict[str, Any], **training: Any) -> dict[str, Any]:
    """``config`` with training settings changed, wherever the kind keeps them (its top, or ``training:``)."""
    changed = copy.deepcopy(config)
    (changed["training"] if "training" in changed else changed).update(training)
    return changed


def rows(name: str, config: dict[str, Any], gpus: int, gib: int) -> list[str]:
    """The table's rows of ``config``: as given on ``gpus`` GPUs of ``gib`` GiB, and for a sharded one with
    ``fsdp_offload`` and unsharded on one GPU."""
    config = dict(config)
    kind = config.pop("kind")
    sharded = (config.get("training") or config).get("sharding", "none") == "fsdp"
    variants = [("as shipped", config, gpus)]
    if sharded:
        variants += [("fsdp_offload", _variant(config, fsdp_offload=True), gpus),
                     ("unsharded, one GPU", _variant(config, sharding="none"), 1)]
    out = []
    for label, values, n in variants:
        report = dry_run(kind, values, n, gib * GIB)
        for m in report["models"]:
            out.append(f"| {name} | {label} | {m['field']} ({m['n_params'] / 1e9:.2f} B, {m['method']}) | {n} × {gib} GB "
                       f"| {m['per_gpu_gib']:.2f} | {m['replicated_per_gpu_gib']:.2f} | {m['cpu_gib']:.2f} | "
                       f"{m['disk_gib']:.2f} | {'yes' if m['fits'] else 'no'} |")
    return out


def main() -> None:
    args = parser(__doc__, out=RESULTS / "paper_plans.md").parse_args()
    lines = ["| preset | variant | model | GPUs | GiB per GPU | unsharded GiB per GPU | host GiB | disk GiB | fits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, gpus, gib in PRESETS:
        lines += rows(name, _local(preset(name)), gpus, gib)
    lines += rows("7B finetune, 2 × 1,024 tokens", CHECK, 8, 80)
    print("\n".join(lines))
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
