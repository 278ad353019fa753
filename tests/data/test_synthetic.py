"""The controlled task (lab.data.synthetic): the generator against its specification, and the
Bayes predictor's accuracy and ECE against their closed forms."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy.stats import binom

from lab.calibration.oracle import _poisson_binomial, expected_oracle, oracle
from lab.data import load
from lab.data.synthetic import IN_DOMAIN, SHIFTED, Task, generate, write_splits

pytestmark = pytest.mark.unit


def _object(question: str) -> str:
    return re.search(r"the (\w+) look\?$", question).group(1)


def test_the_rule_is_seeded_and_uses_every_colour_about_equally():
    rule = Task(seed=3).rule()
    assert rule == Task(seed=3).rule() != Task(seed=4).rule()
    counts = np.bincount(list(rule.values()), minlength=4)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("levels", [IN_DOMAIN, SHIFTED])
def test_stated_answers_agree_with_the_rule_as_often_as_the_light_says(levels):
    task = Task(levels=levels)
    rows = generate(task, 20_000, split_seed=7)
    rule = task.rule()
    for light, q in levels:
        hits = [r["answer"] == rule[_object(r["question"])] for r in rows if r["light"] == light]
        assert np.mean(hits) == pytest.approx(q, abs=4 * math.sqrt(q * (1 - q) / len(hits)))
    row = rows[0]
    assert row["true_probs"][rule[_object(row["question"])]] == dict(levels)[row["light"]]
    assert sum(row["true_probs"]) == pytest.approx(1, abs=1e-5)


def test_poisson_binomial_with_equal_probabilities_is_the_binomial():
    np.testing.assert_allclose(_poisson_binomial([0.3] * 12), binom.pmf(np.arange(13), 12, 0.3), atol=1e-12)


def test_expected_oracle_ece_of_one_level_is_the_binomial_mean_absolute_deviation():
    n, q = 50, 0.6
    truth = [[q, (1 - q) / 3, (1 - q) / 3, (1 - q) / 3]] * n
    mad = sum(binom.pmf(k, n, q) * abs(k - n * q) for k in range(n + 1)) / n  # E|X/n − q|, X ~ Bin(n, q)
    found = expected_oracle(truth)
    assert found["ece"] == pytest.approx(mad, rel=1e-9) and found["accuracy"] == pytest.approx(q)
    assert found["population_ece"] == 0.0


def test_the_oracle_on_many_draws_averages_to_the_closed_forms():
    task = Task()
    rows = generate(task, 300, split_seed=11)
    truth = [r["true_probs"] for r in rows]
    expected = expected_oracle(truth)
    rng = np.random.default_rng(0)
    draws = [oracle(truth, [rng.choice(4, p=np.asarray(t) / sum(t)) for t in truth]) for _ in range(400)]
    for key in ("accuracy", "ece"):
        values = np.array([d[key] for d in draws])
        assert values.mean() == pytest.approx(expected[key], abs=4 * values.std() / math.sqrt(len(values)))
    assert expected_oracle(truth * 40)["ece"] < expected["ece"] / 4  # the binned ECE's bias fades as n grows


def test_the_bundled_splits_load_with_their_true_distributions(tmp_path):
    test = load("synthetic", "test", ["bundled"]).records
    shifted = load("synthetic", "shifted", ["bundled"]).records
    assert len(test) == 1000 and len(shifted) == 1000 and test[0].source == "synthetic"
    assert {r.meta["light"] for r in test} == {"bright", "dim"}
    assert max(max(r.meta["true_probs"]) for r in shifted) == pytest.approx(0.8)
    written = write_splits(tmp_path, sizes={"test": 5})
    assert [json.loads(line)["id"] for line in written[0].read_text().splitlines()] == [f"test-{i}" for i in range(5)]


def test_a_row_whose_true_distribution_is_no_distribution_is_skipped_with_the_reason(tmp_path):
    good = generate(Task(), 2, split_seed=1)
    bad = {**good[1], "id": "bad", "true_probs": [0.9, 0.9, 0.0, 0.0]}
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (good[0], bad)))
    loaded = load("synthetic", "test", [str(path)])
    assert [r.id for r in loaded.records] == ["test-0"]
    assert "true_probs" in str(loaded.problems[0]) and ":2:" in str(loaded.problems[0])


def test_a_task_that_would_make_the_rule_unlikely_is_refused():
    with pytest.raises(ValueError, match=r"\[1/K, 1\]"):
        Task(levels=(("dim", 0.2),))
    with pytest.raises(ValueError, match="n_options"):
        Task(n_options=9)


def test_an_evaluation_of_the_controlled_task_is_shown_beside_its_oracle(tmp_path):
    from lab.kinds.evaluate.config import EvalConfig
    from lab.kinds.evaluate.run import write_evaluation
    from lab.results import cases, predictions, runs, tables
    from ui.context import LabContext
    from ui.reliability_page import reliability_view

    task = Task()
    rule = task.rule()
    rows = []
    for r in generate(task, 200, split_seed=5):
        probs = [0.97 if k == rule[_object(r["question"])] else 0.01 for k in range(4)]  # over-confident, rule learnt
        pred = int(np.argmax(probs))
        rows.append({"id": r["id"], "question": r["question"], "choices": r["choices"], "answer": r["answer"],
                     "probs": probs, "pred": pred, "confidence": max(probs), "correct": pred == r["answer"],
                     "meta": {"true_probs": r["true_probs"], "light": r["light"]}})
    metrics = write_evaluation(tmp_path / "run", rows, EvalConfig(model="bundled", dataset="synthetic", bootstrap=20),
                               {"model": "bundled"})
    truth, labels = [r["meta"]["true_probs"] for r in rows], [r["answer"] for r in rows]
    assert metrics["oracle"] == {**oracle(truth, labels), "expected": expected_oracle(truth)}
    assert metrics["accuracy"] == metrics["oracle"]["accuracy"]  # same predictions: the rule's
    assert metrics["ece_gap_to_oracle"] == pytest.approx(metrics["ece"] - metrics["oracle"]["ece"]) and \
        metrics["ece_gap_to_oracle"] > 0.1  # claims 0.97 where the truth is 0.6 on dim questions
    run = runs.evaluation(tmp_path, "run")
    assert run.oracle_ece == pytest.approx(metrics["oracle"]["ece"])
    assert tables.results_table(tmp_path)["oracle accuracy"].tolist() == [round(metrics["oracle"]["accuracy"], 4)]
    table = cases.case_table(predictions.load_predictions(tmp_path / "run"))
    assert table[cases.ORACLE_COLUMN].tolist() == [t[p] for t, p in zip(truth, table["prediction"].map("ABCD".index))]
    figure, _ = reliability_view(LabContext(tmp_path), ["run"], None, "reliability diagram")
    titles = [a.text for a in figure.layout.annotations if a.name == "subplot title"]
    assert len(titles) == 2 and titles[1].startswith("oracle (true distribution)")
