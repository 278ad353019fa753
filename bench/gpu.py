"""The lab on one GPU, in one call: FIRST and CFT end to end, evaluation parity, scoring and training speed, memory.

    python3 -m bench.gpu [--out bench/results] [--budget 360]   # one H100/H200: under 8 minutes
    python3 -m bench.gpu --small [--out DIR]                    # every section at toy sizes, on a CPU: 1-2 minutes
    python3 -m bench.gpu --only device_map fsdp                 # the sharding sections alone

Written for a lent GPU machine that has torch but neither the network nor the bundled GGUF, gradio
or datasets (docs/gpu-checklist.md says what to carry there): it imports nothing of the UI, and
every model is made from a config — the ``scratch`` model (:mod:`lab.models.scratch`, from the lab's
cache) and a Llama of the bundled model's kind (SmolLM2: tied embeddings, grouped-query attention,
SwiGLU) scaled to about 1 B parameters, random weights, with the scratch tokenizer. Each section is
printed and written to ``<out>/gpu_<device>.md`` as soon as it is done, so a call cut short keeps
what it finished; every section runs even when one before it failed (a GPU call is made once),
and the exit code is 1 if any failed. The figures only a GPU can give come first, and sections not
begun within ``--budget`` seconds are skipped, so that the run ends within about 8 minutes.

1. **Scoring throughput**: tokens/s of :mod:`lab.models.scoring`'s letter and cloze scorers on ARC-Easy
   with the ~1 B model, given the batches an evaluation plans, against a bare forward over the same
   batches: the scorer's own forward calls, each timed alone (synchronised before and after) in
   the same run, so the ratio is the share of the scorer's time that is the model's forward, and
   holds on a machine shared with other work (goal ≥ 0.9).
2. **Fine-tuning**: full and LoRA through the lab's trainer (``prepare_model`` and
   ``run_training``: its Trainer arguments and callbacks) on 512-token sequences of ARC text;
   tokens/s over the steps after warm-up, read from the job's own step events; MFU = 6·N·tokens/s
   over the GPU's peak dense bf16 FLOP/s (:data:`PEAK_BF16`; the 6N convention: attention's own
   FLOPs and LoRA's skipped weight gradients are not counted); the end-of-epoch checkpoint and the
   final save timed apart.
3. **Peak memory**: ``torch.cuda.max_memory_allocated`` over each fine-tune, less what was held
   before it, against pre-flight's estimate (:func:`jobs.preflight.plan`, which, like that counter,
   leaves out the CUDA context) and the estimate the worker reports at the longest example.
4. **first and cft end to end**: the controlled presets (examples/), shortened, each a config run
   by the lab's worker (:func:`lab.jobkit.worker.run`) in this process on the scratch model: succeeded or
   failed, with the error (and the log's last lines on stderr).
5. **Evaluation parity**: letter evaluations (:func:`lab.kinds.evaluate.run.evaluate`) of the same synthetic
   questions in fp32 and bf16: accuracy, ECE, the largest |Δp| and the answers that change, on the
   untrained scratch model (near-uniform confidences) and on the teacher FIRST trained in 4.
6. **Token tasks and a series** (run second, after the setup: the newest code paths): clm and facts
   evaluations of the ~1 B model in fp32 and bf16 (accuracy, ECE, the largest |Δ confidence|,
   targets/s), then a ``series`` job of three scratch sizes on two tasks through the worker, run
   twice in one run directory: the second must redo none of the first's cells.
7. **Alignment stages**: ``sft`` and ``dpo`` jobs (TRL's trainers through the worker), full and LoRA, on
   the ~1 B model and the bundled Alpaca rows and preference pairs: succeeded or failed, and each job's
   ``torch.cuda.max_memory_allocated`` against the worker's estimate and pre-flight's (DPO's doubled
   batch and reference model included).
8. **Clean exit**: child processes left, stopped if any (a device call waits for them).

Models larger than the GPU (:mod:`bench.gpu_sharded`, run right after the setup): **device_map** inference
against fp32 on the CPU, and **fsdp** training through the scheduler's own launch (sharded, resumed,
consolidated; offloaded under a memory cap). ``--only KEY …`` runs the named sections alone.
"""
from __future__ import annotations

import contextlib
import gc
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import psutil
import torch
import transformers

from bench import gpu_sharded
from bench._harness import RESULTS, Only, Timer, parser, preset, seed, sync, timed, write_result
from bench.gpu_sharded import table
from jobs import preflight
from lab import versions
from lab.core.errors import ModelLoadError
from lab.core.events import EventWriter, read_events
from lab.core.layout import (CELLS_DIR, CHECKPOINTS_DIR, DONE_FILE, EVENTS_FILE, MODEL_DIR, PREDICTIONS_FILE,
                             RESULT_FILE, SERIES_FILE)
from lab.core.yamlio import dump_yaml
from lab.data import load
from lab.data.templates import default_template, get_template
from lab.jobkit.worker import run as run_job
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import evaluate
from lab.models.loading import load_model, select_device
from lab.models.batching import Encoded, batch_tokens, encode_prompts, plan_batches, scored_length
from lab.models.scoring import score_cloze, score_letter
from lab.models.tokenizers import load_tokenizer
from lab.models.weights import SCRATCH, count_parameters, local_model_dir, size_text
from lab.training.config import TrainConfig
from lab.training.data import pad_batch
from lab.training.disk import folder_bytes
from lab.training.trainer import prepare_model, run_training

# Peak dense (no sparsity) bf16 tensor FLOP/s from NVIDIA's data sheets, by a part of what
# torch.cuda.get_device_name says; the first match counts, so the variants come before "H100".
PEAK_BF16 = (("H200", 989e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12))
# Requirements the bench's code paths never import (the UI's, the GGUF reader): a GPU image without
# them runs it all the same; any other unmet requirement stops it before the first section.
NOT_NEEDED = ("gradio", "plotly", "gguf")
SYNTHETIC = {"dataset": "synthetic", "data_files": ["bundled"]}
GIB = 1024**3
LOG_TAIL = 40  # lines of a failed job's log printed


@dataclass(frozen=True)
class Shape:
    """A Llama of the bundled model's kind; SmolLM2's vocabulary, of which the scratch tokenizer uses ~1,000 ids."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 49152


@dataclass(frozen=True)
class Sizes:
    """How much each section does: the GPU run's, or ``--small``'s toy sizes for a CPU."""

    shape: Shape
    parity_questions: int  # synthetic test questions per evaluation
    throughput_questions: int  # ARC-Easy validation questions
    eval_batch: int  # questions per forward pass (a GPU is given more than the evaluate default's 16)
    repeats: int  # timed scorer runs, median taken
    train_batch: int
    seq_len: int
    train_steps: int
    warmup_steps: int  # steps left out of tokens/s: allocation and kernel choice
    first: dict[str, Any]  # overrides of examples/first-controlled.yaml
    cft: dict[str, Any]  # ... and of examples/cft-controlled.yaml
    token_docs: int  # bundled texts for the clm evaluations (4 positions each)
    series_questions: int  # synthetic test questions per series cell
    align_rows: int  # bundled Alpaca rows (sft) and preference pairs (dpo) per alignment job
    align_batch: int  # ... and their batch size
    align_length: int  # ... and max_length: room for the chat template's system prompt and a response
    offload_shape: Shape  # the Llama of the FSDP section's offloaded run (bench/gpu_sharded.py)


def _shifted(limit: int) -> list[dict[str, Any]]:
    return [{**SYNTHETIC, "split": "shifted", "limit": limit}]


GPU_SIZES = Sizes(
    shape=Shape(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192),
    parity_questions=1000, throughput_questions=570, eval_batch=64, repeats=3,
    train_batch=16, seq_len=512, train_steps=24, warmup_steps=4, align_rows=32, align_batch=8, align_length=512,
    first={"teacher_epochs": 10, "train_limit": 200, "val_limit": 100, "test_limit": 200, "bootstrap": 100,
           "ood": _shifted(200), "training": {"epochs": 2}},
    cft={"in_domain": [{**SYNTHETIC, "split": "train", "limit": 600}], "train_size": 64, "val_size": 64,
         "test_size": 200, "ood": _shifted(200), "lambdas": [0.4], "preference_limit": 16, "bootstrap": 100,
         "training": {"epochs": 2}},
    token_docs=300, series_questions=500,
    offload_shape=Shape(hidden=2560, layers=24, heads=20, kv_heads=4, intermediate=6912),
)
SMALL_SIZES = Sizes(
    shape=Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256),
    parity_questions=24, throughput_questions=12, eval_batch=4, repeats=1,
    train_batch=2, seq_len=64, train_steps=6, warmup_steps=2, align_rows=4, align_batch=2, align_length=256,
    first={"teacher_epochs": 2, "train_limit": 16, "val_limit": 16, "test_limit": 16, "bootstrap": 10,
           "students": ["finetune", "first"], "ood": _shifted(16), "training": {"epochs": 1}},
    cft={"in_domain": [{**SYNTHETIC, "split": "train", "limit": 64}], "train_size": 16, "val_size": 16,
         "test_size": 16, "ood": _shifted(16), "methods": ["ts", "cft", "rcft"], "lambdas": [0.4],
         "preference_limit": 4, "bootstrap": 10, "training": {"epochs": 1}},
    token_docs=8, series_questions=16,
    offload_shape=Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256),
)


def peak_flops(device: torch.device) -> Optional[float]:
    """The GPU's peak dense bf16 FLOP/s (:data:`PEAK_BF16`); None on a CPU or a GPU not listed."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for part, peak in PEAK_BF16 if part in name), None)


def device_label(device: torch.device, small: bool) -> str:
    """``h100``, ``h200``, ``a100`` (else ``cuda``), or ``cpu``; ``-small`` for the toy sizes."""
    name = torch.cuda.get_device_name(device).lower() if device.type == "cuda" else "cpu"
    base = next((part for part in ("h200", "h100", "a100", "cpu") if part in name), "cuda")
    return f"{base}-small" if small else base


def make_llama(out: Path, shape: Shape, tokenizer, device: torch.device) -> int:
    """Write a seeded random-weight Llama of ``shape`` with ``tokenizer`` into ``out`` (bf16 on a GPU:
    half the bytes to write and read; the trainer loads it in the dtype it trains in); its parameters."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         intermediate_size=shape.intermediate, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    seed(0)
    with torch.device(device):  # initialised where it will run: seconds for 1 B weights, not a minute
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16 if device.type == "cuda" else torch.float32).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def free_memory() -> None:
    """Drop the last section's models before the next loads its own, and restart the peak counter."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


@contextlib.contextmanager
def forward_clock(model: torch.nn.Module) -> Iterator[list[float]]:
    """Seconds spent in ``model``'s forward calls (synchronised before and after each), in ``[0]``."""
    spent, started = [0.0], []

    def before(module: torch.nn.Module, args: Any) -> None:
        sync()
        started.append(time.perf_counter())

    def after(module: torch.nn.Module, args: Any, output: Any) -> None:
        sync()
        spent[0] += time.perf_counter() - started.pop()

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        yield spent
    finally:
        for handle in handles:
            handle.remove()


def tokens_read(encoded: Encoded, mode: str) -> int:
    """Tokens the model reads for one question: the prompt, and for cloze each option but its last token."""
    context, continuations = encoded
    return len(context) + (sum(len(c) - 1 for c in continuations) if mode == "cloze" else 0)


def packed_examples(tokenizer, n: int, seq_len: int) -> list[dict[str, Any]]:
    """``n`` training examples of exactly ``seq_len`` tokens, every one supervised: ARC-Easy's
    questions and options (the bundled validation split) as one token stream, cut and repeated.
    No padding, so tokens/s counts only tokens the model learns from."""
    records = load("arc_easy", "validation", ["bundled"]).records
    stream = tokenizer("\n\n".join(f"{r.question} {' '.join(r.choices)}" for r in records))["input_ids"]
    ids = (stream * (n * seq_len // len(stream) + 1))[:n * seq_len]
    return [{"input_ids": ids[i:i + seq_len], "labels": ids[i:i + seq_len]} for i in range(0, n * seq_len, seq_len)]


def timed_trainer(times: dict[str, Any]) -> type:
    """transformers' Trainer noting the seconds its checkpoints take (``_save_checkpoint``: weights,
    optimizer, scheduler and state, the same method in every 5.x) and a timer from when ``train`` returned."""
    from transformers import Trainer

    class TimedTrainer(Trainer):
        def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            timer = Timer()
            super()._save_checkpoint(*args, **kwargs)
            times["checkpoint"] = times.get("checkpoint", 0.0) + timer.seconds

        def train(self, *args: Any, **kwargs: Any) -> Any:
            result = super().train(*args, **kwargs)
            times["trained"] = Timer()
            return result

    return TimedTrainer


def job(run_dir: Path, config: dict[str, Any], again: bool = False) -> tuple[str, Optional[str], float, dict[str, Any]]:
    """Run ``config`` through the lab's worker in this process, its output (the Trainer prints its
    logs) in ``run_dir/log.txt``: (status, error, seconds, the ``done`` event's summary). ``again``:
    in the run directory of an earlier run of it, as a resumed job is."""
    run_dir.mkdir(parents=True, exist_ok=again)
    (run_dir / "config.yaml").write_text(dump_yaml(config))
    timer = Timer()
    with open(run_dir / "log.txt", "a" if again else "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            run_job(run_dir / "config.yaml", run_dir)
        except Exception:  # the worker re-raises a bug in the lab after writing result.json; keep its traceback
            traceback.print_exc()
    seconds = timer.seconds
    result_file = run_dir / RESULT_FILE
    result = json.loads(result_file.read_text()) if result_file.is_file() else {
        "status": "failed", "error": f"no {RESULT_FILE}; see {run_dir / 'log.txt'}"}
    if result["status"] != "succeeded":  # the run folder goes with the bench's temporary one: show the log's end
        print("".join((run_dir / "log.txt").read_text().splitlines(keepends=True)[-LOG_TAIL:]), file=sys.stderr)
    events, _ = read_events(run_dir / EVENTS_FILE)
    done = next((e for e in reversed(events) if e["stage"] == "done"), {})
    summary = {k: v for k, v in done.items() if k not in ("time", "stage")}
    return result["status"], result.get("error"), seconds, summary


class Bench:
    """The sections, in order, and what they hand on: FIRST's teacher to parity, the fine-tunes' memory."""

    def __init__(self, sizes: Sizes, work: Path, device: torch.device, scratch: Path) -> None:
        self.sizes, self.work, self.device, self.scratch = sizes, work, device, scratch
        self.peak = peak_flops(device)
        self.teacher: Optional[Path] = None
        self.trained: dict[str, dict[str, Any]] = {}
        self.big = work / "llama"
        self.n_params = 0  # set by setup, which makes the Llama

    def sections(self) -> list[tuple[str, str, Callable[[], list[str]]]]:
        """(``--only``'s key, title, section) in the order they run: the figures only a GPU gives first."""
        return [("setup", "Setup", self.setup),
                ("device_map", "device_map: a model spread over GPU and host memory, scored exactly",
                 lambda: gpu_sharded.device_map(self)),
                ("fsdp", "FSDP: a model larger than the GPU, trained sharded and offloaded", lambda: gpu_sharded.fsdp(self)),
                ("tokens", "Token tasks and a series", self.tokens_and_series),
                ("throughput", "Scoring throughput", self.throughput),
                ("finetuning", "Fine-tuning throughput and MFU", self.finetuning),
                ("memory", "Peak memory against pre-flight", self.memory),
                ("alignment", "Alignment stages: sft and dpo, peak memory against the estimates", self.alignment),
                ("end_to_end", "first and cft end to end", self.end_to_end),
                ("parity", "Evaluation parity, bf16 against fp32", self.parity),
                ("exit", "Clean exit", clean_exit)]

    def setup(self) -> list[str]:
        timer = Timer()
        self.n_params = self.make(self.big, self.sizes.shape)
        made_in = timer.seconds
        s, name = self.sizes.shape, (torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else
                                     f"CPU, {torch.get_num_threads()} threads")
        peak = f"{self.peak / 1e12:.0f} TFLOP/s dense bf16" if self.peak else "none known (MFU not computed)"
        return [f"- device: {name}; peak: {peak}",
                f"- python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
                f"transformers {transformers.__version__}",
                f"- scratch model (lab.models.scratch, from the lab's cache): {count_parameters(self.scratch):,} parameters",
                f"- Llama for throughput and fine-tuning: hidden {s.hidden}, {s.layers} layers, {s.heads} heads, "
                f"{s.kv_heads} KV heads, intermediate {s.intermediate}, vocabulary {s.vocab}, tied: "
                f"**{self.n_params:,} parameters** ({self.n_params / 1e9:.3f} B), random weights, made and saved in "
                f"{made_in:.1f} s"]

    def make(self, out: Path, shape: Shape) -> int:
        """A random-weight Llama of ``shape`` with the scratch tokenizer, written into ``out``; its parameters."""
        return make_llama(out, shape, load_tokenizer(str(self.scratch), SCRATCH), self.device)

    def end_to_end(self) -> list[str]:
        rows = []
        for kind, overrides in (("first", self.sizes.first), ("cft", self.sizes.cft)):
            config = preset(f"{kind}-controlled")
            config.update({**overrides, "training": {**config.get("training", {}), **overrides["training"]}})
            status, error, seconds, summary = job(self.work / kind, config)
            rows.append([f"`{kind}`", f"**{status}**", f"{seconds:.1f}", error or json.dumps(summary)])
            teacher = self.work / kind / "teacher" / MODEL_DIR
            if kind == "first" and status == "succeeded" and teacher.is_dir():
                self.teacher = teacher
        return table(["job", "status", "seconds", "error, or the done event"], rows) + [
            "", "Shortened presets (overrides of examples/*-controlled.yaml): "
                f"first {json.dumps(self.sizes.first)}; cft {json.dumps(self.sizes.cft)}."]

    def evaluation(self, model: Path, dtype: str, out: Path,
                   **extra: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """A letter evaluation of the synthetic test questions: its metrics, and its predictions by question id;
        ``extra``: more of the evaluation's fields (``device``, ``device_map`` …)."""
        cfg = EvalConfig.from_dict({"model": str(model), **SYNTHETIC, "split": "test", "scoring": "letter",
                                    "limit": self.sizes.parity_questions, "dtype": dtype, "bootstrap": 0, **extra})
        metrics = evaluate(cfg, out, log=lambda message: None)
        rows = (json.loads(line) for line in (out / PREDICTIONS_FILE).read_text().splitlines())
        return metrics, {row["id"]: row for row in rows}

    def parity(self) -> list[str]:
        models = [("scratch, untrained", self.scratch)] + ([("FIRST teacher, trained", self.teacher)]
                                                           if self.teacher else [])
        rows = []
        for label, model in models:
            (m32, p32), (m16, p16) = (self.evaluation(model, dtype, self.work / "parity" / label[:7] / dtype)
                                      for dtype in ("float32", "bfloat16"))
            shared = p32.keys() & p16.keys()
            delta = max(abs(a - b) for q in shared for a, b in zip(p32[q]["probs"], p16[q]["probs"]))
            changed = sum(p32[q]["pred"] != p16[q]["pred"] for q in shared)
            rows.append([label, len(shared), f"{m32['accuracy']:.4f} / {m16['accuracy']:.4f}",
                         f"{m32['ece']:.4f} / {m16['ece']:.4f}", f"**{delta:.2e}**", changed])
        template = default_template("synthetic", "letter")
        return table(["model", "questions", "accuracy fp32 / bf16", "ECE fp32 / bf16", "max abs Δp",
                      "answers changed"], rows) + [
            "", f"Letter scoring (template `{template}`) of the synthetic test split on {self.device}, each dtype "
                "loaded and evaluated by lab.kinds.evaluate.run."]

    def token_evaluation(self, task: str, dtype: str) -> tuple[dict[str, Any], dict[tuple[int, int], float]]:
        """A clm or facts evaluation of the Llama on the bundled texts: its metrics, and each target's confidence."""
        limit = {"clm": {"limit": self.sizes.token_docs, "positions": 4}, "facts": {}}[task]
        cfg = EvalConfig.from_dict({"model": str(self.big), "task": task, "data_files": ["bundled"], "dtype": dtype,
                                    "batch_size": self.sizes.eval_batch, "bootstrap": 0, **limit})
        out = self.work / "tokens" / task / dtype
        metrics = evaluate(cfg, out, log=lambda message: None)
        rows = (json.loads(line) for line in (out / PREDICTIONS_FILE).read_text().splitlines())
        return metrics, {(row["doc"], row["position"]): row["confidence"] for row in rows}

    def tokens_and_series(self) -> list[str]:
        """The token tasks in bf16 against fp32 on the GPU, then a series of three scratch sizes through
        the worker, run twice: the second run must redo no cell."""
        rows = []
        for task in ("clm", "facts"):
            (m32, c32), (m16, c16) = (self.token_evaluation(task, dtype) for dtype in ("float32", "bfloat16"))
            delta = max(abs(c32[key] - c16[key]) for key in c32.keys() & c16.keys())
            rows.append([task, m32["n"], f"{m32['accuracy']:.4f} / {m16['accuracy']:.4f}",
                         f"{m32['ece']:.4f} / {m16['ece']:.4f}", f"{delta:.2e}",
                         f"{m32['targets_per_second']:.0f} / {m16['targets_per_second']:.0f}"])
        lines = table(["task", "targets", "accuracy fp32 / bf16", "ECE fp32 / bf16", "max abs Δ confidence",
                       "targets/s fp32 / bf16"], rows)
        config = {"kind": "series", "axis": "params", "bootstrap": 100,
                  "models": [{"model": "scratch-xs"}, {"model": "scratch-s"}, {"model": SCRATCH}],
                  "tasks": [{**SYNTHETIC, "split": "test", "limit": self.sizes.series_questions, "scoring": "letter"},
                            {"task": "clm", "data_files": ["bundled"], "limit": self.sizes.token_docs}]}
        folder = self.work / "series"
        first = job(folder, config)
        finished = {p: p.stat().st_mtime_ns for p in folder.glob(f"{CELLS_DIR}/*/{DONE_FILE}")}
        again = job(folder, config, again=True)
        redone = sum(p.stat().st_mtime_ns != t for p, t in finished.items())
        cells = json.loads((folder / SERIES_FILE).read_text())["cells"]
        lines += ["", *table(["series run", "status", "seconds", "error, or the done event"],
                             [[label, f"**{status}**", f"{seconds:.1f}", error or json.dumps(summary)]
                              for label, (status, error, seconds, summary) in (("first", first), ("again", again))])]
        lines += ["", "| point | task | params | accuracy | ECE |", "|---|---|---|---|---|"]
        lines += [f"| {c['point']} | {c['task']} | {c['params']:,} | {c['accuracy']:.3f} | {c['ece']:.3f} |"
                  for c in cells[:6]]
        return lines + ["", f"The Llama (random weights) on the bundled texts, {self.sizes.token_docs} clm documents "
                            "at 4 positions each and the T-REx sample's entities, evaluated by lab.kinds.evaluate "
                            "in each dtype; then a series (lab.kinds.series) of scratch-xs, scratch-s and scratch on "
                            f"{self.sizes.series_questions} synthetic questions and the clm texts, through the worker, "
                            f"and again in the same run directory: {len(finished)} cells finished the first time, "
                            f"**{redone} of them redone** the second (goal 0)."]

    def throughput(self) -> list[str]:
        loaded = load_model(str(self.big))  # auto: bf16 on a GPU, fp32 on a CPU, as an evaluation loads it
        model, tok = loaded.model, loaded.tokenizer
        records = load("arc_easy", "validation", ["bundled"], limit=self.sizes.throughput_questions).records
        rows = []
        for mode, scorer in (("letter", score_letter), ("cloze", score_cloze)):
            prompts = [get_template(default_template("arc_easy", mode)).render(r, tok) for r in records]
            encoded = encode_prompts(tok, prompts, mode)
            batches = plan_batches([scored_length(e, mode) for e in encoded], self.sizes.eval_batch,
                                   batch_tokens(loaded.device))
            tokens = sum(tokens_read(e, mode) for e in encoded)

            def score() -> None:
                scorer(model, tok, prompts, batch_size=self.sizes.eval_batch, encoded=encoded, batches=batches)

            score()  # warm-up: the first calls allocate and pick kernels
            runs = []  # (wall, forward) seconds of one run: the share holds whatever else the machine does
            for _ in range(self.sizes.repeats):
                with forward_clock(model) as spent:
                    runs.append((timed(score), spent[0]))
            wall, forward = (statistics.median(run[k] for run in runs) for k in (0, 1))
            share = statistics.median(f / w for w, f in runs)
            rows.append([mode, len(records), len(batches), f"{tokens:,}", f"{tokens / wall:,.0f}",
                         f"{tokens / forward:,.0f}", f"**{share:.2f}×**"])
        return table(["scoring", "questions", "batches", "tokens read", "scorer tokens/s", "bare forward tokens/s",
                      "scorer / bare"], rows) + [
            "", f"ARC-Easy validation (bundled), the {self.n_params / 1e6:,.0f} M-parameter Llama in "
                f"{str(loaded.dtype).removeprefix('torch.')} on {loaded.device}, at most {self.sizes.eval_batch} "
                f"questions a batch, median of {self.sizes.repeats}. Goal: scorer / bare ≥ 0.9."]

    def finetune(self, method: str) -> dict[str, Any]:
        """One fine-tune of the ~1 B model through the lab's trainer: its speed, saves and memory."""
        free_memory()
        s = self.sizes
        values = {"model": str(self.big), "method": method, "epochs": 1, "batch_size": s.train_batch,
                  "max_length": s.seq_len, "learning_rate": 1e-5, "lr_scheduler": "constant", "warmup_ratio": 0.0,
                  "val_split": None}
        cfg = TrainConfig.from_dict(values)
        held = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None
        model, tok, device = prepare_model(cfg)
        examples = packed_examples(tok, s.train_batch * s.train_steps, s.seq_len)
        out, times = self.work / f"train-{method}", {}
        timer = Timer()
        with open(self.work / f"train-{method}.log", "w") as log, contextlib.redirect_stdout(log):
            run_training(timed_trainer(times), cfg, out, examples, model, tok, device, EventWriter(out / EVENTS_FILE),
                         "train", lambda: False, [], lambda batch: pad_batch(batch, tok.pad_token_id))
        wall, final_save = timer.seconds, times["trained"].seconds
        measured = torch.cuda.max_memory_allocated(device) - held if held is not None else None
        events = read_events(out / EVENTS_FILE)[0]
        stamps = [e["time"] for e in events if e["stage"] == "train" and "loss" in e][s.warmup_steps - 1:]
        tokens_per_s = s.train_batch * s.seq_len * (len(stamps) - 1) / (stamps[-1] - stamps[0])
        plans = preflight.plan("finetune", values)
        figures = {"tokens_per_s": tokens_per_s, "step": s.train_batch * s.seq_len / tokens_per_s, "wall": wall,
                   "mfu": 6 * self.n_params * tokens_per_s / self.peak if self.peak else None,
                   "checkpoint": times.get("checkpoint"), "checkpoint_bytes": folder_bytes(out / CHECKPOINTS_DIR),
                   "final_save": final_save, "held": held, "measured": measured,
                   "preflight": plans[0].memory if plans else None,
                   "worker": next((e["peak"] for e in events if e["stage"] == "memory"), None),
                   "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
        shutil.rmtree(out)  # a full fine-tune's checkpoint is 12 bytes a parameter: free the disk for the next
        return figures

    def finetuning(self) -> list[str]:
        rows = []
        for method in ("full", "lora"):
            f = self.trained[method] = self.finetune(method)
            mfu = f"**{f['mfu']:.1%}**" if f["mfu"] is not None else "n/a (no GPU peak)"
            rows.append([method, f"{f['trainable']:,}", f"{f['step']:.3f}", f"{f['tokens_per_s']:,.0f}", mfu,
                         f"{f['checkpoint']:.2f} s, {size_text(f['checkpoint_bytes'])}",
                         f"{f['final_save']:.2f} s", f"{f['wall']:.1f}"])
        s = self.sizes
        return table(["method", "trainable", "s/step", "tokens/s", "MFU (6N)", "checkpoint save", "final save",
                      "wall s"], rows) + [
            "", f"{s.train_batch} sequences × {s.seq_len} tokens a step, {s.train_steps} steps, tokens/s over the "
                f"steps after the first {s.warmup_steps}, from the job's step events; N = {self.n_params:,}. "
                "Full: fp32 weights under bf16 autocast on a GPU; LoRA r = 16 on every linear, frozen base in "
                "bf16 on a GPU. Goal: MFU ≥ 35 % for full bf16."]

    def alignment(self) -> list[str]:
        """sft and dpo jobs (TRL's trainers in the lab's loop), full and LoRA, on the ~1 B model: each
        job's peak against pre-flight and the worker's estimate, which count DPO's chosen and rejected
        halves and its reference model (:mod:`lab.training.estimates`)."""
        s, rows = self.sizes, []
        data = {"sft": {"dataset": "alpaca", "data_files": ["bundled"]}, "dpo": {"preferences": ["bundled"]}}
        for kind in ("sft", "dpo"):
            for method in ("full", "lora"):
                free_memory()
                values = {"kind": kind, "model": str(self.big), "method": method, **data[kind], "limit": s.align_rows,
                          "epochs": 1, "batch_size": s.align_batch, "max_length": s.align_length, "calibration": [],
                          "learning_rate": 1e-5, "bootstrap": 0}
                cuda = self.device.type == "cuda"
                held = torch.cuda.memory_allocated(self.device) if cuda else None
                if cuda:
                    torch.cuda.reset_peak_memory_stats(self.device)
                status, error, seconds, _ = job(self.work / f"{kind}-{method}", values)
                measured = torch.cuda.max_memory_allocated(self.device) - held if cuda else None
                events = read_events(self.work / f"{kind}-{method}" / EVENTS_FILE)[0]
                worker = next((e["peak"] for e in events if e["stage"] == "memory"), None)
                plans = preflight.plan(kind, values)
                estimate = plans[0].memory if plans else None
                rows.append([f"`{kind}` {method}", f"**{status}**", f"{seconds:.1f}",
                             f"{measured / GIB:.2f}" if measured else "n/a (no CUDA)",
                             f"{worker / GIB:.2f}" if worker else "none",
                             f"{worker / measured:.2f}" if worker and measured else "n/a",
                             f"{estimate / GIB:.2f}" if estimate else "none", error or ""])
                shutil.rmtree(self.work / f"{kind}-{method}", ignore_errors=True)
        return table(["job", "status", "seconds", "run's peak GiB", "worker's estimate GiB", "worker / peak",
                      f"pre-flight GiB (at {s.align_length} tokens)", "error"], rows) + [
            "", f"{s.align_rows} bundled rows (Alpaca for sft, preference pairs for dpo), batches of {s.align_batch}, "
                "one epoch, no calibration tasks (the training alone is measured). The worker's estimate is at the "
                "longest example the job has, pre-flight's at max_length: the run's peak is to be read against the "
                "worker's. Goal: within ±15 %."]

    def memory(self) -> list[str]:
        rows = []
        for method, f in self.trained.items():
            measured, estimate = f["measured"], f["preflight"]
            ratio = f"{estimate / measured:.2f}" if measured and estimate else "n/a"
            rows.append([method, f"{f['held'] / GIB:.2f}" if f["held"] is not None else "n/a",
                         f"{measured / GIB:.2f}" if measured else "n/a (no CUDA)",
                         f"{estimate / GIB:.2f}" if estimate else "none", ratio,
                         f"{f['worker'] / GIB:.2f}" if f["worker"] else "none"])
        return table(["method", "held before GiB", "run's peak GiB", "pre-flight GiB", "pre-flight / run's peak",
                      "worker's estimate GiB"], rows) + [
            "", "Run's peak: torch.cuda.max_memory_allocated over the run less what was allocated before it (the "
                "CUDA context is in neither, nor in the estimates). Goal: pre-flight within ±15 %."]


def clean_exit() -> list[str]:
    """Stop any child process this one left (a device call waits for every one), and say which."""
    children = psutil.Process().children(recursive=True)
    names = [f"{c.pid} {c.name()}" for c in children]
    for child in children:
        child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()
    return [f"- child processes left at the end: {', '.join(names) + ' (stopped here)' if names else 'none'}"]


def refused(device: torch.device, small: bool) -> Optional[str]:
    """Why the bench cannot run here, before any section begins (then exit 2), or None; makes the
    scratch model where the bundled tokenizer it copies is at hand."""
    unmet = [line for line in versions.problems() if line.split()[0] not in NOT_NEEDED]
    if unmet:
        return "\n".join(f"error: {line}" for line in unmet)
    if device.type != "cuda" and not small:
        return "error: no CUDA GPU here; the full sizes train a 1 B model. Run with --small on a CPU."
    if local_model_dir(SCRATCH) is None:
        from lab.models.scratch import default_model

        try:
            default_model()
        except ModelLoadError as e:
            return (f"error: the scratch model is not in the lab's cache and cannot be made here ({e}). Copy "
                    "models/scratch-synthetic from a machine's cache and point CALIBRATION_LAB_CACHE at its parent "
                    "(docs/gpu-checklist.md).")
    return None


def header(label: str, small: bool, seconds: float) -> list[str]:
    lines = [f"# GPU bench: {label}", "",
             f"{seconds:.0f} s in all (bench/gpu.py's docstring says what each section measures)."]
    if small:
        lines += ["", "**This is the small form**" + (": no GPU was available to the run, so every section ran at toy "
                  "sizes on a CPU" if label.startswith("cpu") else ", every section at toy sizes") +
                  ", to show that it works end to end; none of its speeds, MFU or memory figures says anything about "
                  "a GPU's. On one H100 or H200: `python3 -m bench.gpu` (under 8 minutes; docs/gpu-checklist.md says "
                  "how to run it on a lent machine)."]
    return lines


def main() -> int:
    options = parser(__doc__, out=RESULTS, out_help="folder of gpu_<device>.md", only=Only("SECTION", (
        "run only these sections (with the setup), by key: fsdp device_map tokens throughput finetuning memory "
        "alignment end_to_end parity; the file is then gpu_<device>-<keys>.md")))
    options.add_argument("--small", action="store_true", help="toy sizes: every section on a CPU in a minute or two")
    options.add_argument("--budget", type=float, default=360, help="seconds after which the sections not yet "
                         "begun are skipped (a device call is cut at its limit)")
    args = options.parse_args()
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" bars would fill the call's output
    device = select_device("auto")
    refusal = refused(device, args.small)
    if refusal:
        print(refusal, file=sys.stderr)
        return versions.USAGE_ERROR
    scratch = local_model_dir(SCRATCH)
    assert scratch is not None  # refused() made it, or said why it cannot
    timer = Timer()
    label = device_label(device, args.small)
    path = args.out / f"gpu_{label}{''.join('-' + key for key in args.only or ())}.md"
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        bench = Bench(SMALL_SIZES if args.small else GPU_SIZES, Path(tmp), device, scratch)
        sections = [(title, section) for key, title, section in bench.sections()
                    if not args.only or key in (*args.only, "setup", "exit")]
        done: list[str] = []
        for title, section in sections:
            begun = Timer()
            if begun.start - timer.start > args.budget and title != "Clean exit":
                lines = [f"skipped: the {args.budget:.0f} s budget (--budget) was spent"]
            else:
                try:
                    lines = section()
                except Exception as e:  # one GPU call: the other sections' figures are still worth having
                    traceback.print_exc()
                    failed = True
                    lines = [f"**failed**: {type(e).__name__}: {e}"]
            lines = [f"## {title}", "", *lines, "", f"({begun.seconds:.1f} s)", ""]
            print("\n".join(lines), flush=True)
            done += lines
            write_result(path, header(label, args.small, timer.seconds) + ["", *done])
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
