"""What several test modules share that is not a fixture: builders of runs and models, waits, ports.

Fixtures live in conftest.py; a test module imports from here, never from another test module."""
from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

# ---------------------------------------------------------------- ports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the job system, with fake workers

FAKE = str(Path(__file__).with_name("fake_worker.py"))
CONFIG = {"kind": "evaluate", "model": "bundled", "dataset": "arc_challenge", "limit": 4}


def fake_launcher(modes: dict):
    """A launcher that runs ``fake_worker.py`` in the mode ``modes[job.id]`` instead of the lab's worker."""
    return lambda job, launch: [sys.executable, FAKE, job.run_dir, modes[job.id]]


def imported_by(code: str, packages: set[str]) -> set[str]:
    """Which of ``packages`` (top-level names) a fresh ``python -c code``, run from the checkout, has imported by its
    end: what a job pays at start-up, which this test process, having imported everything, cannot show."""
    probe = f"{code}\nimport sys; print(' '.join({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    return set(done.stdout.split())


def wait_for(predicate, timeout: float = 20.0, step: float = 0.05, tick=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick:
            tick()
        if predicate():
            return True
        time.sleep(step)
    raise AssertionError("condition not reached in time")


# ---------------------------------------------------------------- evaluation runs, written without a model


def row(i, probs, answer, **extra):
    """One line of predictions.jsonl: question ``i`` answered with ``probs``."""
    pred = int(np.argmax(probs))
    return {"id": f"q{i}", "question": f"question {i}?", "choices": [f"choice {j}" for j in range(len(probs))],
            "answer": answer, "probs": probs, "pred": pred, "confidence": max(probs), "correct": pred == answer,
            **extra}


def write_eval(directory, rows, mtime=None, **info):
    """A run directory as lab.kinds.evaluate.run writes it: metrics.json plus predictions.jsonl."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = {"n": len(rows), "accuracy": 0.5, "ece": 0.1, "cw_ece": 0.05, "nll": 1.0, "trust": 0.4,
            "model": "bundled", "dataset": "arc_challenge", "split": "test", "scoring": "letter", "temperature": None}
    (directory / "metrics.json").write_text(json.dumps({**base, **info}))
    if mtime is not None:
        os.utime(directory / "metrics.json", (mtime, mtime))
    return directory


def overconfident_rows(seed: int, n: int, start: int) -> list[dict]:
    """``n`` over-confident 4-option answers (logits sharpened ×3 against the labels' distribution)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        z = rng.normal(size=4)
        answer = int(rng.choice(4, p=np.exp(z) / np.exp(z).sum()))
        probs = np.exp(3 * z) / np.exp(3 * z).sum()
        pred = int(np.argmax(probs))
        rows.append({"id": f"q{start + i}", "question": f"question {start + i}", "choices": ["a", "b", "c", "d"],
                     "answer": answer, "probs": probs.tolist(), "pred": pred, "confidence": float(probs[pred]),
                     "correct": pred == answer})
    return rows


# (name, split, seed, questions, first question's number)
RUNS = (("val", "validation", 0, 400, 0), ("test", "test", 1, 400, 10_000), ("small", "test", 2, 120, 20_000))


def write_runs(root, which=RUNS) -> None:
    """A validation and a test run of one over-confident model on distinct questions, and a small run,
    written by the lab's own writer."""
    from lab.kinds.evaluate.config import EvalConfig
    from lab.kinds.evaluate.run import write_evaluation

    for name, split, seed, n, start in which:
        write_evaluation(root / name, overconfident_rows(seed, n, start),
                         EvalConfig(model="bundled", dataset="obqa", split=split, bootstrap=50), {"model": "bundled"})


# ---------------------------------------------------------------- a teacher's top-k


def random_topk(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted-descending top-k rows (n, k) holding 0.5 to 1 of the mass, some entries 0."""
    rng = np.random.default_rng(seed)
    p = -np.sort(-rng.dirichlet(np.full(k, 0.5), size=n), axis=1) * rng.uniform(0.5, 1, (n, 1))
    p[: n // 4, -1] = 0.0
    return p


# ---------------------------------------------------------------- tiny models

# The tiny model directory (conftest's ``tiny_model_dir``): lab.models.scratch's machinery with a
# small tokenizer, a byte-level BPE of TINY_VOCAB tokens trained on the renderings of TINY_RECORDS
# (the controlled task's prompts and ARC-Easy's, so that English takes few tokens and each of the
# letters A–E is one), and 2 layers of width 32: about 40 k parameters, of which the embedding is half (with the
# bundled 49,152-token vocabulary it was 98 %). Its context is 512 tokens (max_position_embeddings).
TINY_VOCAB = 600
TINY_RECORDS = (("synthetic", "train", 200), ("arc_easy", "validation", None))  # (dataset, split, limit), bundled files


def tiny_config(**dims):
    """The tiny model's ScratchConfig; ``dims`` (hidden=128, …) change it for a test that needs another size."""
    from lab.models.scratch import ScratchConfig

    return ScratchConfig(**{"vocab_size": TINY_VOCAB, "hidden": 32, "intermediate": 64, **dims})


def tiny_records() -> list:
    from lab.data import load

    return [record for dataset, split, limit in TINY_RECORDS
            for record in load(dataset, split, ["bundled"], limit=limit).records]


def make_tiny_model(out: Path, **dims) -> Path:
    """Write the tiny model and its tokenizer into ``out`` (seeded: the same every time); ``out``.
    ``dims`` change its ScratchConfig (the tokenizer stays the same)."""
    from lab.models.scratch import create

    return create(Path(out), tiny_records(), tiny_config(**dims))


# An in-memory Llama with no tokenizer, for code that takes token ids (the top-k store): its vocabulary
# is VOCAB ids, which the store tests count on.
VOCAB = 300


def tiny_llama(attention_dropout: float = 0.0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.2, attention_dropout=attention_dropout)
    return LlamaForCausalLM(config).eval()


def two_option_rows(pairs):
    """Evaluation rows from (probability of option A, answer) pairs, as lab.kinds.evaluate.run writes them."""
    rows = []
    for i, (p, answer) in enumerate(pairs):
        probs = [p, 1 - p]
        pred = int(np.argmax(probs))
        rows.append({"id": f"q{i}", "question": f"Question {i}?", "choices": ["a", "b"], "answer": answer,
                     "probs": probs, "pred": pred, "confidence": max(probs), "correct": pred == answer})
    return rows


# ---------------------------------------------------------------- a series, run in this process

# Two tasks a tiny model does in a second each: the controlled task (multiple choice, with its
# oracle) and next-token prediction on the bundled texts.
SERIES_TASKS = ({"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 40,
                 "scoring": "letter"},
                {"task": "clm", "data_files": ["bundled"], "limit": 20})
SERIES_SIZES = ((32, 2), (64, 2), (128, 3))  # (width, layers) of three tiny models: about 40 K, 120 K, 570 K parameters


def tiny_models(root: Path, sizes=SERIES_SIZES) -> list[Path]:
    """Tiny models of growing size (the tokenizer alike), one folder each under ``root``."""
    return [make_tiny_model(root / f"w{width}-l{layers}", hidden=width, intermediate=2 * width, layers=layers)
            for width, layers in sizes]


def run_series(run_dir: Path, models, tasks=SERIES_TASKS, **fields) -> dict:
    """A ``series`` job over ``models`` (folders) and ``tasks``, run in this process as the worker runs it,
    into ``run_dir``; its summary. Bootstrap 100 and the CPU: a few seconds for three tiny models."""
    from lab.jobkit.kinds import parse_config
    from lab.jobkit.worker import JobContext
    from lab.kinds.series.run import run_job

    _, cfg = parse_config({"kind": "series", "models": [{"model": str(m)} for m in models], "tasks": list(tasks),
                           "bootstrap": 100, "device": "cpu", **fields})
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return run_job(cfg, JobContext(Path(run_dir)))


def table_model(table, max_positions: int = 64, **config):
    """A Llama whose next-token logits after token t are exactly ``table[t]`` (V, V), whatever came before.

    Embedding of t: sqrt(H)·e_t (RMS 1, so the final RMSNorm with eps 0 leaves it unchanged); every
    block's output projections are zero, so the residual stream is that embedding; the LM head's column
    t is table[t] / sqrt(H). Logits = head · sqrt(H)·e_t = table[t]. ``config``: more LlamaConfig fields
    (special token ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    v = table.shape[0]
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=v, hidden_size=v, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=max_positions, rms_norm_eps=0.0, tie_word_embeddings=False,
        **config)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(v) * v ** 0.5)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(torch.tensor(table.T / v ** 0.5, dtype=torch.float32))
    return model


WANDB_BLOCK = 32_768  # W&B's run file is a LevelDB-style log: 32 KiB blocks of records, each with a 7-byte header
WANDB_FULL, WANDB_LAST = 1, 4  # a record whole in one chunk, or its last chunk (2 and 3: first and middle)


def wandb_history(folder: Path) -> list[dict[str, Any]]:
    """Every ``history`` row (a ``wandb.log`` call) of the one offline W&B run under ``folder``, as
    {key: value}, read from its ``run-*.wandb`` file: a 7-byte file header, then per chunk CRC (4 bytes),
    length (2, little-endian) and type (1), chunks never crossing a 32 KiB block (its tail padded).
    Read here rather than by wandb itself, which since its Go core offers no reader of offline runs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    (file,) = Path(folder).glob("wandb/offline-run-*/run-*.wandb")
    data = file.read_bytes()
    assert data[:4] == b":W&B", f"{file}: not a W&B run file"
    position, pending, rows = 7, b"", []
    while position + 7 <= len(data):
        left = WANDB_BLOCK - position % WANDB_BLOCK
        _, length, kind = struct.unpack("<IHB", data[position:position + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length, kind) == (0, 0):  # the block's padding
            position += left
            continue
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (WANDB_FULL, WANDB_LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def form_values(kind: str, **changes: Any) -> list:
    """The Launch form's widget values for ``kind``: its defaults, with ``changes`` typed into their fields."""
    from ui import forms

    names = [f.name for f in forms.fields(kind)]
    values = forms.preset_values(kind, None)
    for name, text in changes.items():
        values[names.index(name)] = text
    return values


def write_token_run(directory: Path, n: int = 40, vocab: int = 30, k: int = 5, seed: int = 0) -> None:
    """A clm run as the scorer writes it, over a random vocabulary of ``vocab`` logits per target:
    its top ``k`` tokens, the rest mass, the target's logit and log Z at every temperature of the grid."""
    from scipy.special import logsumexp, softmax

    from lab.calibration.token_temperature import TOKEN_GRID

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        z = rng.normal(0.0, 3.0, vocab)
        p, top, target = softmax(z), np.argsort(-z)[:k], int(rng.integers(vocab))
        rows.append({"i": i, "target_id": target, "top_ids": top.tolist(), "top_probs": p[top].tolist(),
                     "rest": float(1 - p[top].sum()), "confidence": float(p[top[0]]),
                     "correct": bool(top[0] == target), "top_logits": z[top].tolist(), "target_logit": float(z[target]),
                     "log_z": [float(logsumexp(z / t)) for t in TOKEN_GRID], "sum_sq": float((p ** 2).sum())})
    directory.mkdir(parents=True)
    (directory / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    accuracy = float(np.mean([r["correct"] for r in rows]))
    (directory / "metrics.json").write_text(json.dumps({
        "task": "clm", "n": n, "accuracy": accuracy, "ece": 0.1, "temperature_grid": TOKEN_GRID.tolist(),
        "model": "bundled", "dataset": "text", "split": "test"}))


SERIES_TASK = {"key": "t0-mcq", "task": "mcq", "dataset": "synthetic", "split": "test",
               "label": "mcq · synthetic/test"}


def _series_cell(i: int) -> dict:
    ece, acc = 0.05 + 0.02 * i, 0.4 + 0.1 * i
    return {"task": SERIES_TASK["key"], "entry": i, "point": f"m{i}", "stage": None, "seed": None, "step": None,
            "params": 10 ** (6 + i), "model": f"m{i}", "adapter": None, "revision": None, "n": 10,
            "accuracy": acc, "accuracy_low": acc - 0.05, "accuracy_high": acc + 0.05, "ece": ece,
            "ece_low": ece - 0.02, "ece_high": ece + 0.03, "oracle_ece": None,
            "run": f"00003-series/cells/m{i}_t0-mcq"}


def write_series(root: Path, points: int) -> Path:
    """``root/00003-series``: a series over model size on one task with ``points`` cells done, each with its
    evaluation (no model: the written files a finished series leaves)."""
    from lab.results import series

    directory = root / "00003-series"
    directory.mkdir(parents=True, exist_ok=True)
    cells = [_series_cell(i) for i in range(points)]
    for cell in cells:
        if not (root / cell["run"]).is_dir():
            write_eval(root / cell["run"], [row(i, [0.7, 0.3], i % 2) for i in range(10)], dataset="synthetic")
    series.write(directory, series.document("params", [SERIES_TASK], cells))
    return directory


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def script_module(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module, to call its functions in this process: scripts/ is not a package, so
    it is on the path only while importing."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
