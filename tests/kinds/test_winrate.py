"""Win rate on preference pairs: the metric, the three data layouts, and the scores themselves."""
import json

import numpy as np
import pytest
import torch

from lab.data import DataError, hub_copy, load
from lab.data.preferences import PreferencePair, to_pair
from lab.kinds.cft.winrate import pair_prompt, score_pairs, win_rate


@pytest.mark.unit
def test_win_rate_by_hand():
    assert win_rate([-1.0, -5.0, -2.0, -3.0], [-2.0, -4.0, -2.0, -9.0]) == {"win_rate": 0.5, "ties": 0.25, "n": 4}
    with pytest.raises(ValueError, match="equal"):
        win_rate([1.0], [1.0, 2.0])


@pytest.mark.unit
def test_every_layout_gives_the_same_pair():
    plain = {"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go away."}
    messages = {"prompt": "Hi?",
                "chosen": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}],
                "rejected": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Go away."}]}
    no_prompt = {k: v for k, v in messages.items() if k != "prompt"}
    argilla = {"instruction": "Hi?", "chosen_response": "Hello.", "rejected_response": "Go away.", "chosen_avg_rating": 5}
    for row in (plain, messages, no_prompt, argilla):
        assert to_pair(row, "x") == PreferencePair("x", "Hi?", "Hello.", "Go away.")


@pytest.mark.unit
def test_shared_subset_loads_and_bad_rows_are_reported(shared_data, tmp_path):
    loaded = load("ultrafeedback", files=[str(shared_data / "ultrafeedback_binarized_subset" / "eval.jsonl")],
                  task="preferences")
    pairs, problems = loaded.records, loaded.problems
    # 200 rows, one of which has the same text as chosen and rejected: it cannot be won or lost.
    assert len(pairs) == 199 and len(problems) == 1 and "same text" in problems[0].reason
    bad = tmp_path / "pairs.jsonl"
    bad.write_text("\n".join([json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}), "{oops",
                              json.dumps({"prompt": "a", "chosen": "b"}), json.dumps({"prompt": "a", "chosen": "b", "rejected": "b"})]))
    loaded = load("ultrafeedback", files=[str(bad)], task="preferences")
    pairs, problems = loaded.records, loaded.problems
    assert len(pairs) == 1 and [p.line for p in problems] == [2, 3, 4]
    assert "rejected" in problems[1].reason and "same text" in problems[2].reason
    bad.write_text("{oops\n")
    with pytest.raises(DataError, match="No usable preference pairs"):
        load("ultrafeedback", files=[str(bad)], task="preferences")
    with pytest.raises(DataError, match="does not exist"):
        load("ultrafeedback", files=[str(tmp_path / "missing.jsonl")], task="preferences")


@pytest.mark.model
def test_scores_are_the_sequence_log_probabilities(bundled):
    tok, model = bundled.tokenizer, bundled.model
    pairs = [PreferencePair("a", "Name a colour.", "Blue.", "I like turtles very much indeed."),
             PreferencePair("b", "What is 2 + 2?", "2 + 2 = 4.", "Five.")]
    result = score_pairs(model, tok, pairs, max_response_tokens=None, batch_size=2)
    for pair, scored in zip(pairs, result["pairs"]):
        prompt = pair_prompt(tok, pair, None)
        context = tok(prompt.text, add_special_tokens=False)["input_ids"]
        for response, key in ((pair.chosen, "chosen"), (pair.rejected, "rejected")):
            full = tok(prompt.text + response, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
            expected = sum(float(logp[t - 1, full[t]]) for t in range(len(context), len(full)))
            assert scored[f"{key}_logprob"] == pytest.approx(expected, abs=2e-3)
            assert scored[f"{key}_tokens"] == len(full) - len(context)
    lp = np.array([[p["chosen_logprob"], p["rejected_logprob"]] for p in result["pairs"]])
    n = np.array([[p["chosen_tokens"], p["rejected_tokens"]] for p in result["pairs"]])
    assert result["win_rate"] == np.mean(lp[:, 0] > lp[:, 1])
    assert result["win_rate_norm"] == np.mean(lp[:, 0] / n[:, 0] > lp[:, 1] / n[:, 1])


@pytest.mark.model
def test_responses_are_cut_to_the_token_budget(bundled):
    pair = PreferencePair("a", "Say something.", "word " * 50, "other " * 50)
    prompt = pair_prompt(bundled.tokenizer, pair, 8)
    assert all(len(bundled.tokenizer(o, add_special_tokens=False)["input_ids"]) <= 9 for o in prompt.options)
    assert prompt.chat and prompt.text.endswith("assistant\n")


@pytest.mark.unit
def test_the_hub_default_is_argillas_layout(monkeypatch):
    """Without files the pairs come from argilla/ultrafeedback-binarized-preferences (a fake load_dataset)."""
    import datasets

    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return [{"instruction": "Hi?", "chosen_response": "Hello.", "rejected_response": "Go.", "chosen_avg_rating": 5.0},
                {"instruction": "Same?", "chosen_response": "x", "rejected_response": "x"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: True)
    loaded = load("ultrafeedback", task="preferences")
    pairs, problems = loaded.records, loaded.problems
    assert calls == [("argilla/ultrafeedback-binarized-preferences", "train")]
    assert pairs == [PreferencePair("train-0", "Hi?", "Hello.", "Go.")] and problems[0].line == 1
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DataError, match="cannot be reached"):
        load("ultrafeedback", task="preferences")
