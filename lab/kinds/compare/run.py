"""Several models on the user's own questions: option probabilities and the generated answers.

FIRST's "Oslo or Helsinki" case study: ask each model the same questions and see not only what it
answers but how sure it is. With options, each model's probabilities over the option letters
(letter scoring, optionally temperature-scaled) and its greedy generated answer; without options,
the generated answer only. The generation's confidence is the product of its tokens'
probabilities (``sequence_prob``) and the probability of its first token (``first_token_prob``).

The same function serves the ``compare`` job and the inference lane (:mod:`lab.kinds.compare.lane`): both hand it
a :class:`lab.models.cache.ModelCache`, so each model is loaded once, every question of it is asked
while it is loaded, and adapters of one base share its weights. What it writes, ``compare.json``, and
how it is read back: :mod:`lab.kinds.compare.result`.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import numpy as np

from lab.calibration.temperature import scale
from lab.calibration.temperature_files import load_temperature
from lab.core.config import ConfigError
from lab.core.files import write_atomic
from lab.core.layout import COMPARE_FILE
from lab.data.record import MCQRecord
from lab.data.chat_templates import user_turn
from lab.data.templates import get_template
from lab.jobkit.worker import JobContext
from lab.kinds.compare.config import CompareConfig

if TYPE_CHECKING:  # the web server imports this module for its config, and never torch
    from lab.models.cache import ModelCache

def _generate(loaded, ids: list[int], max_new_tokens: int) -> tuple[dict[str, Any], Any]:
    """The greedy answer to the prompt ``ids``, and the log-probabilities (V,) of its first token: the
    distribution letter scoring reads, taken from the same forward pass instead of a second one."""
    import torch

    tok = loaded.tokenizer
    prompt = torch.tensor([ids], device=loaded.device)
    with torch.inference_mode():
        out = loaded.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                                    do_sample=False, output_logits=True, return_dict_in_generate=True,
                                    pad_token_id=tok.pad_token_id or tok.eos_token_id)
    new = out.sequences[0, len(ids):]
    steps = [torch.log_softmax(step[0].float(), -1) for step in out.logits]  # raw logits: no processor's edits
    logps = [float(step[t]) for step, t in zip(steps, new)]
    return ({"text": tok.decode(new, skip_special_tokens=True).strip(), "tokens": len(new),
             "sequence_prob": float(np.exp(sum(logps))) if logps else None,
             "first_token_prob": float(np.exp(logps[0])) if logps else None}, steps[0])


def _label(entry: dict[str, Any]) -> str:
    """The name a model is shown by: the user's, else model (+ adapter) (at T), so that two entries
    of one model at two temperatures never look alike."""
    if entry.get("label"):
        return entry["label"]
    temperature = entry.get("temperature")
    if temperature in (None, ""):
        at = ""
    else:
        at = f" at T = {temperature:g}" if isinstance(temperature, (int, float)) else f" at T = {Path(str(temperature)).name}"
    return entry["model"] + (f" + {Path(entry['adapter']).name}" if entry.get("adapter") else "") + at


def _ask(loaded, cfg: CompareConfig, label: str, log: Callable[[str], None]) -> list[dict]:
    """Every question of ``cfg`` to one loaded model: its answers, in order, option probabilities unscaled.

    With options, the model generates from exactly the tokens letter scoring reads, so one forward
    pass over the prompt gives both the option probabilities and the answer's first token."""
    from lab.models.batching import check_context, encode_prompts
    from lab.models.scoring import letter_option_ids, letter_score

    tokenizer, template, items = loaded.tokenizer, get_template(cfg.template), cfg.items()
    prompts = {i: template.render(MCQRecord(f"q{i}", q.strip(), tuple(o), 0, "user"), tokenizer)
               for i, (q, o) in enumerate(items) if o}
    encoded = dict(zip(prompts, encode_prompts(tokenizer, list(prompts.values()), "letter")))
    options = dict(zip(prompts, letter_option_ids(list(prompts.values()), list(encoded.values()))))
    ids = []
    for i, (question, _) in enumerate(items):
        if i in encoded:
            ids.append(list(encoded[i][0]))
        else:
            text, chat = user_turn(tokenizer, question.strip(), f"Question: {question.strip()}\nAnswer:")
            ids.append(tokenizer(text, add_special_tokens=not chat)["input_ids"])
    # Generation reads the most: the prompt and then every generated token. Checked on these
    # questions (a cheap extra tokenisation) before any forward pass of this model.
    check_context(loaded.model, tokenizer, [(f"question {i + 1} as prompted to {label}", len(x)) for i, x in enumerate(ids)],
                  remedy=f"Shorten the question or its options, lower max_new_tokens ({cfg.max_new_tokens}), or "
                         "compare models with a longer context.", reserve=cfg.max_new_tokens)
    answers = []
    for i, prompt_ids in enumerate(ids):
        if len(items) > 1:
            log(f"{label}: question {i + 1} of {len(items)}")
        generation, first = _generate(loaded, prompt_ids, cfg.max_new_tokens)
        answer: dict[str, Any] = {}
        if i in options:
            score = letter_score(first, options[i], tokenizer)
            answer.update(raw_probs=[float(p) for p in score.probs], option_mass=float(np.sum(score.vocab_probs)))
        answer["generation"] = generation
        answers.append(answer)
    return answers


def _at(answers: list[dict[str, Any]], temperature: Optional[float]) -> list[dict[str, Any]]:
    """A model's answers with its option probabilities scaled by ``temperature`` (None: as they are)."""
    scaled = []
    for answer in answers:
        if "raw_probs" in answer:
            raw = np.asarray(answer["raw_probs"])
            probs = scale(raw[None], temperature)[0] if temperature else raw
            answer = {**answer, "probs": [float(p) for p in probs], "prediction": int(np.argmax(probs)),
                      "confidence": float(np.max(probs))}
        scaled.append(answer)
    return scaled


def compare(cfg: CompareConfig, out: Path, log: Callable[[str], None] = print,
            cache: Optional[ModelCache] = None) -> dict[str, Any]:
    """Ask every model every question; writes and returns ``compare.json``.

    ``cache``: the models already loaded (the inference lane's); None loads them for this call,
    on ``cfg.device`` in ``cfg.dtype`` (with ``device_map: auto``, one at a time, spread out: :class:`_Placed`)."""
    if cache is not None and cfg.device_map != "none":
        raise ConfigError("device_map: the inference lane keeps each model whole on its device; to spread a model "
                          "over devices, submit a compare job")
    if cache is None and cfg.device_map != "none":
        cache = _Placed(cfg, out)
    elif cache is None:
        from lab.models.cache import ModelCache

        cache = ModelCache(cfg.device, cfg.dtype)
    start, results, asked = time.time(), [], {}
    for n, entry in enumerate(cfg.models, 1):
        label, key = _label(entry), (entry["model"], entry.get("adapter"))
        log(f"model {n} of {len(cfg.models)}: {label}")
        if key not in asked:  # one model at two temperatures is asked once: T only rescales its options
            with cache.use(*key, announce=log) as loaded:
                asked[key] = _ask(loaded, cfg, label, log)
        temperature = load_temperature(entry.get("temperature"))
        results.append({"label": label, "model": entry["model"], "adapter": entry.get("adapter"),
                        "temperature": temperature, "answers": _at(asked[key], temperature)})
    questions = [{"question": q, "options": o, **({"answer": a} if a is not None else {})}
                 for (q, o), a in zip(cfg.items(), cfg.answers())]
    report = {"questions": questions, "results": results,
              "template": cfg.template, "created": start, "seconds": round(time.time() - start, 3)}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / COMPARE_FILE, json.dumps(report, indent=2) + "\n")
    return report


class _Placed:
    """:meth:`ModelCache.use`'s part for ``device_map: auto``: each model loaded when asked, its layers spread as
    :func:`lab.models.loading.load_model` spreads them (an adapter merged first), and let go after, its offload
    folder in ``out`` deleted with it. Models larger than a GPU are not kept side by side."""

    def __init__(self, cfg: CompareConfig, out: Path) -> None:
        self.cfg, self.out = cfg, out

    @contextlib.contextmanager
    def use(self, model: str, adapter: Optional[str] = None,
            announce: Optional[Callable[[str], None]] = None) -> Iterator[Any]:
        from lab.models.loading import load_model
        from lab.models.placement import placed

        if announce:
            announce(f"loading {model} (device_map auto)")
        with placed(self.out, self.cfg) as placing:
            yield load_model(model, adapter=adapter, device=self.cfg.device, dtype=self.cfg.dtype, announce=announce,
                             **placing)


def run_job(cfg: CompareConfig, ctx: JobContext) -> dict[str, Any]:
    report = compare(cfg, ctx.run_dir, log=ctx.log)
    return {"models": len(report["results"]), "questions": len(report["questions"])}
