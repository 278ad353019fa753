"""The browser lab without a browser: forms, path checks, uploads, progress, the explore pages'
computations, and the whole app driven in-process through gradio_client."""
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import app
from jobs.store import ConfigError
from lab.calibration.temperature_files import load_temperature
from lab.core.events import EventWriter
from lab.data import DataError
from lab.kinds.evaluate.config import EvalConfig
from lab.kinds.evaluate.run import write_evaluation
from lab.models.weights import SCRATCH_SIZES
from lab.results import runs
from tests.helpers import two_option_rows
from ui import api, cases_page, forms, knowledge_page, reliability_page, results_page, temperature_page
from ui.components import AS_EVALUATED
from ui.context import LabContext
from ui.messages import error
from ui.progress import EventCache, progress
from ui.uploads import accept_upload


# ---------------------------------------------------------------- forms
@pytest.mark.unit
@pytest.mark.parametrize("kind", ["evaluate", "finetune", "first", "cft", "extract", "compare"])
def test_every_form_round_trips_its_defaults(kind):
    values = forms.preset_values(kind, None)
    if kind == "compare":  # the one config without a usable default: the question
        values[[f.name for f in forms.fields(kind)].index("question")] = "Which is larger?"
    config = forms.config_from_values(kind, values)
    assert config["kind"] == kind and set(config) - {"kind"} == {f.name for f in forms.fields(kind)}


@pytest.mark.unit
def test_presets_come_from_the_examples():
    assert {"defaults", "cft-quick", "cft-paper", "cft-cpu"} <= set(forms.presets("cft"))
    values = forms.preset_values("cft", "cft-quick")
    config = forms.config_from_values("cft", values)
    assert config["train_size"] == 8 and config["training"]["method"] == "lora"


@pytest.mark.unit
def test_presets_follow_an_edited_example_and_hand_out_copies(tmp_path, monkeypatch):
    """The examples are parsed once per state of their folder: an edited, added or removed file is read
    again, a broken one is left out, and what a caller changes in a preset is not the next caller's."""
    monkeypatch.setattr(forms, "EXAMPLES", tmp_path)
    quick = tmp_path / "mine-quick.yaml"
    quick.write_text("kind: evaluate\nlimit: 8\ndata_files: [bundled]\n")
    first = forms.presets("evaluate")
    assert first["mine-quick"] == {"limit": 8, "data_files": ["bundled"]}
    first["mine-quick"]["data_files"].append("elsewhere")
    assert forms.presets("evaluate")["mine-quick"]["data_files"] == ["bundled"]
    quick.write_text("kind: evaluate\nlimit: 16\ndata_files: [bundled]\n")  # one byte more: another stamp
    assert forms.presets("evaluate")["mine-quick"]["limit"] == 16
    (tmp_path / "broken.yaml").write_text("kind: [evaluate\n")
    assert forms.presets("evaluate") == {"defaults": {}, "mine-quick": {"limit": 16, "data_files": ["bundled"]}}
    quick.unlink()
    assert forms.presets("evaluate") == {"defaults": {}}


@pytest.mark.unit
def test_form_errors_name_the_field():
    names = [f.name for f in forms.fields("evaluate")]
    values = forms.preset_values("evaluate", None)
    values[names.index("limit")] = "ten"
    with pytest.raises(ConfigError, match="^limit: must be an integer ≥ 1 and ≤ 10,000,000, got 'ten'"):
        forms.config_from_values("evaluate", values)
    for text, shown in (("2.5", "2.5"), ("inf", "inf"), ("1e400", "inf"), ("nan", "nan"), ("-3", "-3")):
        values[names.index("limit")] = text
        with pytest.raises(ConfigError, match=f"^limit: must be an integer ≥ 1 .*, got {shown}$"):
            forms.config_from_values("evaluate", values)
    values[names.index("limit")] = ""
    values[names.index("dataset")] = "arc_chalenge"
    with pytest.raises(ConfigError, match="Did you mean 'arc_challenge'"):  # did-you-mean from the registry
        forms.config_from_values("evaluate", values)
    cft = forms.preset_values("cft", None)
    cft[[f.name for f in forms.fields("cft")].index("training")] = "epochs: [1"
    with pytest.raises(ConfigError, match="^training is not valid YAML"):
        forms.config_from_values("cft", cft)
    cft[[f.name for f in forms.fields("cft")].index("training")] = "learning_rate: .nan"
    with pytest.raises(ConfigError, match="^training.learning_rate: must be a finite number > 0 and ≤ 10, got nan"):
        forms.config_from_values("cft", cft)


# ---------------------------------------------------------------- paths (more in tests/jobkit/test_hostile_configs.py)
@pytest.mark.unit
def test_the_context_refuses_a_config_reading_outside_before_queueing(tmp_path):
    ctx = LabContext(tmp_path / "runs")
    with pytest.raises(ConfigError, match="outside the folders"):
        ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": ["/etc/hostname"]})
    assert ctx.store.list() == []


@pytest.mark.unit
def test_an_unknown_model_is_refused_at_submit_when_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub counts as unreachable, as on these machines
    ctx = LabContext(tmp_path / "runs")
    with pytest.raises(ConfigError, match="^model: unknown model 'no-such-org/no-such-model'"):
        ctx.submit({"kind": "evaluate", "model": "no-such-org/no-such-model"})
    with pytest.raises(ConfigError, match=r"^models\[1\].model: unknown model"):
        ctx.submit({"kind": "compare", "question": "Q?", "models": [{"model": "bundled"}, {"model": "nope/nope"}]})
    assert ctx.submit({"kind": "evaluate", "model": "bundled"}).status == "queued"


# ---------------------------------------------------------------- uploads
@pytest.mark.unit
def test_an_upload_is_checked_previewed_and_stored(tmp_path):
    good = tmp_path / "mine.csv"
    good.write_text("question,A,B,answer\nSky colour?,blue,green,A\nBad row,x,y,Z\n2+2?,4,5,A\n")
    up = accept_upload(good, "mine.csv", tmp_path / "uploads")
    assert up.n_questions == 2 and len(up.problems) == 1 and "mine.csv:3" in up.problems[0]
    assert list(up.preview["question"]) == ["Sky colour?", "2+2?"] and up.path.parent == tmp_path / "uploads"
    assert accept_upload(good, "mine.csv", tmp_path / "uploads").path == up.path  # same content, stored once
    with pytest.raises(DataError, match="expected a .jsonl"):
        accept_upload(good, "mine.exe", tmp_path / "uploads")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(DataError):
        accept_upload(broken, "broken.jsonl", tmp_path / "uploads")
    assert len(list((tmp_path / "uploads").iterdir())) == 1  # the unusable file was not kept


# ---------------------------------------------------------------- progress
@pytest.mark.unit
def test_progress_eta_and_incremental_events(tmp_path):
    events = [{"time": 100.0, "stage": "train", "step": 1, "total": 11},
              {"time": 110.0, "stage": "train", "step": 3, "total": 11},
              {"time": 111.0, "stage": "log", "message": "x"}]
    p = progress(events)
    assert (p.stage, p.step, p.total) == ("train", 3, 11) and p.eta_s == pytest.approx(40.0)
    assert "3/11" in p.text and "ETA 40s" in p.text
    writer, cache = EventWriter(tmp_path / "events.jsonl"), EventCache()
    writer.emit("start")
    assert [e["stage"] for e in cache.events(tmp_path)] == ["start"]
    writer.emit("train", step=1, total=2)
    assert [e["stage"] for e in cache.events(tmp_path)] == ["start", "train"]


# ---------------------------------------------------------------- explore pages
@pytest.fixture
def run_root(tmp_path):
    """Two evaluation runs written by the real writer: an over-confident model, and a pipeline row."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(200):
        logits = rng.normal(0, 1, 4)
        truth = int(rng.choice(4, p=np.exp(logits) / np.exp(logits).sum()))
        probs = np.exp(3 * logits) / np.exp(3 * logits).sum()  # three times too sharp
        pred = int(np.argmax(probs))
        rows.append({"id": f"q{i}", "source": "mmlu" if i % 2 else "obqa", "question": f"Question {i}?",
                     "choices": ["a", "b", "c", "d"], "answer": truth, "probs": probs.tolist(), "pred": pred,
                     "confidence": float(probs[pred]), "correct": pred == truth})
    cfg = EvalConfig(dataset="mmlu", bootstrap=0)
    write_evaluation(tmp_path / "00001-evaluate", rows, cfg, {"model": "toy"})
    write_evaluation(tmp_path / "00002-cft" / "eval" / "base-in_domain", rows[:50], cfg, {"model": "toy"})
    return tmp_path


def _typed(ctx, name, value, form, bins, edges=AS_EVALUATED):
    """What the temperature lab shows when ``value`` is typed into its box with nothing drawn yet:
    the page's own handler, ``typed_temperature``."""
    return temperature_page.typed_temperature(ctx, name, value, None, form, bins, edges)


@pytest.mark.unit
def test_temperature_lab_recomputes_and_saves(run_root):
    ctx = LabContext(run_root)
    text_1 = _typed(ctx, "00001-evaluate", 1.0, "logit", "10 equal-width bins").text
    text_3 = _typed(ctx, "00001-evaluate", 3.0, "logit", "10 equal-width bins").text
    ece = lambda text: float(text.split("id='ece-value'>")[1].split("%")[0])  # noqa: E731
    assert ece(text_3) < ece(text_1) / 2  # the right temperature undoes the sharpening
    assert "positive number" in _typed(ctx, "00001-evaluate", "abc", "logit", "").message
    assert "Pick" in _typed(ctx, "../../etc", 1.0, "logit", "").message  # not a found run
    assert temperature_page.stored_temperature(ctx, "00001-evaluate") is None
    saved = temperature_page.save_chosen_temperature(ctx, "00001-evaluate", 3.0, "logit")
    assert "Saved" in saved and load_temperature(run_root / "00001-evaluate") == 3.0
    assert temperature_page.stored_temperature(ctx, "00001-evaluate") == 3.0  # the slider starts there next time
    assert "logit form" in temperature_page.save_chosen_temperature(ctx, "00001-evaluate", 0.5, "paper")


@pytest.mark.unit
def test_temperature_lab_widens_its_sweep_and_its_slider_past_the_grid_edge(tmp_path):
    # 50 rows at confidence 0.99, 27 right: ECE is 0 at T* = ln 99 / ln(27/23) = 28.7, beyond the grid's 10
    # (and at c* = 0.98 / ln(27/23) = 6.1 in the paper form, beyond its 1)
    rows = two_option_rows([(0.99, 0 if i < 27 else 1) for i in range(50)])
    write_evaluation(tmp_path / "00001-evaluate", rows, EvalConfig(dataset="mmlu", bootstrap=0), {"model": "toy"})
    ctx, name, bins = LabContext(tmp_path), "00001-evaluate", "10 equal-width bins"
    text = _typed(ctx, name, 1.0, "logit", bins).text
    assert "lowest ECE at T = 28.2" in text and "so the sweep went on to T = 0.1…40" in text
    # the slider's range over the widened sweep: tests/ui/test_temperature_page.py


@pytest.mark.unit
def test_pages_bin_a_run_as_it_was_evaluated_unless_told_otherwise(tmp_path):
    # confidences 0.7 (right) and 0.65 (wrong): right-closed (Guo), both in (0.6, 0.7]: ECE |0.675 − 0.5| =
    # 0.175; left-closed (torchmetrics), 0.7 opens [0.7, 0.8): ECE (|0.7 − 1| + |0.65 − 0|) / 2 = 0.475
    rows = two_option_rows([(0.7, 0), (0.65, 1)])
    cfg = EvalConfig(dataset="mmlu", bootstrap=0)
    write_evaluation(tmp_path / "new", rows, cfg, {"model": "toy"})
    write_evaluation(tmp_path / "old", rows, cfg, {"model": "toy"})
    stored = json.loads((tmp_path / "old" / "metrics.json").read_text())
    (tmp_path / "old" / "metrics.json").write_text(json.dumps({k: v for k, v in stored.items() if k != "bin_edges"}))
    ctx = LabContext(tmp_path)
    new, old = runs.evaluation(ctx.runs, "new"), runs.evaluation(ctx.runs, "old")
    assert reliability_page.reported_summary(ctx, new, 10, "width")[0]["ece"] == pytest.approx(0.175)
    assert reliability_page.reported_summary(ctx, old, 10, "width")[0]["ece"] == pytest.approx(0.475)  # before bin_edges
    assert reliability_page.reported_summary(ctx, old, 10, "width", "right-closed (Guo et al.)")[0]["ece"] == pytest.approx(0.175)
    assert reliability_page.reported_summary(ctx, new, 10, "width", "left-closed (torchmetrics)")[0]["ece"] == pytest.approx(0.475)
    assert api.run_metrics(ctx, "old")["ece"] == pytest.approx(0.475) and api.run_metrics(ctx, "old")["bin_edges"] == "left"
    assert "bins left-closed" in _typed(ctx, "old", 1.0, "logit", "").text
    assert "bins right-closed" in _typed(ctx, "old", 1.0, "logit", "", "right-closed (Guo et al.)").text


@pytest.mark.unit
def test_reliability_cases_and_results(run_root):
    ctx = LabContext(run_root)
    figure, message = reliability_page.reliability_view(ctx, ["00001-evaluate", "00002-cft/eval/base-in_domain"],
                                                        "10 equal-mass bins", "reliability diagram")
    assert figure is not None and message.count("lab-note") == 2 and "Only 50 questions" in message  # small: flagged
    table, datasets, note = cases_page.cases_view(ctx, "00001-evaluate", "overconfident_wrong", 0.0, 1.0, "")
    assert not table["correct"].any() and list(table["confidence"]) == sorted(table["confidence"], reverse=True)
    assert set(datasets["choices"]) == {"", "mmlu", "obqa"} and "of 200 questions" in note
    only_obqa, _, _ = cases_page.cases_view(ctx, "00001-evaluate", "all", 0.0, 1.0, "obqa")
    assert set(only_obqa["dataset"]) == {"obqa"} and len(only_obqa) == 100


@pytest.mark.unit
def test_page_handlers_take_plain_values(run_root):
    """One module-level handler per page, called as the wiring calls them: no browser, no server."""
    ctx = LabContext(run_root)
    assert reliability_page.reliability_view(ctx, [], "", "reliability diagram") == (None, "Pick one or more evaluation runs.")
    assert reliability_page.reliability_view(ctx, ["../../etc"], "", "reliability diagram")[0] is None
    exported = reliability_page.export_view(ctx, ["00001-evaluate"], "10 equal-width bins", "reliability diagram")
    assert exported["visible"] and "<html>" in Path(exported["value"]).read_text()
    assert reliability_page.export_view(ctx, [], "", "")["visible"] is False
    assert temperature_page.slider_start(ctx, "00001-evaluate") == 1.0 and temperature_page.slider_start(ctx, None) == 1.0
    assert "positive number" in temperature_page.save_chosen_temperature(ctx, "00001-evaluate", -2, "logit")
    same = cases_page.same_question_view(ctx, " q3 ", ["00001-evaluate", "00002-cft/eval/base-in_domain", "/etc"])
    assert same["run"].tolist() == [runs.evaluation(run_root, "00001-evaluate").label,
                                    runs.evaluation(run_root, "00002-cft/eval/base-in_domain").label]
    assert cases_page.same_question_view(ctx, "", ["00001-evaluate"]).empty
    table = results_page.results_view(ctx)
    assert sorted(table["folder"]) == ["00001-evaluate", "00002-cft/eval/base-in_domain"]
    csv = results_page.export_csv(ctx)
    assert Path(csv["value"]) == ctx.exports / "results.csv" and "00002-cft/eval/base-in_domain" in Path(csv["value"]).read_text()
    assert knowledge_page.knowledge_view(ctx, None)[0] is None


@pytest.mark.unit
def test_the_api_handlers_and_the_caches_belong_to_one_context(run_root):
    ctx, other = LabContext(run_root), LabContext(run_root)
    assert ctx.events is ctx.events and ctx.events is not other.events
    assert ctx.results is not other.results
    assert ctx.results.predictions(runs.evaluation(run_root, "00001-evaluate")) is \
        ctx.results.predictions(runs.evaluation(run_root, "00001-evaluate"))  # read once per version of the file
    metrics = api.run_metrics(ctx, "00001-evaluate")
    assert metrics["ok"] and metrics["n"] == 200 and len(metrics["reliability"]) == 10
    assert api.run_metrics(ctx, "../00001-evaluate") == {"ok": False, "error": "No evaluation '../00001-evaluate'"}
    ctx = LabContext(run_root / "jobs")  # a runs directory of its own: job ids start at 1 again
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    status = api.job_status(ctx, job.id)
    assert status["ok"] and status["status"] == "queued" and status["evaluations"] == [] and status["log_tail"] == ""
    shutil.copytree(run_root / "00001-evaluate", Path(job.run_dir) / "eval" / "base-x")
    shutil.copytree(run_root / "00001-evaluate", Path(f"{job.run_dir}-copy"))  # another run, the same prefix
    assert api.job_status(ctx, job.id)["evaluations"] == [f"{Path(job.run_dir).name}/eval/base-x"]
    assert api.job_status(ctx, "nope") == {"ok": False, "error": "No job 'nope'"}
    assert api.submit_job(ctx, 42)["error"] == "config: must be YAML text, got int"

@pytest.mark.unit
def test_auth_is_required_off_loopback(monkeypatch):
    monkeypatch.delenv("CALIBRATION_LAB_AUTH", raising=False)
    assert app.resolve_auth("127.0.0.1", None) is None
    with pytest.raises(SystemExit, match="without a login"):
        app.resolve_auth("0.0.0.0", None)
    assert app.resolve_auth("0.0.0.0", "ada:s3cret") == ("ada", "s3cret")
    monkeypatch.setenv("CALIBRATION_LAB_AUTH", "bob:pw")
    assert app.resolve_auth("0.0.0.0", None) == ("bob", "pw")
    with pytest.raises(SystemExit, match="user:password"):
        app.resolve_auth("127.0.0.1", "nocolon")


# ---------------------------------------------------------------- the whole app, in-process
@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
def test_gradio_client_submits_an_evaluation_and_reads_its_results(served, shared_data):
    from gradio_client import Client

    ctx, url = served
    client = Client(url, verbose=False)
    bad = client.predict("kind: evaluate\ndataset: nope\n", 0, api_name="/submit_job")
    assert bad["ok"] is False and "nope" in bad["error"]
    outside = client.predict("kind: evaluate\ndataset: custom\ndata_files: [/etc/hostname]\n", 0, api_name="/submit_job")
    assert outside["ok"] is False and "outside the folders" in outside["error"]
    config = (f"kind: evaluate\nmodel: bundled\ndataset: arc_challenge\n"
              f"data_files: [{shared_data / 'arc_challenge' / 'test.jsonl'}]\nlimit: 6\nbootstrap: 50\n")
    submitted = client.predict(config, 0, api_name="/submit_job")
    assert submitted["ok"], submitted
    deadline = time.time() + 240
    while (status := client.predict(submitted["id"], api_name="/job_status"))["status"] in ("queued", "running"):
        assert time.time() < deadline, status
        time.sleep(1)
    assert status["status"] == "succeeded", status
    (name,) = status["evaluations"]
    metrics = client.predict(name, api_name="/run_metrics")
    stored = json.loads((ctx.runs / name / "metrics.json").read_text())
    assert metrics["n"] == 6 and metrics["ece"] == pytest.approx(stored["ece"]) and len(metrics["reliability"]) == 10
    assert client.predict(99999, api_name="/job_status")["ok"] is False  # the server keeps serving
    import urllib.error
    import urllib.request

    for path in ("/etc/hostname", str(ctx.runs / name / "metrics.json")):  # no file is served by path
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}gradio_api/file={path}")
        assert refused.value.code in (403, 404)


@pytest.mark.unit
def test_knowledge_page_finds_stores_and_draws_their_coverage(tmp_path):
    store = tmp_path / "00003-extract" / "topk"
    store.mkdir(parents=True)
    manifest = {"k": 5, "n_sequences": 4, "complete": True, "meta": {"model": "bundled", "dataset": "csqa", "split": "train"},
                "coverage": {"k": [1, 2, 3], "mean": [0.5, 0.7, 0.8], "min": [0.1, 0.2, 0.3], "max": [0.9, 0.95, 0.99]},
                "storage": {"k": [1, 2, 3], "bytes_per_position": [4, 8, 12]}}
    (store / "manifest.json").write_text(json.dumps(manifest))
    ctx = LabContext(tmp_path)
    assert runs.store_names(ctx.runs) == ["00003-extract/topk"]
    figure, text = knowledge_page.knowledge_view(ctx, "00003-extract/topk")
    assert "k = 5" in text and "4 sequences" in text
    assert [trace.name for trace in figure.data][-2:] == ["mean coverage", "bytes / position"]
    assert knowledge_page.knowledge_view(ctx, "../../etc")[0] is None


@pytest.mark.unit
def test_compare_page_offers_trained_models_and_adapters(tmp_path):
    from ui.compare_page import model_choices

    adapter = tmp_path / "00004-finetune" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "00004-finetune" / "config.yaml").write_text("kind: finetune\nmodel: some/base\n")
    full = tmp_path / "00005-cft" / "models" / "cft" / "model"
    full.mkdir(parents=True)
    (full / "config.json").write_text("{}")
    (tmp_path / "00005-cft" / "models" / "cft" / "checkpoints" / "checkpoint-3" / "model").mkdir(parents=True)
    assert model_choices(tmp_path) == [  # every named model (lab.models.weights.NAMED_MODELS), then the trained ones
        ("bundled", "bundled|"), *((name, f"{name}|") for name in SCRATCH_SIZES), ("00004-finetune (LoRA on some/base)", f"some/base|{adapter}"),
        ("00005-cft/models/cft (full)", f"{full}|")]


@pytest.mark.unit
def test_job_page_shows_progress_curves_activity_and_the_error(tmp_path):
    from ui.jobs_page import job_figures, job_view, jobs_table

    ctx = LabContext(tmp_path)
    job = ctx.store.submit({"kind": "finetune", "model": "bundled", "dataset": "csqa"})
    events = EventWriter(Path(job.run_dir) / "events.jsonl")
    events.emit("start", pid=1)
    events.emit("stage", name="train")
    for step in (1, 2):
        events.emit("train", step=step, total=4, epoch=step / 2, loss=2.0 / step, lr=1e-4)
    events.emit("train_eval", epoch=1.0, step=2, n=10, accuracy=0.4, ece=0.2)
    ctx.store.update(job.id, status="running", started=time.time() - 30)
    text, seen, said, config = job_view(ctx, job.id)
    training, sweep = job_figures(seen)
    assert "running" in text and "train 2/4 (50%)" in text and sweep is None and "kind: finetune" in config
    assert training is not None and "stage: train" in said
    assert jobs_table(ctx).loc[0, "progress"].startswith("train 2/4")
    ctx.store.update(job.id, status="failed", error="out of memory: lower batch_size")
    assert "What went wrong" in job_view(ctx, job.id)[0] and "lower batch_size" in job_view(ctx, job.id)[0]
    assert job_view(ctx, 999)[0] == "No job 999."


@pytest.mark.unit
def test_compare_and_jobs_handlers_take_plain_values(tmp_path):
    from ui import compare_page, components, jobs_page

    ctx = LabContext(tmp_path)
    assert compare_page.model_entry("some/base|/runs/1/adapter", " 1.5 ") == {
        "model": "some/base", "adapter": "/runs/1/adapter", "temperature": "1.5"}
    assert compare_page.model_entry(None, "2") is None
    (message, *rest), = compare_page.run_compare(ctx, "", "bundled|", None, None, None, "", "", "", "")
    assert "Type a question" in message and rest == [compare_page.gr.skip()] * 7 and ctx.lane.pid is None
    (message, *_), = compare_page.run_compare(ctx, "Q?", "/etc|", None, None, None, "", "", "", "")
    assert "models[0].model" in message and "outside the folders" in message and ctx.lane.pid is None
    assert not (tmp_path / "comparisons").exists()
    assert jobs_page.cancel_job(ctx, None) == error("Pick a job first.")
    job = ctx.store.submit({"kind": "evaluate", "model": "bundled"})
    table, picker, banner, _ = jobs_page.refresh_all(ctx, None)
    assert table.loc[0, "id"] == job.id and picker["value"] == job.id and "No scheduler" in banner
    assert "Cloned as job 2" in jobs_page.clone_job(ctx, job.id)
    listed, _ = components.follow_catalogue(ctx, runs.evaluation_choices, False, True, None, None)
    assert listed["choices"] == [] and components.binning("nonsense") == (10, "width")
