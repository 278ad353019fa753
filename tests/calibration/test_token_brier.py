"""A token run's Brier score is the exact one over the whole vocabulary, Σ_v (p_v − 1[v = target])²: in the
scoring pass, in metrics.json and at any temperature of the Temperature lab, each checked against a
recomputation from the tiny model's raw logits; a run that did not keep Σ p² says its Brier is unavailable."""
import json

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax

from lab.calibration.summary import BRIER_UNAVAILABLE, token_scores
from lab.calibration.token_temperature import TOKEN_GRID, TokenLogits, token_sum_sq
from lab.jobkit.kinds import parse_config
from lab.kinds.evaluate.run import evaluate
from lab.models.token_scoring import score_documents
from lab.models.token_targets import TokenDoc
from lab.results.analysis import reported_summary, temperature_summary
from lab.results.predictions import load_predictions
from tests.helpers import table_model

TEXT = ("The quick brown fox jumps over the lazy dog while the farmer watches from the gate.\n\n"
        "Rain fell on the hills all night, and by morning the river had risen over the old stone bridge.\n")


def _brier(probs: np.ndarray, target: int) -> float:
    """Σ_v (p_v − 1[v = target])² over the whole vocabulary, term by term."""
    onehot = np.zeros_like(probs)
    onehot[target] = 1.0
    return float(((probs - onehot) ** 2).sum())


@pytest.mark.unit
def test_a_hand_computed_brier_and_a_target_outside_the_top_tokens():
    # p = (0.5, 0.25, 0.25), target the first: (0.5 − 1)² + 0.25² + 0.25² = 0.375.
    assert token_scores([0.5], [0.375])["brier"] == pytest.approx(0.375)
    # 100 tokens: 0.6 on one, 0.4 spread evenly over 99, the target one of those 99. The top-5-and-rest
    # Brier counted "the rest" as right (0.6² + 4·(0.4/99)² + (0.4·95/99 − 1)² ≈ 0.78); the truth is ≈ 1.35.
    probs = np.array([0.6] + [0.4 / 99] * 99)
    got = token_scores([probs[50]], [float((probs ** 2).sum())])["brier"]
    assert got == pytest.approx(_brier(probs, 50)) and got > 1.3


@pytest.mark.unit
def test_a_run_without_sum_sq_has_no_brier_rather_than_the_top_k_one():
    scores = token_scores([0.5, 0.2], None)
    assert scores["brier"] is None and scores["brier_note"] == BRIER_UNAVAILABLE
    assert scores["nll"] == pytest.approx(-np.mean(np.log([0.5, 0.2])))


@pytest.mark.model
def test_the_scoring_pass_keeps_the_exact_sum_of_squares_of_a_closed_form_model():
    rng = np.random.default_rng(4)
    table = rng.normal(scale=3.0, size=(40, 40))
    docs = [TokenDoc(rng.integers(0, 40, size=20).tolist(), [1, 7, 19])]
    for t in (1.0, 0.3):
        for r in score_documents(table_model(table), docs, pad_id=0, top_k=3, temperature=t)[0]:
            probs = softmax(table[docs[0].ids[r["position"] - 1]] / t)
            assert r["sum_sq"] == pytest.approx(float((probs ** 2).sum()), rel=1e-5)


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory, tiny_model_dir):
    """A clm evaluation of the tiny model, its rows and metrics, and the model for the recomputation."""
    from lab.models.loading import load_model

    root = tmp_path_factory.mktemp("brier")
    data = root / "texts.txt"
    data.write_text(TEXT)
    _, cfg = parse_config({"kind": "evaluate", "model": str(tiny_model_dir), "task": "clm", "positions": 6,
                           "min_context": 2, "data_files": [str(data)], "bootstrap": 0})
    evaluate(cfg, root / "run", log=lambda m: None)
    rows = [json.loads(line) for line in (root / "run" / "predictions.jsonl").read_text().splitlines()]
    saved = json.loads((root / "run" / "metrics.json").read_text())
    return root / "run", rows, saved, load_model(str(tiny_model_dir), device="cpu")


def _raw_logits(loaded, row, documents) -> np.ndarray:
    """The model's raw logits for the row's target from one unpadded forward over the tokens before it."""
    ids = loaded.tokenizer(documents[row["doc"]])["input_ids"]
    with torch.no_grad():
        return loaded.model(torch.tensor([ids[:row["position"]]])).logits[0, -1].double().numpy()


@pytest.mark.model
def test_metrics_brier_is_the_full_vocabulary_one_recomputed_from_the_logits(clm_run):
    _, rows, saved, loaded = clm_run
    documents = TEXT.strip().split("\n\n")
    exact = [_brier(softmax(_raw_logits(loaded, r, documents)), r["target_id"]) for r in rows]
    assert saved["brier"] == pytest.approx(np.mean(exact), rel=1e-5)
    assert saved["brier_over"] == "the whole vocabulary"


@pytest.mark.model
def test_the_temperature_lab_shows_the_exact_brier_at_any_temperature(clm_run):
    path, rows, saved, loaded = clm_run
    documents = TEXT.strip().split("\n\n")
    z = np.array([_raw_logits(loaded, r, documents) for r in rows])  # (n, V)
    pred = load_predictions(path)
    assert reported_summary(pred)["brier"] == pytest.approx(saved["brier"])
    for t in (0.05, 0.37, 1.0, 2.9, 60.0):
        exact = np.mean([_brier(softmax(row / t), r["target_id"]) for row, r in zip(z, rows)])
        assert temperature_summary(pred, t)["brier"] == pytest.approx(exact, rel=1e-4)
    low = temperature_summary(pred, 0.015)  # T / 2 lies below the grid the log-partition was kept at
    assert low["brier"] is None and "T / 2 = 0.0075" in low["brier_note"]


@pytest.mark.unit
def test_token_sum_sq_from_the_log_partition_matches_the_exact_sum():
    rng = np.random.default_rng(2)
    z = rng.normal(scale=3.0, size=(20, 3000))
    top = -np.sort(-z, axis=1)[:, :5]
    log_z = np.stack([logsumexp(z / t, axis=1) for t in TOKEN_GRID], axis=1)
    logits = TokenLogits(top, z[:, 0], log_z, TOKEN_GRID)
    for t in (0.02, 0.1, 0.77, 1.0, 13.0, 100.0):
        exact = (softmax(z / t, axis=1) ** 2).sum(axis=1)
        assert token_sum_sq(logits, t) == pytest.approx(exact, rel=1e-4)
    assert token_sum_sq(logits, 0.019) is None


@pytest.mark.model
def test_an_old_token_run_without_sum_sq_opens_and_says_its_brier_is_unavailable(clm_run, tmp_path):
    path, rows, saved, _ = clm_run
    old = tmp_path / "old"
    old.mkdir()
    (old / "predictions.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "sum_sq"}) + "\n"
                                                   for r in rows))
    (old / "metrics.json").write_text(json.dumps({**saved, "brier": 0.1, "brier_over": "the top 5 tokens and the rest"}))
    summary = reported_summary(load_predictions(old))
    assert summary["brier"] is None and summary["brier_note"] == BRIER_UNAVAILABLE
    assert summary["nll"] == pytest.approx(saved["nll"])
