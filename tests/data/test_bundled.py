"""The dataset samples bundled with the package (lab/data/bundled/), named `data_files: [bundled]`:
each loads with its splits, through the loader and through a config; every kind's defaults and every
`*-quick` preset resolve and load on a machine with no network and no ../shared; the token is a
whole entry, never a path prefix; and one evaluation runs end to end on them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.core import hub
from lab.core.config import ConfigError, walk
from lab.core.yamlio import load_yaml
from lab.data import DATASETS, DataError, hub_copy, load, samples, with_sample
from lab.jobkit import kinds, pipeline
from lab.jobkit.kinds import parse_config
from lab.jobkit.paths import PathNotAllowed
from lab.models.weights import NAMED_MODELS
from ui import forms
from tests.helpers import script_module

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
EXAMPLES = REPO / "examples"
# A pipeline file (pipeline-quick) queues several jobs, not one: its stages are checked as quick presets are, below.
QUICK_FILES = sorted(EXAMPLES.glob("*-quick.yaml"))
PIPELINES = [p for p in QUICK_FILES if pipeline.is_pipeline(load_yaml(p.read_bytes(), p.name))]
QUICK = [p for p in QUICK_FILES if p not in PIPELINES]
NOTES = {"SOURCES.md", "LICENSES", "lm_eval"}  # beside the data, not data (lm_eval: task YAMLs over it, tested in test_harness)
# (dataset, split asked for, rows): the counts of lab/data/bundled/SOURCES.md
SPLITS = [("obqa", "train", 2000), ("obqa", "validation", 500), ("obqa", "dev", 500), ("obqa", "test", 500),
          ("mmlu", "dev", 285), ("mmlu", "validation", 1531), ("mmlu", "val", 1531),
          ("medmcqa", "validation", 1000), ("arc_challenge", "validation", 299), ("arc_challenge", "test", 1172),
          ("arc_easy", "validation", 570), ("boolq", "validation", 500)]

_touched: list[str] = []  # what was opened or listed under ../shared while a test watched


def _audit(event: str, args: tuple) -> None:
    watched = event in ("open", "os.listdir", "os.scandir", "glob.glob")
    if watched and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path and os.path.realpath(path).startswith(str(SHARED)):
            _touched.append(f"{event} {path}")


sys.addaudithook(_audit)  # audit hooks stay for the process: this one only records


@pytest.fixture
def offline_without_shared(monkeypatch):
    """A user's machine: the hub unreachable (and not the HF cache's offline mode, which would read
    a local copy), and nothing read from ../shared (every open and listing there is recorded)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: False)
    _touched.clear()
    yield
    assert _touched == [], _touched[:10]


def _stored_and_rerun(kind: str, cfg, roots) -> None:
    """What the store keeps resolves to itself: a clone or the worker's rereading changes nothing."""
    again = parse_config({"kind": kind, **cfg.to_dict()}, roots)[1]
    assert again.to_dict() == cfg.to_dict()


def _loads(kind: str, cfg) -> dict[str, int]:
    """Every split of data a job of this kind reads, loaded as the job loads it: {what: rows}."""
    values = cfg.to_dict()
    wanted = {"evaluate": ("split",), "finetune": ("split", "val_split"), "extract": ("split",),
              "first": ("train_split", "val_split", "test_split")}.get(kind, ())
    loaded = {f"{kind}.{s}": len(load(values["dataset"], values[s], values["data_files"]).records)
              for s in wanted}
    for path, _, holder, key, _ in walk(kinds.get(kind).config, values):
        if key in ("in_domain", "ood"):
            for i, entry in enumerate(holder[key]):
                data = load(entry["dataset"], entry.get("split", "test"), entry.get("data_files"))
                loaded[f"{path}[{i}]"] = len(data.records)
    if values.get("preferences"):
        loaded["preferences"] = len(load("ultrafeedback", files=values["preferences"], task="preferences",
                                         limit=values.get("preference_limit")).records)
    if kind == "sft":
        loaded["sft.split"] = len(load(values["dataset"], values["split"], values["data_files"], task="sft").records)
    for key in ("tasks", "calibration"):  # evaluate configs of a series or a training stage
        for i in range(len(values.get(key) or [])):
            task = cfg.task_config(i, "bundled", None, *([cfg.seed] if kind == "series" else []))
            data = (load(task.dataset, task.split, task.data_files) if task.task == "mcq" else
                    load(task.dataset, task.split, task.data_files, task=task.task))
            loaded[f"{key}[{i}]"] = len(data.records)
    for i, entry in enumerate(values.get("models") or []):  # a series' train entries
        if entry.get("train"):
            train = entry["train"]
            loaded[f"models[{i}].train"] = len(load(train["dataset"], train.get("split", "train"),
                                                    train["data_files"]).records)
    return loaded


# ---------------------------------------------------------------- the samples themselves
@pytest.mark.unit
@pytest.mark.parametrize("name, split, n", SPLITS)
def test_each_sample_loads_every_row_and_says_it_is_the_bundled_sample(name, split, n):
    result = load(name, split, ["bundled"])
    assert len(result.records) == n and result.problems == []
    assert "from the bundled sample (" in result.source and f"({n} rows, 0 skipped)" in result.source
    assert {r.source for r in result.records} == {name} and len({r.id for r in result.records}) == n


@pytest.mark.unit
@pytest.mark.parametrize("name, split, n", SPLITS)
def test_each_sample_loads_through_a_config_naming_bundled(name, split, n, tmp_path):
    config = {"kind": "evaluate", "dataset": name, "data_files": ["bundled"], "split": split}
    _, cfg = parse_config(config, [tmp_path])  # as from a browser: the package's samples are always readable
    assert cfg.data_files == ["bundled"]  # kept as written, like `model: bundled`
    assert len(load(cfg.dataset, cfg.split, cfg.data_files).records) == n
    by_path = [f"{s}={samples.ROOT / rel}" for s, rel in DATASETS.get(name).bundled]  # its files, named by path
    assert len(load(name, split, parse_config({**config, "data_files": by_path}, [tmp_path])[1].data_files)
               .records) == n


@pytest.mark.unit
def test_the_registered_samples_are_the_files_there_and_nothing_else():
    registered = [samples.ROOT / rel for name in with_sample() for _, rel in DATASETS.get(name).bundled]
    registered.append(samples.PREFERENCES)
    assert all(path.exists() for path in registered)
    data = [p for p in samples.ROOT.rglob("*") if p.is_file() and p.relative_to(samples.ROOT).parts[0] not in NOTES]
    assert all(any(p == r or r in p.parents for r in registered) for p in data)  # no file that nothing names
    assert with_sample() == ["alpaca", "arc_challenge", "arc_easy", "boolq", "dolly", "medmcqa", "mmlu", "obqa",
                             "synthetic", "text", "trex"]


@pytest.mark.unit
def test_the_samples_are_small_and_each_file_is_accounted_for_in_sources_md():
    files = [p for p in samples.ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 5 * 2**20
    sources = (samples.ROOT / "SOURCES.md").read_text(encoding="utf-8")
    for path in files:
        rel = path.relative_to(samples.ROOT)
        if rel.parts[0] not in NOTES:
            shown = f"{rel.parent}/*_{rel.parent.name}.csv" if rel.suffix == ".csv" else str(rel)
            assert f"`{shown}`" in sources, shown
    for licence in (samples.ROOT / "LICENSES").iterdir():
        assert f"LICENSES/{licence.name}" in sources


@pytest.mark.unit
def test_the_bundled_preference_pairs_prefer_the_right_answer():
    loaded = load("ultrafeedback", files=["bundled"], task="preferences")
    pairs, problems = loaded.records, loaded.problems
    obqa = {r.id: r for r in load("obqa", "validation", ["bundled"]).records}
    assert len(pairs) == 500 and problems == []
    for pair in pairs[:50]:
        record = obqa[pair.id]
        assert pair.chosen == record.choices[record.answer] and pair.rejected in record.choices
        assert pair.rejected != pair.chosen


@pytest.mark.unit
def test_sampling_is_seeded_and_keeps_the_original_order():
    make = script_module("make_bundled_data")
    lines = [f"{i}\n".encode() for i in range(100)]
    drawn = make.sample_lines(lines, 10)
    assert drawn == make.sample_lines(lines, 10) and drawn == sorted(drawn, key=lambda b: int(b))
    assert make.sample_lines(lines, None) == lines and make.sample_lines(lines, 500) == lines


@pytest.mark.unit
def test_a_pinned_file_is_refused_unless_it_is_the_release_file(tmp_path):
    """ARC-Easy's dev file is not in ../shared/data: the script checks it by the release file's sha256."""
    make = script_module("make_bundled_data")
    [(rel, sha256)] = make.PINNED
    make.copy_pinned(rel, sha256, tmp_path / "no-source", tmp_path / "made")  # the bundled copy checks itself
    assert (tmp_path / "made" / rel).read_bytes() == (samples.ROOT / rel).read_bytes()
    changed = tmp_path / "source" / rel
    changed.parent.mkdir(parents=True)
    changed.write_bytes((samples.ROOT / rel).read_bytes().replace(b'"answerKey":"A"', b'"answerKey":"B"', 1))
    with pytest.raises(ValueError, match="not the release file's"):
        make.copy_pinned(rel, sha256, tmp_path / "source", tmp_path / "made")


@pytest.mark.e2e
def test_the_script_remakes_exactly_the_bundled_files(shared_data):
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "make_bundled_data.py"), "--source",
                            str(shared_data), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# ---------------------------------------------------------------- offline, without ../shared
@pytest.mark.unit
@pytest.mark.parametrize("kind", [k.name for k in kinds.all_kinds()])
def test_every_kinds_defaults_resolve_and_load_offline_without_shared(kind, offline_without_shared, tmp_path):
    for cfg in (parse_config({"kind": kind})[1],  # the command line / a YAML with only `kind`
                parse_config(forms.form_config(kind, forms.preset_values(kind, None)), [tmp_path])[1]):  # the form
        _stored_and_rerun(kind, cfg, [tmp_path])
        assert all(n > 0 for n in _loads(kind, cfg).values())


def _quick(config: dict, tmp_path: Path) -> str:
    """A quick config resolves from the bundled samples and model alone, and every split it reads has rows; its kind."""
    kind, cfg = parse_config(config, [tmp_path])
    for field, spec, holder, key, _ in walk(kind.config, cfg.to_dict()):
        if spec.role in ("data_files", "files") and holder[key]:
            assert holder[key] == ["bundled"], field
        if spec.role == "model":
            assert holder[key] in NAMED_MODELS, field  # the bundled model, or a scratch one made from it
    _stored_and_rerun(kind.name, cfg, [tmp_path])
    assert all(n > 0 for n in _loads(kind.name, cfg).values())
    return kind.name


@pytest.mark.unit
@pytest.mark.parametrize("path", QUICK, ids=lambda p: p.stem)
def test_every_quick_preset_resolves_and_loads_offline_without_shared(path, offline_without_shared, tmp_path):
    kind = _quick(load_yaml(path.read_bytes(), path.name), tmp_path)
    assert forms.preset_problems(kind, path.stem, [tmp_path]) == []


@pytest.mark.unit
@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_every_quick_pipeline_s_stages_resolve_and_load_offline_without_shared(path, offline_without_shared, tmp_path):
    """Each stage as a quick preset, a stage:<name> model standing for the bundled model it is trained from."""
    stages = pipeline.parse_pipeline(load_yaml(path.read_bytes(), path.name), [tmp_path], runs=tmp_path)
    for stage in stages:
        starts_from = str(stage.config.get("model", "")).startswith(pipeline.PREFIX)
        assert bool(stage.after) == starts_from, stage.name  # it waits for the stage it starts from, and only then
        _quick({**stage.config, **({"model": "bundled"} if starts_from else {})}, tmp_path)


@pytest.mark.unit
def test_there_is_a_quick_preset_for_every_kind():
    assert {k.name for k in kinds.all_kinds()} <= {p.stem.removesuffix("-quick") for p in QUICK}


# ---------------------------------------------------------------- the token, hostile shapes
@pytest.mark.unit
@pytest.mark.parametrize("entry", ["bundled/../../etc/passwd", "bundled*", "./bundled", "bundled/", "x/bundled",
                                   f"{samples.ROOT}/../../../etc/passwd", f"{samples.ROOT}/*/../../secret"])
def test_bundled_is_a_whole_entry_never_a_path_prefix(entry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError) as refused:
        parse_config({"kind": "evaluate", "dataset": "custom", "data_files": [entry]}, [tmp_path / "runs"])
    assert str(refused.value).startswith("data_files[0]: ")
    assert "passwd" not in str(refused.value).split(entry)[-1]  # nothing said beyond the value given
    with pytest.raises(ConfigError):  # on the command line too: a path, and there is none
        parse_config({"kind": "evaluate", "dataset": "custom", "data_files": [entry]})


@pytest.mark.unit
def test_a_path_inside_the_samples_is_allowed_and_one_climbing_out_of_them_is_not(tmp_path):
    inside = samples.ROOT / "openbookqa" / "test.jsonl"
    _, cfg = parse_config({"kind": "evaluate", "dataset": "obqa", "data_files": [str(inside)]}, [tmp_path])
    assert cfg.data_files == [str(inside)]
    with pytest.raises(PathNotAllowed):
        parse_config({"kind": "evaluate", "dataset": "custom",
                      "data_files": [str(samples.ROOT / ".." / ".." / "paths.py")]}, [tmp_path])


@pytest.mark.unit
def test_bundled_with_a_split_or_for_a_dataset_without_a_sample_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^data_files\[1\]: 'train=bundled': 'bundled' stands alone"):
        parse_config({"kind": "evaluate", "dataset": "obqa", "data_files": ["bundled", "train=bundled"]}, [tmp_path])
    message = ("data_files[0]: csqa has no bundled sample; 'bundled' in data_files names one for: alpaca, "
               "arc_challenge, arc_easy, boolq, dolly, medmcqa, mmlu, obqa, synthetic, text, trex.")
    with pytest.raises(ConfigError) as refused:
        parse_config({"kind": "finetune", "dataset": "csqa", "data_files": ["bundled"]}, [tmp_path])
    assert str(refused.value).startswith(message)
    with pytest.raises(ConfigError, match=r"^ood\[0\].data_files\[0\]: custom has no bundled sample"):
        parse_config({"kind": "first", "ood": [{"dataset": "custom", "data_files": ["bundled"]}]}, [tmp_path])
    with pytest.raises(DataError, match="csqa has no bundled sample"):
        load("csqa", "test", ["bundled"])


@pytest.mark.unit
def test_a_split_the_sample_lacks_is_named_with_the_splits_it_has():
    with pytest.raises(DataError, match=r"bundled sample of boolq has no 'test' split; it has: validation\. .*"
                                        r"split 'validation:test'"):
        load("boolq", "test", ["bundled"])
    assert len(load("boolq", "validation:test", ["bundled"]).records) == 50


@pytest.mark.unit
def test_the_hub_message_names_the_field_and_the_sample(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_copy, "hub_reachable", lambda: False)
    with pytest.raises(DataError) as err:
        load("obqa", "test")
    assert "set data_files (--data-files on the command line)" in str(err.value).lower()
    assert "or to [bundled], the sample of obqa that ships with the lab" in str(err.value)


# ---------------------------------------------------------------- one job end to end
@pytest.mark.model
@pytest.mark.e2e
def test_a_quick_evaluation_runs_end_to_end_on_the_bundled_data_and_model(tmp_path, bundled, offline_without_shared,
                                                                         capsys):
    from lab.cli import main

    out = tmp_path / "run"
    argv = ["evaluate", "--model", "bundled", "--dataset", "obqa", "--data-files", "bundled", "--split", "test",
            "--limit", "8", "--bootstrap", "0", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n"] == 8 and metrics["dataset"] == "obqa" and 0 <= metrics["ece"] <= 1
    assert metrics["data_source"].startswith("obqa test from the bundled sample (openbookqa/test.jsonl)")
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 8
