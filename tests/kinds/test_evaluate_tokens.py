"""The token tasks of ``evaluate`` end to end (clm, facts): the config, the rows against an independent
re-tokenisation, metrics.json against lab.calibration.metrics on the same arrays, bad input."""
import json
import math
import re
import shutil

import numpy as np
import pytest

from lab.calibration import metrics
from lab.core.errors import DataError
from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate.run import evaluate
from lab.models.tokenizers import load_tokenizer
from lab.results.predictions import load_predictions, require_options

TEXT = ("The quick brown fox jumps over the lazy dog while the farmer watches from the gate.\n\n"
        "Rain fell on the hills all night, and by morning the river had risen over the old stone bridge.\n\n"
        "Hi.\n")
FACTS = [{"text": "Paris is the capital of France.", "entities": [[0, 5], [24, 30]]},
         {"text": "The Danube flows through Vienna and Budapest.", "entities": [[4, 10], [25, 31], [36, 44]]}]


def _run(tmp_path, tiny_model_dir, **values):
    _, cfg = parse_config({"kind": "evaluate", "model": str(tiny_model_dir), "bootstrap": 50, **values})
    out = tmp_path / "run"
    result = evaluate(cfg, out, log=lambda m: None)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return cfg, result, rows, json.loads((out / "metrics.json").read_text())


@pytest.mark.unit
def test_a_token_task_takes_its_own_dataset_and_split_and_refuses_what_cannot_feed_it():
    _, cfg = parse_config({"kind": "evaluate", "task": "clm"})
    assert (cfg.dataset, cfg.split, cfg.template) == ("text", "test", "plain")
    _, cfg = parse_config({"kind": "evaluate", "task": "facts", "dataset": "synthetic", "split": "validation"})
    assert (cfg.dataset, cfg.split) == ("synthetic", "validation")  # only the multiple-choice defaults change
    with pytest.raises(Exception, match=r"dataset: 'arc_challenge' cannot feed task facts"):
        parse_config({"kind": "evaluate", "task": "facts", "dataset": "arc_challenge"})
    with pytest.raises(Exception, match=r"template: 'cloze_qa' is a cloze template"):
        parse_config({"kind": "evaluate", "task": "clm", "template": "cloze_qa"})
    with pytest.raises(Exception, match=r"^positions: "):
        parse_config({"kind": "evaluate", "task": "clm", "positions": 0})


@pytest.mark.model
def test_clm_rows_are_the_texts_tokens_and_metrics_are_recomputable(tmp_path, tiny_model_dir):
    data = tmp_path / "texts.txt"
    data.write_text(TEXT)
    cfg, result, rows, saved = _run(tmp_path, tiny_model_dir, task="clm", data_files=[str(data)], positions=3,
                                    min_context=4, seed=7)
    tokenizer = load_tokenizer(str(tiny_model_dir), str(tiny_model_dir))
    documents = TEXT.strip().split("\n\n")
    assert {r["doc"] for r in rows} == {0, 1} and len(rows) == 6  # "Hi." has no 4 tokens of context
    assert result["n_skipped_rows"] == 1
    for row in rows:
        ids = tokenizer(documents[row["doc"]])["input_ids"]  # the independent re-tokenisation
        assert row["target_id"] == ids[row["position"]] and row["position"] >= 4
        assert row["correct"] == (row["pred_id"] == row["target_id"])
        assert row["confidence"] == pytest.approx(row["top_probs"][0]) and row["pred_id"] == row["top_ids"][0]
        assert row["rest"] == pytest.approx(1 - sum(row["top_probs"]), abs=1e-9)
        assert documents[row["doc"]].endswith(row["context"] + documents[row["doc"]][len(row["context"]):])
    conf = np.array([r["confidence"] for r in rows])
    correct = np.array([r["correct"] for r in rows])
    assert saved["accuracy"] == pytest.approx(correct.mean())
    assert saved["ece"] == pytest.approx(metrics.ece(conf, correct, cfg.bins, edges=cfg.bin_edges))
    assert saved["nll"] == pytest.approx(-np.mean([math.log(r["target_prob"]) for r in rows]))
    # Brier over the whole vocabulary (tests/calibration/test_token_brier.py checks sum_sq against the model's logits).
    assert saved["brier"] == pytest.approx(np.mean([r["sum_sq"] - 2 * r["target_prob"] + 1 for r in rows]))
    assert saved["cw_ece"] is None and "not reported for token tasks" in saved["cw_ece_note"]
    assert saved["ece_ci_low"] <= saved["ece"] <= saved["ece_ci_high"]
    again = _run(tmp_path / "again", tiny_model_dir, task="clm", data_files=[str(data)], positions=3, min_context=4,
                 seed=7)[2]
    assert [(r["doc"], r["position"]) for r in again] == [(r["doc"], r["position"]) for r in rows]  # seeded


@pytest.mark.model
def test_facts_target_each_entitys_first_token(tmp_path, tiny_model_dir):
    data = tmp_path / "facts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in FACTS))
    _, result, rows, saved = _run(tmp_path, tiny_model_dir, task="facts", data_files=[str(data)])
    tokenizer = load_tokenizer(str(tiny_model_dir), str(tiny_model_dir))
    # "Paris" opens the first text: the text is read from the model's BOS token, which predicts it.
    assert [(r["doc"], r["entity"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert saved["n_skipped_entities"] == 0 and saved["skipped_entities"] == []
    for row in rows:
        text = FACTS[row["doc"]]["text"]
        start, end = FACTS[row["doc"]]["entities"][row["entity"]]
        enc = tokenizer(text, return_offsets_mapping=True)  # adds no BOS: the run's tokens are BOS and these
        token_start, token_end = enc["offset_mapping"][row["position"] - 1]
        assert enc["input_ids"][row["position"] - 1] == row["target_id"]
        assert token_start <= start < token_end  # the token holding the entity's first character
        assert row["context"] == text[:token_start]


def _bundled_entities() -> int:
    from lab.data import load

    return sum(len(r.entities) for r in load("trex", "test", ["bundled"], task="facts").records)


@pytest.mark.model
def test_every_entity_of_the_bundled_facts_data_is_scored_or_named_as_skipped(tmp_path, tiny_model_dir):
    _, result, rows, saved = _run(tmp_path, tiny_model_dir, task="facts", dataset="trex", data_files=["bundled"],
                                  split="test")
    assert len(rows) + saved["n_skipped_entities"] == _bundled_entities() and saved["n_skipped_targets"] == 0
    assert any(r["position"] == 1 for r in rows)  # an entity opening its sentence, predicted from BOS
    # A tokenizer without a BOS token: each entity that opens its sentence is counted and named, file:line.
    no_bos = tmp_path / "no_bos"
    shutil.copytree(tiny_model_dir, no_bos)
    config = json.loads((no_bos / "tokenizer_config.json").read_text())
    (no_bos / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": None}))
    logged = []
    _, cfg = parse_config({"kind": "evaluate", "model": str(no_bos), "task": "facts", "dataset": "trex",
                           "data_files": ["bundled"], "split": "test", "bootstrap": 0})
    result = evaluate(cfg, tmp_path / "run2", log=logged.append)
    opening = [s for s in result["skipped_entities"] if "has no BOS token" in s]
    assert opening and result["n_skipped_entities"] == len(result["skipped_entities"]) >= len(opening)
    assert result["n"] + result["n_skipped_entities"] == _bundled_entities()
    assert re.match(r"trex/test\.jsonl:\d+: entity 0 '", opening[0].split("bundled/")[-1])
    assert any(f"skipped {result['n_skipped_entities']} entities" in line for line in logged)


@pytest.mark.model
def test_the_controlled_tasks_statements_carry_the_oracle(tmp_path, tiny_model_dir):
    _, result, rows, saved = _run(tmp_path, tiny_model_dir, task="facts", dataset="synthetic", data_files=["bundled"],
                                  limit=40)
    assert len(rows) == 40 and saved["oracle"]["accuracy"] > 0.5
    assert saved["ece_gap_to_oracle"] == pytest.approx(saved["ece"] - saved["oracle"]["ece"])


@pytest.mark.model
def test_bad_token_input_is_said_and_nothing_else_is_lost(tmp_path, tiny_model_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="empty.txt"):
        _run(tmp_path, tiny_model_dir, task="clm", data_files=[str(empty)])
    short = tmp_path / "short.txt"
    short.write_text("Hi.\n\nHo.\n")
    with pytest.raises(DataError, match=r"short.txt:1: .*not more than min_context"):
        _run(tmp_path, tiny_model_dir, task="clm", data_files=[str(short)], min_context=8)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(FACTS[1]) + "\n" + json.dumps({"text": "Oslo.", "entities": [[3, 1]]}) + "\n")
    _, result, rows, _ = _run(tmp_path, tiny_model_dir, task="facts", data_files=[str(bad)])
    assert len(rows) == 3 and result["n_skipped_rows"] == 1


@pytest.mark.model
def test_a_token_run_loads_and_what_needs_options_says_what_a_token_run_is(tmp_path, tiny_model_dir):
    data = tmp_path / "texts.txt"
    data.write_text(TEXT)
    _run(tmp_path, tiny_model_dir, task="clm", data_files=[str(data)], min_context=4)
    pred = load_predictions(tmp_path / "run")  # the pages' reading of it: tests/ui/test_token_pages.py
    assert pred.task == "clm" and pred.probs.shape[1] == 6
    with pytest.raises(ValueError, match="token-level run"):
        require_options(pred, "rescaling by a temperature")


@pytest.mark.model
def test_a_document_longer_than_the_models_window_is_read_within_it(tmp_path, tiny_model_dir):
    data = tmp_path / "long.jsonl"
    text = " ".join(f"word{i}" for i in range(800))
    late = text.index("word700")
    data.write_text(json.dumps({"text": text, "entities": [[0, 5], [6, 11], [late, late + 7]]}) + "\n")
    _, result, rows, _ = _run(tmp_path, tiny_model_dir, task="clm", data_files=[str(data)], positions=50)
    assert len(rows) == 50 and max(r["position"] for r in rows) <= 512  # the tiny model reads 512 tokens
    _, result, rows, _ = _run(tmp_path / "facts", tiny_model_dir, task="facts", data_files=[str(data)])
    assert [r["entity"] for r in rows] == [0, 1]  # the first is predicted from BOS, the last lies past the window
    assert result["n_skipped_entities"] == 1
    assert result["skipped_entities"] == [f"{data}:1: entity 2 'word700': past the model's window of 512 tokens"]
