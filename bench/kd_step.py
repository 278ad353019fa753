"""Cost of one knowledge-matching training step against one hard-label step, on the bundled model.

    python -m bench.kd_step [--batch 4] [--seq 96] [--repeats 3] [--out bench/results/kd_step_cpu.txt]

One batch of ``--batch`` × ``--seq`` real tokens (this repository's own source text) with the
last 30 % of each row supervised, as a completion-only batch would. Teacher: the top-5 ids and
log-probs of one forward of the same model (detached), as ``lab.kinds.extract`` stores them. Timed,
median of ``--repeats`` after one warm-up each, the steps interleaved so that load from other
processes hits both alike:

- hard: forward with ``labels=`` (transformers' own cross-entropy) + backward;
- kd: forward without labels + :func:`lab.training.kd_losses.topk_kl_loss` + backward;
- kd+tail: the same with ``tail=True`` (one extra (N, V) copy for the student's tail).

Prints wall and CPU times and kd / hard (target ≤ 1.15). Ratios, not absolute times, carry over
between machines.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from bench._harness import REPO, RESULTS, Timer, Transcript, parser, write_result
from lab.training.kd_losses import topk_kl_loss
from lab.models.loading import load_model

TOP_K = 5
SUPERVISED = 0.3  # fraction of each row (its end) whose tokens carry a label
TARGET_RATIO = 1.15


def make_batch(tokenizer, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (B, T), HF labels (B, T) with -100 on the prompt, KD mask (B, T).

    ``labels[b, t]`` is token t's label and transformers shifts it; the KD mask follows the
    alignment contract (position t predicts token t+1), so ``mask[:, t] = labels[:, t+1] != -100``
    and both losses see the same B · (T − start) targets.
    """
    sources = sorted((REPO / "lab").glob("*.py"))
    text = "\n".join(p.read_text() for p in sources)
    ids = torch.tensor(tokenizer(text)["input_ids"][: batch * seq]).view(batch, seq)  # (B, T)
    start = int(seq * (1 - SUPERVISED))
    labels = ids.clone()
    labels[:, :start] = -100
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[:, start - 1 : seq - 1] = True
    return ids, labels, mask


def median_seconds(
    steps: dict[str, Callable[[], None]], repeats: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each step. CPU time (all threads of this process) is the
    steadier of the two when other processes share the cores."""
    for step in steps.values():  # warm-up: first calls allocate and pick kernels
        step()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            wall, cpu = Timer(), time.process_time()
            step()
            times[name].append((wall.seconds, time.process_time() - cpu))
    return {
        name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
        for name, t in times.items()
    }


def main() -> None:
    options = parser(__doc__, out=RESULTS / "kd_step_cpu.txt")
    options.add_argument("--batch", type=int, default=4)
    options.add_argument("--seq", type=int, default=96)
    options.add_argument("--repeats", type=int, default=3)
    args = options.parse_args()
    report = Transcript()

    loaded = load_model("bundled", device="cpu")
    model = loaded.model.train()
    ids, labels, mask = make_batch(loaded.tokenizer, args.batch, args.seq)
    with torch.no_grad():
        teacher_logprobs, teacher_ids = model(input_ids=ids).logits.log_softmax(-1).topk(TOP_K, -1)

    def hard() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=labels).loss.backward()

    def kd(tail: bool) -> Callable[[], None]:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits  # (B, T, V)
            topk_kl_loss(logits, teacher_ids, teacher_logprobs, mask, tail=tail).backward()

        return step

    report.print(f"bundled model on cpu (float32), {torch.get_num_threads()} CPU threads, batch "
                 f"{args.batch} x {args.seq} tokens, {int(mask.sum())} supervised, top-{TOP_K} teacher, "
                 f"median of {args.repeats} after a warm-up")
    t = median_seconds({"hard": hard, "kd": kd(False), "kd+tail": kd(True)}, args.repeats)
    report.print(f"{'step':<10}{'wall s':>8}{'/ hard':>8}{'CPU s':>8}{'/ hard':>8}")
    hard_wall, hard_cpu = t["hard"]
    for name, (wall, cpu) in t.items():
        report.print(f"{name:<10}{wall:>8.2f}{wall / hard_wall:>7.2f}x{cpu:>8.2f}{cpu / hard_cpu:>7.2f}x")
    ratio = t["kd"][0] / hard_wall
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    report.print(f"kd / hard (wall) = {ratio:.2f} (target <= {TARGET_RATIO}: {verdict})")
    write_result(args.out, report.lines)


if __name__ == "__main__":
    main()
