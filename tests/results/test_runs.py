"""The catalogue of runs (lab.results.runs): what one walk of the runs directory finds, and names from a
browser resolved back to paths, never outside the runs directory."""
import json

import pytest

from lab.results.run_configs import adapter_base
from lab.results.runs import (EvalRun, TrainedModel, evaluation, find_evaluations, job_evaluations, resolve,
                              saved_temperature, scan, store_names, topk_store)
from lab.results.walk import MAX_DEPTH
from tests.helpers import row as _row
from tests.helpers import write_eval

pytestmark = pytest.mark.unit

ROWS = [_row(0, [0.6, 0.4], 0)]


def _touch(path, text="{}"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def root(tmp_path):
    """A runs directory with one of everything, and things the catalogue must not list."""
    root = tmp_path / "runs"
    write_eval(root / "00001-evaluate", ROWS, mtime=1000)  # depth 1
    write_eval(root / "00002-cft" / "eval" / "base-in_domain", ROWS, mtime=2000)  # depth 3
    _touch(root / "00002-cft" / "ts" / "temperature.json", '{"temperature": 2.5}')
    _touch(root / "00002-cft" / "report.json")
    _touch(root / "00003-extract" / "topk" / "manifest.json")
    _touch(root / "00004-first" / "topk" / "train" / "manifest.json")
    _touch(root / "00004-first" / "other" / "manifest.json")  # not a top-k store
    _touch(root / "00005-finetune" / "config.yaml", "kind: finetune\nmodel: some/base\n")
    _touch(root / "00005-finetune" / "adapter" / "adapter_config.json")
    _touch(root / "00006-cft" / "models" / "cft" / "model" / "config.json")
    _touch(root / "00006-cft" / "models" / "cft" / "checkpoints" / "checkpoint-3" / "model" / "config.json")
    _touch(root / "00006-cft" / "models" / "cft" / "checkpoints" / "checkpoint-3" / "adapter" / "adapter_config.json")
    write_eval(root / ".trash" / "old", ROWS)  # hidden
    write_eval(root / "a" / "b" / "c" / "d" / "e" / "f", ROWS)  # deeper than MAX_DEPTH
    outside = write_eval(tmp_path / "elsewhere", ROWS)
    (root / "link").symlink_to(outside)  # a link out of the runs directory is not walked
    return root


def test_one_walk_finds_every_kind_of_thing_and_nothing_else(root):
    found = scan(root)
    assert [r.name for r in found.evaluations] == ["00002-cft/eval/base-in_domain", "00001-evaluate"]
    assert found.stores == {"00003-extract/topk": root / "00003-extract" / "topk",
                            "00004-first/topk/train": root / "00004-first" / "topk" / "train"}
    assert found.models == [
        TrainedModel(root / "00005-finetune" / "adapter", "00005-finetune", "some/base"),
        TrainedModel(root / "00006-cft" / "models" / "cft" / "model", "00006-cft/models/cft"),
    ]  # never a checkpoint
    assert found.temperatures == {"00002-cft/ts": root / "00002-cft" / "ts"}
    assert found.reports == {"00002-cft": root / "00002-cft"}
    assert store_names(root) == ["00003-extract/topk", "00004-first/topk/train"]


def test_find_evaluations_finds_plain_and_nested_runs_newest_first_and_skips_damaged(tmp_path):
    rows = [_row(0, [0.6, 0.4], 0)]
    write_eval(tmp_path / "00001-evaluate", rows, mtime=1000, accuracy=0.75, ece=0.125)
    write_eval(tmp_path / "00002-first" / "eval" / "teacher-csqa", rows, mtime=3000, dataset="csqa")
    write_eval(tmp_path / "12" / "eval" / "cft-in_domain", rows, mtime=2000, temperature=1.5)
    half = write_eval(tmp_path / "00003-evaluate", rows)
    (half / "metrics.json").write_text('{"n": 1, "accuracy": 0.')  # a job killed mid-write
    write_eval(tmp_path / "00004-evaluate", rows).joinpath("metrics.json").write_text("[1, 2]")
    (tmp_path / "00005-evaluate").mkdir()
    (tmp_path / "00005-evaluate" / "metrics.json").write_text("{}")  # no predictions.jsonl: not an evaluation
    write_eval(tmp_path / "a" / "b" / "c" / "d" / "e" / "f", rows)  # deeper than the search goes

    runs = find_evaluations(tmp_path)

    assert [r.name for r in runs] == ["00002-first/eval/teacher-csqa", "12/eval/cft-in_domain", "00001-evaluate"]
    assert runs[0].dataset == "csqa" and runs[1].temperature == 1.5
    assert runs[1].path == tmp_path / "12" / "eval" / "cft-in_domain"
    assert runs[2] == EvalRun(path=tmp_path / "00001-evaluate", name="00001-evaluate", model="bundled",
                              dataset="arc_challenge", split="test", n=1, accuracy=0.75, ece=0.125, cw_ece=0.05,
                              nll=1.0, trust=0.4, temperature=None, scoring="letter", created=1000.0)


def test_find_evaluations_of_a_missing_or_empty_root_is_empty(tmp_path):
    assert find_evaluations(tmp_path / "absent") == []
    assert find_evaluations(tmp_path) == []
    assert scan(tmp_path / "absent").stores == {}


def test_evaluation_looks_up_one_name_and_nothing_outside_the_root(tmp_path):
    root = tmp_path / "runs"
    write_eval(root / "00001-evaluate", [_row(0, [0.6, 0.4], 0)])
    outside = write_eval(tmp_path / "elsewhere", [_row(0, [0.6, 0.4], 0)])
    (root / "link").symlink_to(outside)
    assert evaluation(root, "00001-evaluate").path == (root / "00001-evaluate").resolve()
    assert evaluation(root, "00001-evaluate").n == 1
    for name in ("", "../elsewhere", "link", str(outside), "00001-evaluate/../../elsewhere", "missing"):
        assert evaluation(root, name) is None, name


@pytest.mark.parametrize("name", [None, "", "..", "../elsewhere", "/etc", "/etc/passwd", "link", "link/..",
                                  "00001-evaluate/../../elsewhere", "00001-evaluate\x00", ".trash/old", "a/b/c/d/e/f",
                                  "00006-cft/models/cft/checkpoints", 7, ["00001-evaluate"]])
def test_a_name_leading_outside_deeper_or_into_hidden_folders_resolves_to_none(root, name):
    assert resolve(root, name) is None


def test_a_listed_name_resolves_to_its_directory(root):
    real = root.resolve()
    assert resolve(root, "00002-cft/eval/base-in_domain") == real / "00002-cft" / "eval" / "base-in_domain"
    assert resolve(root, "00002-cft/eval/../eval/base-in_domain") == real / "00002-cft" / "eval" / "base-in_domain"
    assert resolve(root, ".") == real
    assert resolve(root, "a/b/c/d/e") == real / "a" / "b" / "c" / "d" / "e" and MAX_DEPTH == 5


def test_a_store_name_resolves_to_its_manifest_only_for_a_top_k_store(root):
    assert topk_store(root, "00003-extract/topk") == root.resolve() / "00003-extract" / "topk" / "manifest.json"
    for name in ("00004-first/other", "00004-first/topk", "../elsewhere", "/etc", None):
        assert topk_store(root, name) is None, name


def test_the_evaluations_of_one_job(root):
    assert [r.name for r in job_evaluations(root, root / "00002-cft")] == ["00002-cft/eval/base-in_domain"]
    assert [r.name for r in job_evaluations(root, str(root / "00001-evaluate"))] == ["00001-evaluate"]
    assert job_evaluations(root, root / "00005-finetune") == []
    for run_dir in (None, "", root.parent / "elsewhere", "/"):
        assert job_evaluations(root, run_dir) == [], run_dir


def test_a_saved_temperature_is_beside_the_run_or_its_pipelines_fitted_one_never_outside(root, tmp_path):
    pipeline_row, plain = evaluation(root, "00002-cft/eval/base-in_domain"), evaluation(root, "00001-evaluate")
    assert saved_temperature(root, pipeline_row) == 2.5  # 00002-cft/ts/, fitted by the pipeline
    _touch(tmp_path / "ts" / "temperature.json", '{"temperature": 9.0}')  # beside the runs directory
    _touch(root.parent / "eval" / "temperature.json", '{"temperature": 9.0}')
    assert saved_temperature(root, plain) is None
    _touch(plain.path / "temperature.json", '{"temperature": 1.5}')
    assert saved_temperature(root, plain) == 1.5
    _touch(plain.path / "temperature.json", "not json")
    assert saved_temperature(root, plain) is None


def test_an_adapters_base_comes_from_its_jobs_config_within_the_runs_directory(root, tmp_path):
    assert adapter_base(root, root / "00005-finetune" / "adapter") == "some/base"
    _touch(tmp_path / "config.yaml", "model: outside/model\n")  # above the runs directory: not read
    _touch(root / "00008-x" / "adapter" / "adapter_config.json")
    assert adapter_base(root, root / "00008-x" / "adapter") == "bundled"
    _touch(root / "00009-x" / "config.yaml", "model: [unclosed\n")  # not YAML: skipped, not an error
    assert adapter_base(root, root / "00009-x" / "adapter") == "bundled"
    _touch(root / "00010-first" / "config.yaml", json.dumps({"kind": "first", "student": "small/one"}))
    assert adapter_base(root, root / "00010-first" / "students" / "a" / "adapter") == "small/one"
