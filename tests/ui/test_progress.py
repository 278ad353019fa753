"""Progress from a job's first second: announced stages, counts in questions, token-bounded batches, ETA."""
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lab.core.errors import Stopped
from lab.core.events import EventWriter, read_events
from lab.data.templates import default_template, get_template
from lab.jobkit import worker
from lab.models.batching import encode_prompts, layer_progress, plan_batches, scored_length
from lab.models.scoring import score_cloze, score_letter
from ui.progress import eta_seconds, progress

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from lab.models.loading import load_model

    return load_model(str(tiny_model_dir), device="cpu")


def _records(shared_data, dataset: str, limit: int):
    from lab.data import load

    files = {"boolq": shared_data / "boolq" / "dev.jsonl", "obqa": shared_data / "openbookqa" / "test.jsonl"}
    return load(dataset, "test", [str(files[dataset])], limit=limit).records


def _run_evaluate_job(tmp_path: Path, model: str, shared_data: Path, **fields) -> list[dict]:
    config = {"kind": "evaluate", "model": model, "dataset": "obqa", "split": "test", "device": "cpu",
              "data_files": [str(shared_data / "openbookqa" / "test.jsonl")], **fields}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    assert worker.run(path, tmp_path / "run") == 0
    return read_events(tmp_path / "run" / "events.jsonl")[0]


# ---------------------------------------------------------------- stages before the model
@pytest.mark.model
@pytest.mark.e2e
def test_a_job_announces_its_loading_stages_before_any_model_loads(tmp_path, tiny_model_dir, shared_data,
                                                                   monkeypatch):
    import lab.models.loading

    seen_at_load = []
    real = lab.models.loading.load_model

    def spy(*args, **kwargs):
        seen_at_load.extend(read_events(tmp_path / "run" / "events.jsonl")[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(lab.models.loading, "load_model", spy)
    events = _run_evaluate_job(tmp_path, str(tiny_model_dir), shared_data, limit=4)
    assert [(e["stage"], e.get("name")) for e in seen_at_load] == [
        ("start", None), ("stage", "loading data obqa"), ("stage", f"loading model {tiny_model_dir}")]
    assert events[: len(seen_at_load)] == seen_at_load and events[-1]["stage"] == "done"


@pytest.mark.e2e
def test_the_worker_reaches_its_first_stage_without_importing_torch():
    """The start event and the first announced stage go out before torch (seconds to import)."""
    code = ("import sys; import lab.cli, lab.jobkit.worker, lab.jobkit.kinds as k; k.all_kinds(); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported too early'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- counts in questions
@pytest.mark.model
@pytest.mark.e2e
def test_steps_count_questions_and_strictly_increase_to_the_total(tmp_path, tiny_model_dir, shared_data,
                                                                   monkeypatch):
    monkeypatch.setattr(worker, "PROGRESS_EVERY_S", 0.0)  # every batch and every block said
    events = _run_evaluate_job(tmp_path, str(tiny_model_dir), shared_data, limit=7, batch_size=2)
    counts = [e for e in events if e["stage"] == "scoring"]
    assert all(e["total"] == 7 for e in counts) and "tokens" not in counts[0]  # begun, before it was weighed
    steps = [e["step"] for e in counts]
    said = [s for i, s in enumerate(steps) if i == 0 or s != steps[i - 1]]
    assert steps == sorted(steps) and said == [0, 2, 4, 6, 7]  # questions, 4 batches of at most 2
    tokens = [e["tokens"] for e in counts[1:]]
    assert tokens == sorted(tokens) and tokens[0] == 0 and tokens[-1] == counts[-1]["tokens_total"]
    inside = [e for e in counts[1:] if e["step"] == 0 and 0 < e["tokens"]]
    assert inside, "no news from inside the first batch"


@pytest.mark.unit
def test_counter_says_begun_and_first_count_at_once_then_throttles_and_stops(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "PROGRESS_EVERY_S", 3600.0)
    ctx = worker.JobContext(tmp_path)
    count = ctx.progress("scoring")(5)
    count.weigh([(2, 60), (2, 20), (1, 5)])
    with pytest.raises(ValueError, match="batches of 5 items in all, but got 2"):
        count.weigh([(1, 5), (1, 5)])
    count.within(0.5)  # throttled
    count(2)  # the first count, said however soon
    count(2)  # throttled
    count(1)  # the last, always said
    said = [(e["step"], e.get("tokens")) for e in read_events(tmp_path / "events.jsonl")[0]]
    assert said == [(0, None), (0, 0), (2, 60), (5, 85)]
    (tmp_path / "STOP").touch()
    with pytest.raises(Stopped, match="stopped at 6/5"):
        count(1)


@pytest.mark.unit
def test_counter_moves_tokens_inside_a_batch_and_never_back(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "PROGRESS_EVERY_S", 0.0)
    ctx = worker.JobContext(tmp_path)
    count = ctx.progress("scoring")(3)
    count.within(0.5)  # not weighed: nothing to say inside a batch
    count.weigh([(2, 60), (1, 20)])
    count.within(0.5)
    count.within(0.25)  # a later pass of the same batch (cloze's options) starts again at 0
    count(2)
    count.within(0.4)
    said = [(e["step"], e.get("tokens")) for e in read_events(tmp_path / "events.jsonl")[0]]
    assert said == [(0, None), (0, 0), (0, 30), (0, 30), (2, 60), (2, 68)]
    (tmp_path / "STOP").touch()
    with pytest.raises(Stopped, match="stopped at 2/3"):  # a stop comes inside a long pass
        count.within(0.9)


@pytest.mark.model
def test_layer_progress_reports_each_block_and_leaves_the_model_as_it_was(tiny):
    import torch

    fractions = []
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        plain = tiny.model(input_ids=ids).logits
        with layer_progress(tiny.model, fractions.append):
            hooked = tiny.model(input_ids=ids).logits
        tiny.model(input_ids=ids)
    assert fractions == [0.5, 1.0]  # two blocks; none after the context
    assert torch.equal(plain, hooked)


# ---------------------------------------------------------------- batches
def _reference_plan(lengths, batch_size):
    """The plan before the token budget: sorted longest first, cut every ``batch_size``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s: s + batch_size] for s in range(0, len(order), batch_size)]


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(5))
def test_batches_keep_under_the_token_budget_and_cover_every_question_once(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(5, 60), rng.randint(100, 900)]) for _ in range(rng.randint(1, 300))]
    for batch_size in (1, 3, 16):
        assert plan_batches(lengths, batch_size) == _reference_plan(lengths, batch_size)
        for budget in (1, 256, 512, 4096):
            plan = plan_batches(lengths, batch_size, budget)
            flat = [i for batch in plan for i in batch]
            assert sorted(flat) == list(range(len(lengths)))  # every question exactly once
            assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)  # longest first
            for batch in plan:
                assert 1 <= len(batch) <= batch_size
                assert len(batch) * max(lengths[i] for i in batch) <= budget or len(batch) == 1


@pytest.mark.unit
def test_a_budget_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        plan_batches([3, 4], 2, 0)


def _compare_plans(loaded, records, scoring: str, budget: int, atol: float) -> None:
    """Scores with the token budget equal the old batches of 16, question by question in input order."""
    template = get_template(default_template(records[0].source, scoring))
    prompts = [template.render(r, loaded.tokenizer) for r in records]
    encoded = encode_prompts(loaded.tokenizer, prompts, scoring)
    lengths = [scored_length(e, scoring) for e in encoded]
    plan = plan_batches(lengths, 16, budget)
    assert 1 < len(plan) < len(records)  # the budget did split the old single batch, not to singletons
    scorer = score_letter if scoring == "letter" else score_cloze
    done, blocks = [], []
    with layer_progress(loaded.model, blocks.append):  # as a job scores: hooks must change nothing
        budgeted = scorer(loaded.model, loaded.tokenizer, prompts, encoded=encoded, batches=plan,
                          progress=done.append)
    before = scorer(loaded.model, loaded.tokenizer, prompts, batch_size=16, encoded=encoded)
    assert done == [len(batch) for batch in plan] and blocks  # counted in questions, batch by batch
    for new, old in zip(budgeted, before):
        np.testing.assert_allclose(new.probs, old.probs, atol=atol)
        if scoring == "cloze":
            np.testing.assert_allclose(new.logliks, old.logliks, atol=1e-3)


@pytest.mark.model
@pytest.mark.slow
def test_budgeted_batches_give_the_same_probabilities_on_long_passages(bundled, shared_data):
    _compare_plans(bundled, _records(shared_data, "boolq", 5), "letter", budget=512, atol=1e-5)


@pytest.mark.model
def test_budgeted_batches_give_the_same_cloze_scores(tiny, shared_data):
    _compare_plans(tiny, _records(shared_data, "obqa", 12), "cloze", budget=64, atol=1e-5)


# ---------------------------------------------------------------- ETA and what the page shows
@pytest.mark.unit
def test_eta_weighs_tokens_when_the_costly_questions_come_first():
    events = [{"time": 100.0, "stage": "scoring", "step": 0, "total": 10},
              {"time": 101.0, "stage": "scoring", "step": 0, "total": 10, "tokens": 0, "tokens_total": 2000},
              {"time": 111.0, "stage": "scoring", "step": 1, "total": 10, "tokens": 500, "tokens_total": 2000}]
    assert eta_seconds(events) == pytest.approx(30.0)  # 10 s per 500 tokens, 1,500 left (not 9 × 10 s)
    p = progress(events)
    assert (p.stage, p.step, p.total) == ("scoring", 1, 10)
    assert p.text.startswith("scoring 25% (by tokens, of 10), ETA 30s")  # not "1/10 (25%)", which contradicts itself


@pytest.mark.unit
def test_eta_counts_from_the_stage_start_and_ignores_an_earlier_run_of_it():
    events = [{"time": 0.0, "stage": "train", "step": 0, "total": 4},
              {"time": 50.0, "stage": "train", "step": 4, "total": 4},
              {"time": 60.0, "stage": "stage", "name": "train student"},
              {"time": 70.0, "stage": "train", "step": 0, "total": 8},
              {"time": 75.0, "stage": "log", "message": "x"},
              {"time": 90.0, "stage": "train", "step": 2, "total": 8}]
    assert eta_seconds(events) == pytest.approx(60.0)  # 20 s for 2 steps since step 0, 6 left
    assert eta_seconds(events[:2]) is None  # finished: nothing left
    assert eta_seconds(events[:4]) is None  # nothing done yet: no rate


def _fine_tune(epochs: int = 5, steps: int = 10, step_s: float = 1.0, validation_s: float = 30.0):
    """A fine-tune's events as lab.training writes them: a count after every step (steps of
    ``step_s`` ± 10 %), and after each epoch a validation taking ``validation_s`` (its event
    comes when it ends, followed by the checkpoint's save), then the next step; and when the
    stage's work (the last validation included) is done."""
    rng = np.random.default_rng(0)
    total, now, events = epochs * steps, 1000.0, [{"time": 1000.0, "stage": "log", "message": "train: …"}]
    for step in range(1, total + 1):
        now += step_s * rng.uniform(0.9, 1.1) + (20.0 if step == 1 else 0.0)  # the first step warms up
        events.append({"time": now, "stage": "train", "step": step, "total": total, "epoch": step / steps,
                       "loss": 1.0})
        if step % steps == 0:
            now += validation_s
            events.append({"time": now, "stage": "train_eval", "step": step, "epoch": step / steps, "ece": 0.1})
            now += 2.0  # the checkpoint
    return events, now


@pytest.mark.unit
def test_the_eta_holds_still_across_slow_validation_pauses():
    """Issue 30: a fine-tune's ETA went 11m02s → 1m38s → 5m25s → 6m58s: measured from the
    stage's start, every validation pause that had or had not yet happened swung the rate. Now
    the steps are timed between pauses, and each pause is counted at its measured length as
    often as it is still to come."""
    events, end = _fine_tune()
    counted = [i for i, e in enumerate(events) if e["stage"] == "train"]
    after_first_validation = [i for i in counted if events[i]["step"] > 10 and events[i]["step"] < 50]
    for i in after_first_validation:
        truth = end - events[i]["time"]
        assert eta_seconds(events[: i + 1]) == pytest.approx(truth, rel=0.08), events[i]["step"]
    etas = [eta_seconds(events[: i + 1]) for i in after_first_validation]
    assert all(a >= b for a, b in zip(etas, etas[1:]))  # it only falls: no swing back up after a pause


@pytest.mark.unit
def test_progress_shows_a_stage_that_has_no_count_yet():
    assert progress([]) is None and progress([{"time": 1.0, "stage": "log", "message": "hello"}]) is None
    start = {"time": 100.0, "stage": "start", "pid": 1}
    p = progress([start], now=103.2)
    assert (p.stage, p.step, p.total, p.eta_s) == ("starting", None, None, None) and p.text == "starting… 3s"
    events = [start, {"time": 100.1, "stage": "stage", "name": "loading data boolq"},
              {"time": 100.4, "stage": "stage", "name": "loading model bundled"},
              {"time": 101.0, "stage": "log", "message": "converting"}]
    p = progress(events, now=112.4)
    assert p.text == "loading model bundled… 12s" and p.elapsed_s == pytest.approx(12.0)
    assert progress(events, now=99.0).elapsed_s == 0.0  # a clock behind the worker's: not negative
    counted = events + [{"time": 113.0, "stage": "scoring", "step": 0, "total": 100}]
    assert progress(counted, now=114.0).text == "scoring 0/100 (0%)"
    again = counted + [{"time": 120.0, "stage": "stage", "name": "evaluate first on obqa"}]
    assert progress(again, now=150.0).text == "evaluate first on obqa… 30s"


@pytest.mark.unit
def test_event_writer_says_stages_as_the_page_reads_them(tmp_path):
    writer = EventWriter(tmp_path / "events.jsonl")
    writer.stage("loading model bundled")
    (event,), _ = read_events(tmp_path / "events.jsonl")
    assert event["stage"] == "stage" and event["name"] == "loading model bundled"
    assert progress([event], now=event["time"] + 2).text == "loading model bundled… 2s"
