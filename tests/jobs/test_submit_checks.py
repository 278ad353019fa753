"""What Submit refuses before anything is queued, naming the field (issue #15, "the first ten minutes"):
a data file a preset names that this machine lacks (said as "not found", with where it was looked
for, never as "outside the folders"), more GPUs than the machine has, a temperature that is neither
a number nor a temperature file, numbers that are not numbers; and no handler lets an exception out."""
import re
import shutil
from pathlib import Path

import pytest

from jobs import preflight
from jobs.cli import main as jobs_cli
from jobs.rebuild import check_gpus
from jobs.store import JobStore
from lab.cli import main as lab_cli
from lab.core.config import ConfigError
from lab.core.yamlio import load_yaml
from lab.data import samples
from lab.jobkit import kinds
from lab.jobkit.paths import PathNotAllowed
from tests.helpers import form_values
from ui import forms, launch_page
from ui.context import LabContext
from ui.messages import error

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATA_HOME = "~/.cache/calibration-lab/data"  # where the paper presets expect the data users supply
EXPECTED_T = "expected a positive number or a temperature.json (file or folder), got"


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A newcomer's server: an empty home (no data supplied, no cache), no hub, a CPU and no GPU."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CALIBRATION_LAB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(preflight, "visible_gpus", lambda: [])
    return LabContext(tmp_path / "runs"), home


def _preset(name: str) -> dict:
    path = EXAMPLES / f"{name}.yaml"
    return load_yaml(path.read_bytes(), path.name)


# ---------------------------------------------------------------- files a preset names
def test_a_paper_preset_whose_file_is_absent_names_the_file_and_where_it_was_looked_for(fresh, capsys):
    ctx, home = fresh
    expected = (f"data_files[0]: file not found: '{DATA_HOME}/commonsenseqa/train.jsonl' "
                "(looked for calibration-lab/data/commonsenseqa/train.jsonl)")
    with pytest.raises(ConfigError) as refused:
        ctx.submit(_preset("first-paper"))  # as the form and the API submit it
    assert str(refused.value) == expected and not isinstance(refused.value, PathNotAllowed)
    assert jobs_cli(["--root", str(ctx.runs), "submit", str(EXAMPLES / "first-paper.yaml")]) == 2
    # the command line is the operator's own shell, with no allowed folders: it names the path itself
    full = expected.replace("(looked for calibration-lab/", f"(looked for {home}/.cache/calibration-lab/")
    assert capsys.readouterr().err == f"error: {full}\n"
    assert ctx.store.list() == []


def test_picking_a_paper_preset_on_the_form_lists_everything_it_lacks(fresh):
    ctx, home = fresh
    *values, note = launch_page.choose_preset(ctx, "cft", "cft-paper")
    assert values == forms.preset_values("cft", "cft-paper") and "outside" not in note
    for rel in ("mmlu/test", "medmcqa/dev.jsonl", "openbookqa/train.jsonl",
                "ultrafeedback_binarized_subset/eval.jsonl"):
        assert f"looked for calibration-lab/data/{rel}" in note
    assert "model: unknown model &#x27;allenai/Llama-3.1-Tulu-3-8B-DPO&#x27;" in note  # not downloaded, offline
    assert "in_domain[0].data_files[0]: file not found" in note and "preferences[0]: file not found" in note
    assert launch_page.choose_preset(ctx, "cft", "cft-quick")[-1] == ""  # the bundled samples: nothing lacks


def test_once_the_files_are_supplied_the_preset_gets_past_them(fresh):
    ctx, home = fresh
    data = home / ".cache" / "calibration-lab" / "data" / "commonsenseqa"
    data.mkdir(parents=True)
    for name in ("train.jsonl", "dev.jsonl"):
        shutil.copy(samples.ROOT / "openbookqa" / "dev.jsonl", data / name)  # the AI2 format CommonsenseQA shares
    with pytest.raises(ConfigError, match=r"^teacher: unknown model 'meta-llama/Llama-2-13b-hf'"):
        ctx.submit(_preset("first-paper"))


PAPER = sorted(p.stem for p in EXAMPLES.glob("*paper*.yaml"))


def _supply(value: str, home: Path) -> None:
    """Create what a preset's ``~/...`` path names, empty: a file, or for a folder one .csv in it."""
    path = home / value.removeprefix("~/")
    if path.suffix in (".json", ".jsonl", ".csv", ".txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "supplied_test.csv").touch()


# The Pythia preset names hub lm-eval tasks, so its check reads lm-eval's whole task index (about 15 s).
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "series-pythia-paper" else name
                                  for name in PAPER])
def test_a_paper_preset_is_a_valid_config_once_its_files_and_models_are_here(fresh, name, monkeypatch):
    """What a GPU user runs is checked here, where it cannot run: with the files it names supplied (empty),
    its hub models named as the bundled one and the hub's datasets of its lm-eval tasks taken as reachable,
    every other field passes, so a misspelt field or a value out of range fails here and not on their machine."""
    from lab.core.config import walk
    from lab.data import hub_copy

    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: True)
    _, home = fresh
    config = _preset(name)
    cls = kinds.get(config["kind"]).config
    for _, spec, holder, key, _ in walk(cls, config):
        values = holder[key] if isinstance(holder[key], list) else [holder[key]]
        if spec.role == "model" and isinstance(holder[key], str):
            holder[key] = "bundled"
        for value in values:  # a path, or SPLIT=PATH
            path = value.split("=", 1)[-1] if isinstance(value, str) else ""
            if path.startswith("~/"):
                _supply(path, home)
    kinds.parse_config(config)


def test_a_missing_file_inside_the_allowed_folders_is_not_found_and_one_outside_is_outside(fresh, tmp_path):
    ctx, _ = fresh
    missing = ctx.runs / "uploads" / "mine.jsonl"
    with pytest.raises(ConfigError, match=rf"^data_files\[0\]: file not found: '{missing}' \(looked for runs/uploads/mine.jsonl\)$"):
        ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(missing)]})
    present, absent = tmp_path / "elsewhere.jsonl", tmp_path / "nowhere.jsonl"
    present.write_text('{"question": "q?", "choices": ["a", "b"], "answer": 0}\n')
    said = []
    for path in (present, absent):
        with pytest.raises(PathNotAllowed) as refused:
            ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": [str(path)]})
        said.append(str(refused.value).replace(str(path), "PATH"))
    assert said[0] == said[1]  # the same words whether it exists or not: nothing learnt about outside
    assert ctx.store.list() == []


# ---------------------------------------------------------------- GPUs
def test_more_gpus_than_the_machine_has_are_refused_at_submit(fresh, monkeypatch):
    ctx, _ = fresh
    with pytest.raises(ConfigError, match=r"^gpus: this machine has no GPU; set GPUs to 0$"):
        ctx.submit({"kind": "evaluate"}, gpus=1)
    assert launch_page.submit_form(ctx, "evaluate", 1, 1, *form_values("evaluate")) == error(
        "gpus: this machine has no GPU; set GPUs to 0")
    monkeypatch.setattr(preflight, "visible_gpus", lambda: [0])
    with pytest.raises(ConfigError, match=r"^gpus: asked for 2 GPUs, but this machine has 1; set GPUs to 1 or fewer$"):
        ctx.submit({"kind": "evaluate"}, gpus=2)
    assert ctx.store.list() == []
    assert ctx.submit({"kind": "evaluate"}, gpus=1).gpus == 1


def test_the_command_line_may_queue_for_a_scheduler_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "visible_gpus", lambda: [])
    assert JobStore(tmp_path / "runs").submit({"kind": "evaluate"}, gpus=2).status == "queued"


@pytest.mark.parametrize("gpus", [None, "two", -1, 1.5, True])
def test_gpus_must_be_a_whole_number(gpus):
    with pytest.raises(ConfigError, match=r"^gpus: must be an integer ≥ 0"):
        check_gpus(gpus)


# ---------------------------------------------------------------- temperatures
def test_a_temperature_that_is_no_number_and_no_file_is_named_as_such(fresh, capsys):
    ctx, _ = fresh
    message = f"temperature: {EXPECTED_T} 'hot'"
    assert launch_page.submit_form(ctx, "evaluate", 0, 1, *form_values("evaluate", temperature="hot")) == error(message)
    assert launch_page.show_config(ctx, "evaluate", *form_values("evaluate", temperature="hot"))[0] == error(message)
    models = "- {model: bundled, temperature: abc}"
    assert launch_page.submit_form(ctx, "compare", 0, 1, *form_values("compare", models=models)) == error(
        f"models[0].temperature: {EXPECTED_T} 'abc'")
    assert lab_cli(["evaluate", "--temperature", "hot", "--out", str(ctx.runs / "cli")]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert ctx.store.list() == []


def test_a_temperature_path_is_looked_for_inside_and_refused_outside(fresh, tmp_path):
    ctx, _ = fresh
    inside = ctx.runs / "00001-evaluate"
    with pytest.raises(ConfigError, match=rf"^temperature: {re.escape(EXPECTED_T)} '{inside}': there is none at "):
        ctx.submit({"kind": "evaluate", "temperature": str(inside)})
    with pytest.raises(PathNotAllowed, match="outside the folders"):
        ctx.submit({"kind": "evaluate", "temperature": str(tmp_path / "t" / "temperature.json")})
    with pytest.raises(ConfigError, match=r"^temperature: must be a temperature from 0.001 to 1000"):
        ctx.submit({"kind": "evaluate", "temperature": "0"})
    inside.mkdir(parents=True)
    (inside / "temperature.json").write_text('{"temperature": 2.5}')
    assert ctx.submit({"kind": "evaluate", "temperature": str(inside)}).config_dict["temperature"].endswith(
        "temperature.json")


# ---------------------------------------------------------------- numbers, and nothing escapes
@pytest.mark.parametrize("kind, field, text, message", [
    ("evaluate", "limit", "ten", "limit: must be an integer ≥ 1 and ≤ 10,000,000, got 'ten'"),
    ("finetune", "learning_rate", "fast", "learning_rate: must be a finite number > 0 and ≤ 10, got 'fast'"),
    ("first", "train_limit", "1e400", "train_limit: must be an integer ≥ 1 and ≤ 10,000,000, got inf"),
    ("cft", "training", "epochs: many", "training.epochs: must be a finite number > 0 and ≤ 1,000, got 'many'"),
    ("extract", "k", "five", "k: must be an integer ≥ 1 and ≤ 1,000, got 'five'"),
    ("compare", "max_new_tokens", "-4", "max_new_tokens: must be an integer ≥ 1 and ≤ 512, got -4"),
])
def test_numbers_must_be_numbers(fresh, kind, field, text, message):
    ctx, _ = fresh
    assert launch_page.submit_form(ctx, kind, 0, 1, *form_values(kind, **{field: text})) == error(message)
    assert ctx.store.list() == []


def test_with_the_servers_working_folder_gone_the_form_still_answers(fresh, tmp_path, monkeypatch):
    """What made the bare "Error": a relative value is resolved against the working folder, and
    os.getcwd() raises FileNotFoundError once that folder is removed under a running server."""
    ctx, _ = fresh
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert launch_page.submit_form(ctx, "evaluate", 0, 1, *form_values("evaluate", temperature="hot")) == error(
        f"temperature: {EXPECTED_T} 'hot'")
    answer = launch_page.submit_form(ctx, "evaluate", 0, 1, *form_values("evaluate", dataset="custom", data_files="q.jsonl"))
    assert answer.startswith("<div class='lab-error'>⚠️ data_files: cannot read")
    assert ctx.store.list() == []


def test_every_kinds_form_defaults_are_queued_on_a_fresh_machine(fresh):
    ctx, _ = fresh
    for kind in kinds.names():
        assert launch_page.submit_form(ctx, kind, 0, 1, *forms.preset_values(kind, None)).startswith(
            "<div class='lab-ok'>✅ Job"), kind
    queued = ctx.store.list()
    assert [job.kind for job in queued] == kinds.names() and queued[0].config_dict["data_files"] == ["bundled"]


# ---------------------------------------------------------------- the resource boxes (issue 30, S9)
RESOURCE_BOXES = {"launch-gpus-evaluate": "gpus", "launch-processes-evaluate": "processes",
                  "launch-nodes-evaluate": "slurm.nodes", "launch-gpus-per-node-evaluate": "slurm.gpus_per_node",
                  "launch-minutes-evaluate": "slurm.minutes"}


@pytest.fixture(scope="module")
def resource_boxes(tmp_path_factory) -> dict:
    """The Launch page's resource boxes, from one build of the page (about 4 s): a box's preprocessing,
    what the test asks of it, does not depend on the runs folder it was built for."""
    import gradio as gr

    with pytest.MonkeyPatch.context() as patch, gr.Blocks() as demo:
        patch.setattr(launch_page.shutil, "which", lambda name: "/usr/bin/sbatch")  # Slurm's boxes are shown
        launch_page.build_launch(LabContext(tmp_path_factory.mktemp("boxes") / "runs"))
    return {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None) in RESOURCE_BOXES}


@pytest.mark.parametrize("typed", ["NaN", "2; rm", "inf", "", "1.5"])
def test_every_resource_box_refuses_a_bad_value_naming_it(fresh, monkeypatch, resource_boxes, typed):
    """What gradio's gr.Number did with NaN or text: raise in its own preprocessing, before any
    handler, so the page said a bare "Error". Each box's value, as gradio hands it over, is answered
    by Submit with the field named, and nothing is queued."""
    ctx, _ = fresh
    monkeypatch.setattr(launch_page.shutil, "which", lambda name: "/usr/bin/sbatch")  # Slurm's boxes are checked
    boxes = resource_boxes
    assert set(boxes) == set(RESOURCE_BOXES)
    good = {"launch-gpus-evaluate": 0, "launch-processes-evaluate": 1, "launch-nodes-evaluate": 1,
            "launch-gpus-per-node-evaluate": 0, "launch-minutes-evaluate": 30}
    for elem_id, field in RESOURCE_BOXES.items():
        values = {key: boxes[key].preprocess(str(value)) for key, value in good.items()}
        values[elem_id] = boxes[elem_id].preprocess(typed)  # raised for gr.Number: the bare "Error"
        executor = "slurm" if field.startswith("slurm.") else "local"
        said = launch_page.submit_anywhere(
            ctx, "evaluate", values["launch-gpus-evaluate"], values["launch-processes-evaluate"], executor, "",
            values["launch-nodes-evaluate"], values["launch-gpus-per-node-evaluate"], values["launch-minutes-evaluate"],
            "", "", *form_values("evaluate"))
        if typed == "" and field.startswith("slurm."):
            assert "queued" in said, (field, said)  # a blank Slurm box is left to the cluster's default
        else:
            assert said.startswith(f"<div class='lab-error'>⚠️ {field}: must be an integer"), (field, said)
    assert len(ctx.store.list()) == (3 if typed == "" else 0)


# ---------------------------------------------------------------- datasets (issue 30, item 8)
def test_a_dataset_name_the_lab_does_not_know_is_refused_naming_the_field_and_the_names(fresh):
    """The dataset box takes what is typed (a dropdown that refused custom values put `obqa` back
    without a word, and Submit ran a job on it); Submit refuses an unknown name, listing the known."""
    ctx, _ = fresh
    field = next(f for f in forms.fields("evaluate") if f.name == "dataset")
    assert launch_page._widget("evaluate", field, "obqa").allow_custom_value
    said = launch_page.submit_form(ctx, "evaluate", 0, 1, *form_values("evaluate", dataset="openbookqa"))
    assert said.startswith("<div class='lab-error'>⚠️ dataset: unknown dataset &#x27;openbookqa&#x27;.")
    assert "obqa, synthetic" in said and ctx.store.list() == []


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    """Empty Hugging Face caches: no dataset was ever downloaded here."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    return tmp_path / "hf"


def test_a_hub_dataset_this_machine_cannot_load_is_refused_at_submit(fresh, no_hub_cache, monkeypatch):
    """`dataset: csqa` with no data_files means the hub copy: offline and not in the cache, the job
    failed 2 s into its run; now Submit refuses it, naming data_files, as it refuses a missing sample."""
    ctx, _ = fresh  # HF_HUB_OFFLINE=1
    config = {"kind": "evaluate", "dataset": "csqa", "data_files": []}
    with pytest.raises(ConfigError, match=r"^data_files: empty, so the Hugging Face hub copy of csqa "
                                          r"\(tau/commonsense_qa\) is meant, but HF_HUB_OFFLINE is set"):
        ctx.submit(config)
    said = launch_page.submit_form(ctx, "evaluate", 0, 1, *form_values("evaluate", dataset="csqa", data_files=""))
    assert said.startswith("<div class='lab-error'>⚠️ data_files: empty, so the Hugging Face hub copy of csqa")
    assert "set data_files" in said
    with pytest.raises(ConfigError, match=r"^data_files: empty, so the Hugging Face hub copy of custom is meant, but custom has no copy on the Hugging Face hub"):
        ctx.submit({"kind": "evaluate", "dataset": "custom", "data_files": []})
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("lab.data.hub_copy.hub_reachable", lambda: False)
    with pytest.raises(ConfigError, match=r"^data_files: empty, .* the Hugging Face hub cannot be reached"):
        ctx.submit(config)
    with pytest.raises(ConfigError, match=r"^in_domain\[0\]\.data_files: empty, so the Hugging Face hub copy of mmlu"):
        ctx.submit({"kind": "cft", "in_domain": [{"dataset": "mmlu", "data_files": []}]})
    assert ctx.store.list() == []


def test_a_hub_dataset_in_the_cache_or_online_is_accepted(fresh, no_hub_cache, monkeypatch):
    ctx, _ = fresh
    (no_hub_cache / "datasets" / "tau___commonsense_qa").mkdir(parents=True)  # where load_dataset caches it
    assert ctx.submit({"kind": "evaluate", "dataset": "csqa", "data_files": []}).config_dict["data_files"] == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("lab.data.hub_copy.hub_reachable", lambda: True)
    assert ctx.submit({"kind": "evaluate", "dataset": "mmlu", "data_files": []}).status == "queued"


# ---------------------------------------------------------------- where a refusal shows (issue 30, item 8)
def _marked(ctx, kind: str, **changes):
    """Submit as the page does: (message, one update per form field, the "More options" accordion)."""
    return launch_page.submit_and_mark(ctx, kind, "0", "1", "local", "", "1", "0", "30", "", "",
                                       *form_values(kind, **changes))


def test_a_refused_field_is_marked_with_its_message_and_the_others_cleared(fresh):
    """The message showed under Submit, below the fold of a 1,878 px form; now the field it names is
    marked and says why (its own info line), and is opened and scrolled to if under "More options"."""
    ctx, _ = fresh
    names = [f.name for f in forms.fields("evaluate")]
    message, *marks, more = _marked(ctx, "evaluate", limit="six")
    assert "limit: must be an integer" in message
    limit = marks[names.index("limit")]
    assert limit["elem_classes"] == [launch_page.REFUSED] and "must be an integer" in limit["info"]
    assert all(m["elem_classes"] == [] for n, m in zip(names, marks) if n != "limit")
    assert more == {"__type__": "update"}  # limit is a key field: "More options" is left as it is
    message, *marks, more = _marked(ctx, "evaluate", bins="many")
    assert marks[names.index("bins")]["elem_classes"] == [launch_page.REFUSED] and more["open"] is True
    message, *marks, more = _marked(ctx, "evaluate")
    assert "queued" in message and all(m["elem_classes"] == [] for m in marks)
    assert marks[names.index("limit")]["info"] == forms.fields("evaluate")[names.index("limit")].help


# ---------------------------------------------------------------- a task its dataset cannot feed (issue 43, R15)
@pytest.mark.parametrize("config, expected", [
    ({"task": "clm", "dataset": "trex"}, "split: the bundled sample of trex has no 'validation' split; it has test. "
                                         "Ask for one of those, or carve one from it, e.g. 'test:validation'"),
    ({"task": "mcq", "dataset": "text"}, "dataset: dataset 'text' holds texts, not questions: use task clm"),
    ({"dataset": "obqa", "split": "heldout"}, "split: Unknown split 'heldout'"),
])
def test_a_dataset_that_cannot_feed_the_task_or_split_is_refused_at_submit(fresh, config, expected):
    """Each passed Submit and failed once the job had started; now refused by field before it is queued."""
    ctx, _ = fresh
    with pytest.raises(ConfigError) as refused:
        ctx.submit({"kind": "evaluate", "model": "bundled", **config})
    assert str(refused.value).startswith(expected) and ctx.store.list() == []
    ctx.submit({"kind": "evaluate", "model": "bundled", **config, "split": "test",
                **({"task": "clm"} if config.get("dataset") == "text" else {})})  # the mended config is queued
