"""Several models on one question of the user's: option probabilities and the generated answer.

FIRST's "Oslo or Helsinki" case study: ask each model the same question and see not only what it
answers but how sure it is. With options, each model's probabilities over the option letters
(letter scoring, optionally temperature-scaled) and its greedy generated answer; without options,
the generated answer only. The generation's confidence is the product of its tokens'
probabilities (``sequence_prob``) and the probability of its first token (``first_token_prob``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lab.config import ConfigMixin, doc, redeclare
from lab.data.record import MCQRecord
from lab.files import write_atomic
from lab.kinds import JobKind, register
from lab.layout import COMPARE_FILE
from lab.sections import AdaptedModel, DeviceSection, PromptSection
from lab.temperature import load_temperature, scale
from lab.templates import get_template, user_turn

MAX_MODELS = 4
MAX_QUESTION = 20_000  # characters; a longer prompt is over most models' context anyway
# The default asks FIRST's case-study question (a capital a model may confuse), so that the form runs as it
# opens; examples/compare-quick.yaml adds its options.
EXAMPLE_QUESTION = "What is the capital of Norway?"


@dataclass(kw_only=True)
class CompareModel(AdaptedModel):
    """One model of a comparison (an entry of ``CompareConfig.models``)."""

    model: str = redeclare(AdaptedModel, "model", required=True)

    temperature: Optional[str] = field(default=None, metadata=doc(
        "scale its option probabilities by T: a number, a temperature.json or its directory", role="temperature"))
    label: Optional[str] = field(default=None, metadata=doc("the name shown for it", role="text", max_len=200))


@dataclass
class CompareConfig(ConfigMixin, DeviceSection):
    question: str = field(default=EXAMPLE_QUESTION, metadata=doc("the question", role="text", max_len=MAX_QUESTION))
    options: list[str] = field(default_factory=list, metadata=doc("answer options (none: free text only)",
                                                                  role="text", max_len=MAX_QUESTION, max_items=26))
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"model": "bundled"}], metadata=doc(
        f"up to {MAX_MODELS} models: [{{model, adapter, temperature, label}}]", entries=CompareModel,
        max_items=MAX_MODELS))
    template: str = redeclare(PromptSection, "template", default="cft_chat", help="letter template for the options")
    max_new_tokens: int = field(default=48, metadata=doc("length of each generated answer", ge=1, le=512))

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError("question: must not be empty")
        if any(not o.strip() for o in self.options):
            raise ValueError(f"options: every option must be non-empty text, got {self.options!r}")
        if len(self.options) == 1:
            raise ValueError("options: give 2 to 26 options, or none for a free-text answer")
        if not self.models:
            raise ValueError(f"models: name 1 to {MAX_MODELS} models")
        for entry in self.models:
            load_temperature(entry.get("temperature"))
        if get_template(self.template).kind != "letter":
            raise ValueError(f"template: {self.template!r} is not a letter template")


def _generate(loaded, text: str, chat: bool, max_new_tokens: int) -> dict[str, Any]:
    import torch

    tok = loaded.tokenizer
    ids = tok(text, add_special_tokens=not chat, return_tensors="pt")["input_ids"].to(loaded.device)
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    new = out.sequences[0, ids.shape[1]:]
    logps = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new)]
    return {"text": tok.decode(new, skip_special_tokens=True).strip(), "tokens": len(new),
            "sequence_prob": float(np.exp(sum(logps))) if logps else None,
            "first_token_prob": float(np.exp(logps[0])) if logps else None}


def compare(cfg: CompareConfig, out: Path, log=print) -> dict[str, Any]:
    """Run every model on the question; writes and returns ``compare.json``."""
    from lab.models import load_model
    from lab.scoring import check_context, score_letter

    results = []
    question = cfg.question.strip()
    for entry in cfg.models:
        label = entry.get("label") or entry["model"] + (f" + {Path(entry['adapter']).name}" if entry.get("adapter") else "")
        log(f"loading {label}")
        loaded = load_model(entry["model"], adapter=entry.get("adapter"), device=cfg.device, dtype=cfg.dtype)
        item: dict[str, Any] = {"label": label, "model": entry["model"], "adapter": entry.get("adapter")}
        prompt = None
        if cfg.options:
            record = MCQRecord("question", question, tuple(cfg.options), 0, "user")
            prompt = get_template(cfg.template).render(record, loaded.tokenizer)
            text, chat = prompt.text, prompt.chat
        else:
            text, chat = user_turn(loaded.tokenizer, question, f"Question: {question}\nAnswer:")
        # Generation reads the most: the prompt and then every generated token. Checked on this
        # one question (a cheap extra tokenisation) before any forward pass of this model.
        n_tokens = len(loaded.tokenizer(text, add_special_tokens=not chat)["input_ids"])
        check_context(loaded.model, loaded.tokenizer, [(f"the question as prompted to {label}", n_tokens)],
                      remedy=f"Shorten the question{' or its options' if cfg.options else ''}, lower "
                             f"max_new_tokens ({cfg.max_new_tokens}), or compare models with a longer context.",
                      reserve=cfg.max_new_tokens)
        if prompt is not None:
            (score,) = score_letter(loaded.model, loaded.tokenizer, [prompt])
            temperature = load_temperature(entry.get("temperature"))
            probs = scale(score.probs[None], temperature)[0] if temperature else score.probs
            item.update(temperature=temperature, probs=[float(p) for p in probs],
                        raw_probs=[float(p) for p in score.probs], prediction=int(np.argmax(probs)),
                        option_mass=float(np.sum(score.vocab_probs)))
        item["generation"] = _generate(loaded, text, chat, cfg.max_new_tokens)
        results.append(item)
    report = {"question": cfg.question, "options": cfg.options, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / COMPARE_FILE, json.dumps(report, indent=2) + "\n")
    return report


def read_result(run_dir: Optional[str | Path]) -> Optional[dict[str, Any]]:
    path = Path(run_dir or "") / COMPARE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _run_job(cfg: CompareConfig, ctx) -> dict[str, Any]:
    report = compare(cfg, ctx.run_dir, log=ctx.log)
    return {"models": len(report["results"])}


register(JobKind(
    "compare", "2–4 models on one question: option probabilities and generated answers", CompareConfig, _run_job,
    outputs=(COMPARE_FILE,), key_fields=("question", "options", "models"),
))
