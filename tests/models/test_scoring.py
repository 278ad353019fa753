"""Scoring against a naive reference: one unpadded, uncached, full-logit forward per sequence."""
import json

import numpy as np
import pytest
import torch

from lab.core.errors import ScoringError
from lab.data.record import MCQRecord
from lab.data.templates import Prompt, get_template
from lab.models.batching import encode_prompts, split_pairs
from lab.models.scoring import score_cloze, score_letter
from lab.models.shared_opening import MIN_SHARED, plan_shared, shared_prefixes


def _naive_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (T, V)


@pytest.mark.model
@pytest.mark.parametrize("template", ["first", pytest.param("cft_chat", marks=pytest.mark.slow),
                                      pytest.param("mmlu", marks=pytest.mark.slow)])
def test_letter_matches_naive_forward_and_is_batch_invariant(bundled, arc_records, template):
    prompts = [get_template(template).render(r, bundled.tokenizer) for r in arc_records]
    batched = score_letter(bundled.model, bundled.tokenizer, prompts, batch_size=4)
    single = score_letter(bundled.model, bundled.tokenizer, prompts, batch_size=1)
    for prompt, b, s in zip(prompts, batched, single):
        np.testing.assert_allclose(b.probs, s.probs, atol=1e-4)
        context, conts = split_pairs(bundled.tokenizer, prompt, strict=True)
        logp = _naive_logprobs(bundled.model, context)[-1]  # (V,)
        ids = [c[0] for c in conts]
        np.testing.assert_allclose(b.vocab_probs, logp[ids].exp().numpy(), atol=1e-4)
        np.testing.assert_allclose(b.probs, torch.softmax(logp[ids], -1).numpy(), atol=1e-4)
        assert b.probs.sum() == pytest.approx(1.0, abs=1e-6)
        top_p = [p for _, p in b.top_tokens]
        assert len(top_p) == 5 and top_p == sorted(top_p, reverse=True)
        assert top_p[0] == pytest.approx(logp.exp().max().item(), abs=1e-4)


@pytest.mark.model
def test_letter_tokens_are_taken_in_context(bundled):
    record = MCQRecord("q", "Pick one.", ("x", "y"), 0, "custom")
    paren = score_letter(bundled.model, bundled.tokenizer, [get_template("first").render(record, None)])[0]
    colon = score_letter(bundled.model, bundled.tokenizer, [get_template("mmlu").render(record, None)])[0]
    tok = bundled.tokenizer
    assert paren.option_token_ids == [tok.convert_tokens_to_ids("A"), tok.convert_tokens_to_ids("B")]
    assert colon.option_token_ids == tok(" A B")["input_ids"]  # " A" after "Answer:", not "A"
    assert paren.option_token_ids != colon.option_token_ids


@pytest.mark.model
@pytest.mark.slow
def test_cloze_matches_naive_full_sequence_loglik(bundled, arc_records):
    prompts = [get_template("cloze_qa").render(r, None) for r in arc_records]
    scores = score_cloze(bundled.model, bundled.tokenizer, prompts, batch_size=3)
    for prompt, score in zip(prompts, scores):
        context, conts = split_pairs(bundled.tokenizer, prompt)
        for k, cont in enumerate(conts):
            logp = _naive_logprobs(bundled.model, context + cont)
            ref = sum(logp[len(context) - 1 + j, t].item() for j, t in enumerate(cont))
            assert score.logliks[k] == pytest.approx(ref, abs=2e-3)
            assert score.norm_logliks[k] == pytest.approx(ref / len(prompt.options[k].removeprefix(" ")), abs=1e-4)
            assert score.n_tokens[k] == len(cont)
        np.testing.assert_allclose(score.probs, torch.softmax(torch.tensor(score.logliks), 0).numpy(), atol=1e-6)
    single = score_cloze(bundled.model, bundled.tokenizer, prompts, batch_size=1)
    for a, b in zip(scores, single):
        np.testing.assert_allclose(a.logliks, b.logliks, atol=2e-3)


@pytest.mark.model
def test_cloze_handles_single_token_options(bundled):
    prompt = Prompt("The sky is", (" blue", " green"))
    score = score_cloze(bundled.model, bundled.tokenizer, [prompt])[0]
    logp = _naive_logprobs(bundled.model, bundled.tokenizer("The sky is")["input_ids"])[-1]
    expected = [logp[bundled.tokenizer(w)["input_ids"][0]].item() for w in (" blue", " green")]
    np.testing.assert_allclose(score.logliks, expected, atol=1e-4)
    assert score.probs[0] > score.probs[1]


@pytest.mark.model
def test_letter_refuses_options_sharing_a_first_token(bundled):
    with pytest.raises(ScoringError, match="share a first token"):
        score_letter(bundled.model, bundled.tokenizer, [Prompt("Answer:", (" yes indeed", " yes no"))])


@pytest.mark.model
def test_batch_size_must_be_positive(bundled):
    with pytest.raises(ValueError, match="batch_size"):
        score_letter(bundled.model, bundled.tokenizer, [Prompt("Q (", ("A", "B"))], batch_size=0)


# ---------------------------------------------------------------- the model's context


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """conftest's tiny model: it reads at most 512 tokens (its max_position_embeddings)."""
    from lab.models.loading import load_model

    return load_model(str(tiny_model_dir), device="cpu")


@pytest.mark.unit
def test_context_limit_takes_the_smaller_sane_bound():
    from types import SimpleNamespace

    from lab.models.batching import context_limit

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    assert context_limit(model, SimpleNamespace(model_max_length=int(1e30))) == (
        512, "the model's max_position_embeddings")  # 1e30: transformers' "no limit"
    assert context_limit(model, SimpleNamespace(model_max_length=256)) == (256, "its tokenizer's model_max_length")
    assert context_limit(SimpleNamespace(config=SimpleNamespace()), SimpleNamespace(model_max_length=None)) is None


@pytest.mark.model
@pytest.mark.parametrize("scoring", ["letter", "cloze"])
def test_a_question_past_the_context_is_refused_before_any_forward_pass(tiny, tmp_path, monkeypatch, scoring):
    from lab.data import DataError, load
    from lab.kinds.evaluate.config import EvalConfig
    from lab.kinds.evaluate.run import score_records

    path = tmp_path / "long.jsonl"
    rows = [{"id": "short", "question": "Is fire hot?", "choices": ["yes", "no"], "answer": 0},
            {"id": "long", "question": "Why? " * 600, "choices": ["yes", "no"], "answer": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records = load("custom", "test", [str(path)]).records
    monkeypatch.setattr(tiny.model, "forward", lambda *a, **k: pytest.fail("the model was run"))
    done = []
    with pytest.raises(DataError) as err:
        score_records(EvalConfig(dataset="custom", scoring=scoring), tiny, records, progress=done.append)
    message = str(err.value)
    assert message.startswith("1 of 2 questions do not fit in the model's context of 512 tokens "
                              "(the model's max_position_embeddings)")
    assert f"'long' at {path}:2: " in message and "'short'" not in message and "Shorten or remove" in message
    assert done == []


@pytest.mark.model
def test_compare_refuses_a_question_past_the_context_with_what_it_generates(tiny_model_dir, tmp_path, monkeypatch):
    from lab.data import DataError
    from lab.kinds.compare.config import CompareConfig
    from lab.kinds.compare.run import compare

    monkeypatch.setattr("lab.kinds.compare.run._generate", lambda *a, **k: pytest.fail("generation ran"))
    cfg = CompareConfig(question="Why? " * 400, options=["yes", "no"], models=[{"model": str(tiny_model_dir)}],
                        max_new_tokens=48, device="cpu")
    with pytest.raises(DataError, match="The question does not fit in the model's context of 512 tokens .* with "
                                        "the 48 tokens to generate after it: question 1 as prompted to .*lower "
                                        r"max_new_tokens \(48\)"):
        compare(cfg, tmp_path, log=lambda m: None)
    assert not (tmp_path / "compare.json").exists()


@pytest.mark.model
def test_cloze_scoring_names_the_cache_as_the_installed_transformers_does(tiny, capfd):
    """Issue 30: every cloze job's log carried transformers' FutureWarning ("`past_key_values` is
    deprecated and will be removed in version 5.40.0 …") and its notice ("… Use `cache` instead"):
    the options' continuation pass handed the question's cache over by its old name."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # a notice given earlier in this process is given again
    prompts = [Prompt("The capital of Norway is", (" Oslo in the north", " Bergen by the sea")),
               Prompt("Two and two make", (" four of them", " five or six"))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = score_cloze(tiny.model, tiny.tokenizer, prompts, batch_size=2)
    assert [w.message for w in caught if "past_key_values" in str(w.message)] == []
    assert "deprecated" not in capfd.readouterr().err
    np.testing.assert_allclose(scores[0].logliks, score_cloze(tiny.model, tiny.tokenizer, prompts[:1])[0].logliks,
                               atol=1e-4)  # the cache still carries the question: alone or batched, the same


# ---------------------------------------------------------------- an opening shared by several questions


@pytest.mark.unit
def test_shared_prefixes_group_questions_that_open_alike():
    """Two groups (a 70- and an 80-token opening), a question alone, and a question that is the whole opening of
    its group but for one token: each member keeps a token of its own after the shared part."""
    a, b = list(range(70)), list(range(100, 180))
    contexts = [a + [1, 2], b + [7], a + [3], list(range(500, 600)), b + [8, 9, 10], a]
    shared = shared_prefixes(contexts, min_shared=64)
    assert shared == {0: 69, 2: 69, 5: 69, 1: 80, 4: 80}  # `a` itself keeps its last token: the group shares 69
    assert shared_prefixes(contexts, min_shared=81) == {}
    assert shared_prefixes([a + [1]], min_shared=64) == {}  # one question shares nothing


@pytest.mark.unit
def test_plan_shared_never_mixes_groups_in_a_batch():
    a, b = list(range(70)), list(range(100, 180))
    encoded = [(a + [1], [[5]]), (b + [2], [[5]]), (a + [3, 4], [[5, 6]]), (list(range(300, 310)), [[5]]),
               (b + [9], [[5]])]
    batches, shared = plan_shared(encoded, "cloze", batch_size=8)
    assert sorted(sorted(batch) for batch in batches) == [[0, 2], [1, 4], [3]]
    assert shared == {0: 70, 2: 70, 1: 80, 4: 80}


@pytest.mark.model
def test_a_shared_opening_run_once_gives_the_same_log_likelihoods(tiny):
    """Few-shot questions share their examples: run once, the opening's cache serves every question of the
    batch, whose own parts differ in length (padding sits between the opening and each own part)."""
    shots = " ".join(f"Question: what comes after {i}? Answer: {i + 1}." for i in range(12))
    prompts = [Prompt(f"{shots} Question: {q} Answer:", options) for q, options in [
        ("what colour is the sky on a clear day?", (" blue", " green and yellow")),
        ("two and two?", (" four", " five", " twenty two")),
        ("what comes after 41 in the list of numbers that we counted before?", (" 42", " 40 or 43"))]]
    encoded = encode_prompts(tiny.tokenizer, prompts, "cloze")
    batches, shared = plan_shared(encoded, "cloze", batch_size=3)
    assert set(shared) == {0, 1, 2} and len(batches) == 1 and min(shared.values()) >= MIN_SHARED
    together = score_cloze(tiny.model, tiny.tokenizer, prompts, encoded=encoded, batches=batches, shared=shared)
    alone = [score_cloze(tiny.model, tiny.tokenizer, [p])[0] for p in prompts]
    for got, want in zip(together, alone):
        np.testing.assert_allclose(got.logliks, want.logliks, atol=1e-4)


@pytest.mark.model
def test_letter_scoring_runs_a_shared_opening_once_with_the_same_probabilities(tiny):
    shots = "\n".join(f"Question: {i} plus one? A. {i + 1} B. {i + 2}\nAnswer: A" for i in range(10))
    prompts = [Prompt(f"{shots}\nQuestion: {q} A. {a} B. {b}\nAnswer:", (" A", " B")) for q, a, b in [
        ("what colour is the sky on a clear day?", "blue", "green"), ("two and two?", "four", "five"),
        ("the largest planet of the solar system we live in?", "Jupiter", "Mars")]]
    encoded = encode_prompts(tiny.tokenizer, prompts, "letter")
    batches, shared = plan_shared(encoded, "letter", batch_size=3)
    assert set(shared) == {0, 1, 2} and len(batches) == 1
    together = score_letter(tiny.model, tiny.tokenizer, prompts, encoded=encoded, batches=batches, shared=shared)
    alone = [score_letter(tiny.model, tiny.tokenizer, [p])[0] for p in prompts]
    for got, want in zip(together, alone):
        np.testing.assert_allclose(got.vocab_probs, want.vocab_probs, atol=1e-5)
        np.testing.assert_allclose(got.probs, want.probs, atol=1e-5)
