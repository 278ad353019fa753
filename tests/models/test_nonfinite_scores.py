"""Non-finite scores (issue 30, item 13): a question whose option scores are NaN or +inf, or −inf on
every option, has no probabilities; it is named, skipped and counted, and the rest are evaluated."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lab.core.errors import ScoringError
from lab.data.record import MCQRecord
from lab.data.templates import get_template
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import evaluate
from lab.models.batching import encode_prompts
from lab.models.scoring import letter_score, nonfinite_cause

INF, NAN = math.inf, math.nan
TOKENIZER = SimpleNamespace(decode=lambda ids: f"t{ids[0]}")  # all letter_score asks of a tokenizer


@pytest.mark.unit
@pytest.mark.parametrize("scores, cause", [
    ([0.0, NAN, -1.0], "NaN score on option B"),
    ([NAN, NAN], "NaN score on options A, B"),
    ([-2.0, INF, -1.0], "+inf score on option B"),
    ([INF, INF, NAN], "NaN score on option C"),  # NaN named first: it is undefined whatever the rest
    ([-INF, -INF, -INF], "-inf on every option"),
    ([-INF, -3.0], None),  # probability 0 for A, 1 for B: defined
    ([-1e30, 0.0], None),
])
def test_nonfinite_cause_hand(scores, cause):
    assert nonfinite_cause(np.array(scores)) == cause


@pytest.mark.unit
def test_letter_score_names_a_non_finite_question_and_keeps_a_finite_one():
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5, -INF])  # (V,): options are tokens 1, 2 and 4
    fine = letter_score(logits, [1, 2, 4], TOKENIZER)
    e = math.exp(1.0)  # softmax(1, 2, −inf) = (1, e, 0) / (1 + e)
    np.testing.assert_allclose(fine.probs, [1 / (1 + e), e / (1 + e), 0.0], atol=1e-7)
    assert fine.problem is None and fine.vocab_probs[2] == 0.0
    np.testing.assert_allclose(letter_score(torch.log_softmax(logits, -1), [1, 2, 4], TOKENIZER).probs, fine.probs,
                               atol=1e-7)  # log-probabilities give the same score: log_softmax is idempotent
    cases = {2: (INF, "+inf score on option B"), 1: (NAN, "NaN score on option A"),
             0: (INF, "NaN or +inf logit on a token that is not an option")}
    for token, (value, cause) in cases.items():
        bad = logits.clone()
        bad[token] = value
        score = letter_score(bad, [1, 2, 4], TOKENIZER)
        assert score.problem is not None and score.problem.startswith(cause)
        assert np.isnan(score.probs).all()  # what the old code would have written into the metrics
    never = torch.tensor([0.0, -INF, -INF, 1.0, 2.0])  # (V,) ≥ TOP_K tokens, as letter_score lists the top 5
    assert letter_score(never, [1, 2], TOKENIZER).problem == "-inf on every option"


# ---------------------------------------------------------------- end to end, with a real (tiny) model
QUESTIONS = [{"id": f"q{i}", "question": f"Question {i}: which {'POISON ' if i == 2 else ''}colour is the sky?",
              "choices": ["blue", "green"], "answer": i % 2} for i in range(1, 6)]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from lab.models.loading import load_model

    return load_model(str(tiny_model_dir), device="cpu")


def _setup(tiny, tmp_path, monkeypatch, scoring: str, marker: str):
    """An evaluation of QUESTIONS on the tiny model whose context pass puts +inf on option B's first
    token at the answer position of every question whose prompt holds ``marker``."""
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    cfg = EvalConfig(dataset="custom", data_files=[str(data)], scoring=scoring, model=str(tiny.path),
                     device="cpu", bootstrap=0)
    prompt = get_template(cfg.template).render(MCQRecord("x", "x", ("blue", "green"), 0, "custom"), tiny.tokenizer)
    (_, continuations), = encode_prompts(tiny.tokenizer, [prompt], scoring)
    option_b = continuations[1][0]
    forward = tiny.model.forward

    def poisoned(*args, **kwargs):
        out = forward(*args, **kwargs)
        if isinstance(kwargs.get("logits_to_keep"), int):  # the context pass, not cloze's continuation passes
            for row, ids in enumerate(kwargs["input_ids"].tolist()):
                if marker in tiny.tokenizer.decode(ids):
                    out.logits[row, -1, option_b] = INF  # an fp16 overflow
        return out

    monkeypatch.setattr(tiny.model, "forward", poisoned)
    monkeypatch.setattr("lab.models.loading.load_model", lambda *a, **k: tiny)
    return cfg


@pytest.mark.model
@pytest.mark.parametrize("scoring, cause", [("letter", "+inf score on option B"),
                                            ("cloze", "NaN score on options A, B")])  # log_softmax: inf − inf
def test_evaluate_skips_names_and_counts_a_non_finite_question(tiny, tmp_path, monkeypatch, scoring, cause):
    cfg = _setup(tiny, tmp_path, monkeypatch, scoring, "POISON")
    lines: list[str] = []
    result = evaluate(cfg, tmp_path / "run", log=lines.append)
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q3", "q4", "q5"]
    assert all(np.isfinite(r["probs"]).all() and r["confidence"] == max(r["probs"]) for r in rows)
    stored = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert stored["n"] == 4 and stored["n_skipped_rows"] == 1 and result["n"] == 4
    (skipped,) = stored["nonfinite_questions"]
    assert skipped["id"] == "q2" and skipped["cause"] == cause and skipped["where"].endswith("q.jsonl:2")
    assert stored["accuracy"] == pytest.approx(np.mean([r["correct"] for r in rows]))
    assert any("'q2'" in line and cause in line for line in lines), lines


@pytest.mark.model
def test_evaluate_refuses_when_every_question_is_non_finite(tiny, tmp_path, monkeypatch):
    cfg = _setup(tiny, tmp_path, monkeypatch, "letter", "colour")  # every question holds it
    with pytest.raises(ScoringError) as err:
        evaluate(cfg, tmp_path / "run", log=lambda line: None)
    message = str(err.value)
    assert "All 5 questions" in message and "'q1'" in message and "+inf score on option B" in message
    assert "float32" in message and "bfloat16" in message
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert not (tmp_path / "run" / "predictions.jsonl").exists()
