"""The temperature lab's ECE interval and its forms' starting values (issue 43).

The ECE interval beside a drawn T is the bootstrap of the run at that T, resampled as the run's
evaluation did (its config.yaml's ``bootstrap`` and ``seed``); where a percentile bootstrap leaves out
the point (ECE is biased upward under resampling), the page and the diagram say so. Switching the
form starts the other form at its own value, never the previous form's T taken as c.

The run: 60 four-option questions of an over-confident model (logits N(0, 2.5), answers drawn at
T = 3), as the newcomer's 60-question walk: at its lowest-ECE T the ECE lies below its interval.
"""
import json

import numpy as np
import pytest

from lab.calibration import metrics
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from lab.results import analysis, predictions
from ui.plots import reliability
from ui import temperature_page as page
from ui.temperature_slider import STEPS_PER_DECADE
from ui.context import LabContext

pytestmark = pytest.mark.unit

NAME, BINS = "00001-evaluate", "10 equal-width bins"
N_BOOT, SEED = 200, 7  # the run's own bootstrap, not the page's defaults (1000, 0)


def _rows(n: int = 60, k: int = 4) -> list[dict]:
    """Evaluation rows of an over-confident model: softmax of N(0, 2.5) logits, answers drawn at T = 3."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2.5, (n, k))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)  # (n, k)
    truth = np.exp(logits / 3) / np.exp(logits / 3).sum(1, keepdims=True)
    rows = []
    for i, (p, q) in enumerate(zip(probs, truth)):
        answer, pred = int(rng.choice(k, p=q)), int(np.argmax(p))
        rows.append({"id": f"q{i}", "question": f"Question {i}?", "choices": list("abcd"), "answer": answer,
                     "probs": p.tolist(), "pred": pred, "confidence": float(p.max()), "correct": pred == answer})
    return rows


@pytest.fixture
def walk(tmp_path):
    """The 60-question run, evaluated (and configured, as a job writes config.yaml) with 200 replicates, seed 7."""
    write_evaluation(tmp_path / NAME, _rows(), EvalConfig(dataset="mmlu", bootstrap=N_BOOT, seed=SEED),
                     {"model": "toy"})
    (tmp_path / NAME / "config.yaml").write_text(f"kind: evaluate\nbootstrap: {N_BOOT}\nseed: {SEED}\n")
    return LabContext(tmp_path)


def _interval_shown(text: str) -> tuple[float, float]:
    low, high = text.split("id='ece-interval'>[95% CI ")[1].split("%]")[0].split("–")
    return float(low), float(high)


def _interval_at(ctx: LabContext, t: float) -> tuple[float, float]:
    """The bootstrap interval (percent) of the run's ECE at T, computed here from the predictions."""
    pred = predictions.load_predictions(ctx.runs / NAME)
    choice, conf = metrics.predictions(analysis.recalibrate(pred, t), pred.mask)
    low, high = metrics.ece_bootstrap(conf, choice == pred.labels, 10, N_BOOT, 0.95, SEED, pred.bin_edges)
    return round(100 * low, 1), round(100 * high, 1)


def test_at_t_1_the_interval_is_the_one_the_evaluation_reported(walk):
    reported = json.loads((walk.runs / NAME / "metrics.json").read_text())
    shown = _interval_shown(page.pick_run(walk, NAME, "logit", BINS).text)
    assert shown == (round(100 * reported["ece_ci_low"], 1), round(100 * reported["ece_ci_high"], 1))


def test_at_the_lowest_ece_the_interval_is_that_t_s_and_the_point_below_it_is_explained(walk):
    view = page.go_to_optimum(walk, NAME, "logit", BINS, which="ece")
    t = view.drawn["temperature"]
    low, high = _interval_shown(view.text)
    assert t != 1.0 and (low, high) == _interval_at(walk, t)  # the interval belongs to the T shown
    ece = float(view.text.split("id='ece-value'>")[1].split("%")[0])
    assert ece < low  # the case the walk met: 4.07% beside [5.6, 20.6]
    assert "id='ece-outside-interval'" in view.text and "bootstrap percentile interval" in view.text
    assert "biased upward under resampling, so the point may lie below it" in view.text
    (stats,) = [a.text for a in view.reliability.layout.annotations if a.name == reliability.STATS_NAME]
    assert stats.startswith(f"ECE {ece:.1f}%, below its bootstrap [{low:.1f}, {high:.1f}]")


def test_an_ece_inside_its_interval_gets_no_note(walk):
    view = page.pick_run(walk, NAME, "logit", BINS)
    low, high = _interval_shown(view.text)
    assert low <= float(view.text.split("id='ece-value'>")[1].split("%")[0]) <= high
    assert "ece-outside-interval" not in view.text
    (stats,) = [a.text for a in view.reliability.layout.annotations if a.name == reliability.STATS_NAME]
    assert "bootstrap" not in stats and f"[{low:.1f}, {high:.1f}]" in stats


def test_the_paper_form_starts_at_its_own_c_inside_its_grid_and_the_logit_form_back_at_its_own_t(walk):
    best = page.go_to_optimum(walk, NAME, "logit", BINS, which="ece")
    assert best.drawn["temperature"] > 2  # off the paper form's grid (0.01…1) taken as c
    paper = page.settings_changed(walk, NAME, best.drawn, "paper", BINS)
    assert paper.drawn["temperature"] == 1.0 and paper.drawn["form"] == "paper"
    sweep = analysis.temperature_sweep(predictions.load_predictions(walk.runs / NAME), form="paper")
    assert 10 ** paper.slider["maximum"] <= sweep.table["temperature"].max() * 10 ** (1 / STEPS_PER_DECADE)
    assert paper.slider["value"] == 0.0 and "c = 1," in paper.slider["label"]
    back = page.settings_changed(walk, NAME, paper.drawn, "logit", BINS)
    assert back.drawn["temperature"] == 1.0 and back.drawn["form"] == "logit"  # not c carried over as T


def test_a_run_picked_in_the_paper_form_starts_at_c_1_not_at_its_saved_t(walk):
    (walk.runs / NAME / "temperature.json").write_text(json.dumps({"temperature": 3.0}))
    assert page.stored_temperature(walk, NAME) == 3.0
    assert page.pick_run(walk, NAME, "logit", BINS).drawn["temperature"] == 3.0
    assert page.pick_run(walk, NAME, "paper", BINS).drawn["temperature"] == 1.0


def test_another_binning_keeps_the_t_drawn(walk):
    drawn = page.typed_temperature(walk, NAME, "2.5", page.pick_run(walk, NAME, "logit", BINS).drawn, "logit",
                                   BINS).drawn
    assert page.settings_changed(walk, NAME, drawn, "logit", "14 equal-width bins").drawn["temperature"] == 2.5
