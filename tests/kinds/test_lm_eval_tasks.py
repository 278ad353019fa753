"""lm-eval tasks wherever a kind evaluates (issue 40, item 4): series tasks, sft/dpo calibration tasks, FIRST's and
CFT's out-of-domain sets — accepted at submit and scored as the evaluate kind scores them (cloze on lm-eval's own
prompts, template lm_eval) — and refused where a method needs lettered options (FIRST's and CFT's training data)."""
import json

import pytest
import yaml

from lab.core.config import ConfigError
from lab.core.events import EventWriter
from lab.jobkit.kinds import parse_config
from lab.kinds.cft.report import write_report
from lab.kinds.cft.run import _Protocol
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.first.run import evaluate_model

TASK = "lm-eval:bundled_arc_easy"


@pytest.mark.unit
def test_a_series_task_is_an_lm_eval_task_with_its_shots():
    _, cfg = parse_config({"kind": "series", "tasks": [{"dataset": TASK, "limit": 3, "num_fewshot": 2}]})
    task = cfg.task_config(0, "bundled", None, 0)
    assert (task.dataset, task.scoring, task.template, task.num_fewshot, task.limit) == (TASK, "cloze", "lm_eval", 2, 3)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_an_alignment_job_s_calibration_task_is_an_lm_eval_task(kind):
    _, cfg = parse_config({"kind": kind, "calibration": [{"dataset": TASK, "limit": 3, "num_fewshot": 1}]})
    task = cfg.task_config(0, "bundled", None)
    assert (task.dataset, task.scoring, task.template, task.num_fewshot) == (TASK, "cloze", "lm_eval", 1)


@pytest.mark.unit
def test_first_scores_an_lm_eval_ood_set_cloze_and_its_lab_sets_by_letter_as_before():
    entry = {"dataset": TASK, "limit": 3, "num_fewshot": 1}
    _, cfg = parse_config({"kind": "first", "ood": [entry, {"dataset": "arc_easy", "split": "validation"}]})
    assert cfg.ood[0] == entry  # kept as written: no lab defaults (data_files bundled) on a task that names its data
    task = cfg.eval_config({"split": "test", **cfg.ood[0]}, "bundled", None)
    assert (task.scoring, task.template, task.num_fewshot, task.data_files) == ("cloze", "lm_eval", 1, [])
    # The lab's sets: the configuration the pipeline built before lm-eval sets existed, field for field.
    for spec in ({"dataset": cfg.dataset, "data_files": cfg.data_files, "split": cfg.test_split, "limit": 5},
                 {"split": "test", **cfg.ood[1]}):
        template = spec.get("template") or (cfg.template if spec["dataset"] == cfg.dataset else None)
        before = EvalConfig.from_dict({
            **spec, "model": "bundled", "adapter": None, "scoring": "letter", "template": template, "bins": cfg.bins,
            "bin_edges": cfg.bin_edges, "batch_size": cfg.eval_batch_size, "device": cfg.device, "dtype": cfg.dtype,
            "bootstrap": cfg.bootstrap, "seed": cfg.seed})
        assert cfg.eval_config(spec, "bundled", None) == before


@pytest.mark.unit
@pytest.mark.parametrize("values, field, says", [
    # training data takes no lm-eval task (its field does not declare them): the refusal says where they go
    ({"dataset": TASK}, "dataset", "out-of-domain sets"),
    ({"ood": [{"dataset": TASK, "template": "plain"}]}, "ood[0].template", "brings its own prompt"),
    ({"ood": [{"dataset": TASK, "subject": "anatomy"}]}, "ood[0].subject", "name a subtask"),
    ({"ood": [{"dataset": TASK, "fewshot_split": "train"}]}, "ood[0].fewshot_split", "its YAML's fewshot_split"),
    # a lab set's evaluation is checked at submit too, not after the teacher and students are trained
    ({"ood": [{"dataset": TASK}, {"dataset": "arc_easy"}]}, "ood[1].split", "no 'test' split"),
    ({"ood": [{"dataset": "arc_easy", "split": "validation", "num_fewshot": 2}]}, "ood[0].fewshot_split", "no 'train'"),
])
def test_first_refuses_at_submit_what_cannot_work_naming_the_field(values, field, says):
    with pytest.raises(ConfigError) as e:
        parse_config({"kind": "first", **values})
    assert str(e.value).startswith(f"{field}: ") and says in str(e.value)


@pytest.mark.unit
def test_cft_keeps_lab_ood_entries_as_before_and_an_lm_eval_one_as_written():
    entry = {"dataset": TASK, "limit": 4, "num_fewshot": 1}
    _, cfg = parse_config({"kind": "cft", "ood": [{"dataset": "arc_challenge", "limit": 5}, entry]})
    assert cfg.ood == [{"dataset": "arc_challenge", "limit": 5, "split": "test", "data_files": ["bundled"],
                        "subject": None}, entry]
    task = cfg.eval_config("bundled", None, cfg.ood[1])
    assert (task.scoring, task.template, task.num_fewshot) == ("cloze", "lm_eval", 1)
    lab = cfg.eval_config("bundled", None, cfg.ood[0])
    assert (lab.dataset, lab.scoring, lab.template, lab.num_fewshot) == ("arc_challenge", "letter", "cft_chat", None)


@pytest.mark.unit
@pytest.mark.parametrize("values, field, says", [
    ({"in_domain": [{"dataset": "obqa"}, {"dataset": TASK}]}, "in_domain[1].dataset", "out-of-domain sets"),
    ({"ood": [{"dataset": "arc_challenge", "num_fewshot": 2}]}, "ood[0].num_fewshot", "applies to an lm-eval task"),
    ({"ood": [{"dataset": TASK, "fewshot_split": "train"}]}, "ood[0].fewshot_split", "its YAML's fewshot_split"),
    ({"ood": [{"dataset": TASK, "subject": "anatomy"}]}, "ood[0].subject", "name a subtask"),
])
def test_cft_refuses_at_submit_what_cannot_work_naming_the_field(values, field, says):
    with pytest.raises(ConfigError) as e:
        parse_config({"kind": "cft", **values})
    assert str(e.value).startswith(f"{field}: ") and says in str(e.value)


def _metrics(directory) -> dict:
    return json.loads((directory / "metrics.json").read_text())


@pytest.mark.model
def test_first_evaluates_a_model_on_an_lm_eval_ood_set_as_evaluate_does(tiny_model_dir, tmp_path):
    _, cfg = parse_config({"kind": "first", "teacher": str(tiny_model_dir), "student": str(tiny_model_dir),
                           "test_limit": 3, "bootstrap": 0, "device": "cpu",
                           "ood": [{"dataset": TASK, "limit": 3, "num_fewshot": 1}]})
    rows = evaluate_model(cfg, "teacher", {"model": str(tiny_model_dir), "adapter": None}, tmp_path,
                          EventWriter(tmp_path / "events.jsonl"), {"best": 1.0})
    assert [(r["set"], r["in_domain"], r["scoring"], r["n"]) for r in rows] == [
        ("obqa", True, "letter", 3), (TASK, False, "cloze", 3)]
    task = _metrics(tmp_path / "eval" / "teacher-lm-eval-bundled_arc_easy")
    assert task["template"] == "lm_eval" and task["lm_eval"]["tasks"]["bundled_arc_easy"]["shots"] == 1
    assert 0 <= task["accuracy_norm"] <= 1 and 0 <= task["ece"] <= 1
    predictions = [json.loads(line) for line in
                   (tmp_path / "eval" / "teacher-lm-eval-bundled_arc_easy" / "predictions.jsonl").read_text().splitlines()]
    assert [p["doc_id"] for p in predictions] == [0, 1, 2] and all("Answer:" in p["context"] for p in predictions)
    assert yaml.safe_load((tmp_path / "eval" / "teacher-obqa" / "config.yaml").read_text())["template"] == cfg.template


@pytest.mark.model
def test_cft_evaluates_and_temperature_scales_an_lm_eval_ood_set(tiny_model_dir, tmp_path):
    _, cfg = parse_config({
        "kind": "cft", "model": str(tiny_model_dir), "in_domain": [{"dataset": "obqa", "split": "train", "limit": 12}],
        "train_size": 4, "val_size": 4, "test_size": 3, "ood": [{"dataset": TASK, "limit": 3, "num_fewshot": 1}],
        "preference_limit": 2, "max_response_tokens": 8, "bootstrap": 0, "device": "cpu"})
    protocol = _Protocol(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"), lambda: False)
    results = protocol.evaluate("base", {"model": str(tiny_model_dir), "adapter": None}, with_validation=True)
    assert (results["in_domain"]["scoring"], results[TASK]["scoring"]) == ("letter", "cloze")
    assert results[TASK]["n"] == 3 and results[TASK]["dataset"] == TASK
    assert results[TASK]["lm_eval"]["tasks"]["bundled_arc_easy"]["shots"] == 1
    scaled = protocol.temperature()
    ts = _metrics(tmp_path / "eval" / "ts-lm-eval-bundled_arc_easy")
    assert scaled[TASK]["scoring"] == ts["scoring"] == "cloze" and ts["lm_eval"] == results[TASK]["lm_eval"]
    assert ts["temperature"] == scaled["fit"]["temperature"] and ts["n"] == 3
    assert "lm_eval" not in _metrics(tmp_path / "eval" / "ts-in_domain")
    # The report says how the lm-eval set's confidence differs from the letters' of the other sets.
    temperature = {**scaled.pop("fit"), "fits": scaled.pop("fits")}
    write_report(tmp_path, cfg, {"base": results, "ts": {**scaled, "winrate": results["winrate"]}}, temperature, {})
    md = (tmp_path / "report.md").read_text()
    assert f"On {TASK} (lm-eval tasks), confidence is the softmax over the options' summed log-likelihoods" in md
    assert f"{TASK} (out-of-domain, n=3)" in md
