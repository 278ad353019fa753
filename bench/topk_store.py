"""Top-k store on the bundled model: bytes per position, top-5 coverage, and extraction cost.

    python -m bench.topk_store [--data-files ../shared/data/commonsenseqa/train.jsonl] [--n 64]
                               [--out bench/results/topk_store_cpu.txt]

FIRST (REFERENCE.md §2) stores the teacher's top-5 instead of its full distribution. Prints the
bytes per stored position for k=5 and its ratio to the full distribution in fp16, the mean top-K
coverage, and extraction throughput (tokens/s) against a bare forward pass — ``model(input_ids,
attention_mask)``, no top-k, no storage — over the same batches, interleaved in the same run, the
median of ``--repeats`` (target ≥ 0.9). Runs on the GPU when there is one (``--device``).
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from bench._harness import REPO, RESULTS, Transcript, parser, timed, write_result
from lab.data import load
from lab.kinds.extract.store import extract_topk
from lab.models.batching import plan_batches
from lab.models.loading import load_model

DEFAULT_DATA = REPO.parent / "shared" / "data" / "commonsenseqa" / "train.jsonl"
K = 5


def first_prompt(record) -> str:
    """FIRST's zero-shot CSQA format, answer included (the teacher's targets cover the whole text)."""
    options = " ".join(f"({chr(97 + i)}) {c}" for i, c in enumerate(record.choices))
    return f"Q: {record.question} Answer Choices: {options} A: The answer is ({chr(97 + record.answer)})."


@torch.inference_mode()
def bare_forward(model, seqs: list[list[int]], batch_size: int, pad_id: int) -> None:
    """The baseline: the same longest-first, right-padded batches, logits at every position, nothing else."""
    device = next(model.parameters()).device
    for batch in plan_batches([len(s) for s in seqs], batch_size):
        width = max(len(seqs[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(batch):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        model(input_ids=ids.to(device), attention_mask=mask.to(device))


def main() -> None:
    options = parser(__doc__, out=RESULTS / "topk_store_cpu.txt")
    options.add_argument("--data-files", default=str(DEFAULT_DATA), help="CommonsenseQA-format JSONL")
    options.add_argument("--n", type=int, default=64, help="sequences")
    options.add_argument("--batch-size", type=int, default=8)
    options.add_argument("--repeats", type=int, default=3)
    options.add_argument("--device", default="auto")
    args = options.parse_args()
    report = Transcript()

    loaded = load_model("bundled", device=args.device)
    model, tok = loaded.model, loaded.tokenizer
    records = load("csqa", "train", [args.data_files], limit=args.n).records
    seqs = tok([first_prompt(r) for r in records])["input_ids"]
    tokens = sum(len(s) for s in seqs)
    report.print(f"bundled model on {loaded.device} ({str(loaded.dtype).removeprefix('torch.')}), {len(seqs)} CSQA "
                 f"sequences ({tokens} tokens, {min(map(len, seqs))}-{max(map(len, seqs))} each), batch size "
                 f"{args.batch_size}, {torch.get_num_threads()} CPU threads")

    def extract() -> dict:
        with tempfile.TemporaryDirectory() as out:
            return extract_topk(model, seqs, Path(out), k=K, batch_size=args.batch_size, pad_id=tok.pad_token_id,
                                meta={"model": "bundled", "dataset": "csqa train", "template": "first"})

    bare_forward(model, seqs[: args.batch_size], args.batch_size, tok.pad_token_id)  # warm-up: allocations, kernels
    bare_s, extract_s, manifest = [], [], {}
    for _ in range(args.repeats):  # interleaved, so load from other processes hits both alike
        bare_s.append(timed(lambda: bare_forward(model, seqs, args.batch_size, tok.pad_token_id)))
        extract_s.append(timed(lambda: manifest.update(extract())))

    storage, cov = manifest["storage"], manifest["coverage"]
    per_pos, full = storage["bytes_per_position"][K - 1], storage["full_fp16_bytes_per_position"]
    report.print(f"storage, k={K} ({manifest['id_dtype']} ids + {manifest['logprob_dtype']} log-probs): {per_pos} "
                 f"bytes per position vs {full} for the full distribution in fp16 (vocab {manifest['vocab_size']} x "
                 f"2): 1/{full / per_pos:.0f}; {manifest['bytes_on_disk']} bytes on disk for {manifest['n_rows']} "
                 "positions")
    report.print("top-K coverage (mean [min, max]): " + ", ".join(
        f"K={k}: {cov['mean'][k - 1]:.3f} [{cov['min'][k - 1]:.3f}, {cov['max'][k - 1]:.3f}]" for k in (1, 5, 10, 100)))
    bare_rate = [tokens / s for s in bare_s]
    extract_rate = [tokens / s for s in extract_s]
    ratios = [b / e for b, e in zip(bare_s, extract_s)]
    report.print(f"bare forward: {statistics.median(bare_rate):.0f} tokens/s; extraction (forward + "
                 f"top-{max(K, 100)} + store): {statistics.median(extract_rate):.0f} tokens/s")
    report.print(f"extraction / bare forward: {statistics.median(ratios):.2f} (median of {args.repeats}: "
                 f"{', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.9)")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
