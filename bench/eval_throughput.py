"""Questions per second of ``letter`` and ``cloze`` scoring on the bundled model.

    python -m bench.eval_throughput [--data-files ../shared/data/arc_challenge/test.jsonl] [--n 64]
                                    [--out bench/results/eval_throughput_cpu.txt]

Prints q/s at batch sizes 1 and 16 and the batched / one-at-a-time ratio for each mode, plus,
for cloze, a naive baseline measured in the same run: every option scored as its own full
sequence with logits at every position, against our shared context + KV cache + logits only at
the option tokens. (lm-evaluation-harness also scores options as full sequences but is faster
than this loop; bench.vs_lm_eval races the real thing.) Ratios, not absolute figures, are what
carry over between machines. Runs on the GPU when there is one (``--device``).
"""
from __future__ import annotations

from typing import Callable

import torch

from bench._harness import REPO, RESULTS, Transcript, parser, timed, write_result
from lab.data import load
from lab.models.loading import load_model
from lab.models.batching import right_padded, split_pairs
from lab.models.scoring import score_cloze, score_letter
from lab.data.templates import Prompt, get_template

DEFAULT_DATA = REPO.parent / "shared" / "data" / "arc_challenge" / "test.jsonl"


def naive_cloze(model, tokenizer, prompts: list[Prompt], batch_size: int) -> None:
    """Baseline: one right-padded full sequence per (question, option), full logits."""
    device = next(model.parameters()).device
    seqs = [ctx + cont for p in prompts for ctx, conts in [split_pairs(tokenizer, p)] for cont in conts]
    with torch.inference_mode():
        for s in range(0, len(seqs), batch_size):
            ids, mask = right_padded(seqs[s : s + batch_size], tokenizer.pad_token_id)
            torch.log_softmax(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), -1)


def rate(fn: Callable[[], object], n: int) -> float:
    return n / timed(fn)


def main() -> None:
    options = parser(__doc__, out=RESULTS / "eval_throughput_cpu.txt")
    options.add_argument("--data-files", default=str(DEFAULT_DATA), help="ARC-format JSONL")
    options.add_argument("--n", type=int, default=64, help="questions per measurement")
    options.add_argument("--device", default="auto")
    args = options.parse_args()
    report = Transcript()

    loaded = load_model("bundled", device=args.device)
    records = load("arc_challenge", "test", [args.data_files], limit=args.n).records
    model, tok = loaded.model, loaded.tokenizer
    report.print(f"bundled model on {loaded.device} ({str(loaded.dtype).removeprefix('torch.')}), "
                 f"{len(records)} ARC-Challenge questions, {torch.get_num_threads()} CPU threads")
    letter = [get_template("first").render(r, tok) for r in records]
    cloze = [get_template("cloze_qa").render(r, tok) for r in records]
    score_letter(model, tok, letter[:4], batch_size=4)  # warm-up: first calls allocate and pick kernels
    report.print(f"{'mode':<34}{'bs=1 q/s':>10}{'bs=16 q/s':>11}{'16 / 1':>9}")
    results = {}
    for name, fn, prompts in [
        ("letter (one forward, 1 logit row)", score_letter, letter),
        ("cloze (shared context, KV cache)", score_cloze, cloze),
        ("cloze baseline (full seq/option)", naive_cloze, cloze),
    ]:
        one = rate(lambda: fn(model, tok, prompts, batch_size=1), len(prompts))
        sixteen = rate(lambda: fn(model, tok, prompts, batch_size=16), len(prompts))
        results[name] = sixteen
        report.print(f"{name:<34}{one:>10.2f}{sixteen:>11.2f}{sixteen / one:>8.2f}x")
    ours, base = results["cloze (shared context, KV cache)"], results["cloze baseline (full seq/option)"]
    report.print(f"cloze: shared context vs full sequence per option at bs=16: {ours / base:.2f}x")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
