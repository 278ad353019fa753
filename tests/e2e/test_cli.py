"""``python -m lab evaluate`` end to end on the bundled model, and its bad-input paths."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.cli import main
from lab.kinds.evaluate.config import EvalConfig
from tests.helpers import script_module

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"n", "accuracy", "ece", "cw_ece", "mce", "brier", "nll", "trust", "n_bins", "scoring", "model", "dataset"}


def _run(tmp_path, shared_data, *extra):
    out = tmp_path / "run"
    argv = ["evaluate", "--model", "bundled", "--dataset", "arc_challenge", "--data-files",
            str(shared_data / "arc_challenge" / "test.jsonl"), "--limit", "8", "--out", str(out), *extra]
    return main(argv), out


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.parametrize("scoring", ["letter", "cloze"])
def test_evaluate_writes_metrics_that_match_an_independent_recomputation(tmp_path, shared_data, scoring, capsys):
    code, out = _run(tmp_path, shared_data, "--scoring", scoring, "--bins", "5")
    assert code == 0 and "accuracy=" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert REQUIRED <= set(metrics) and metrics["n"] == len(rows) == 8
    assert metrics["scoring"] == scoring and metrics["n_bins"] == 5 and metrics["dataset"] == "arc_challenge"
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "check_metrics.py"), str(out)],
                           capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.rstrip().endswith("agree"), check.stdout + check.stderr
    assert "right-closed" in check.stdout  # ECE and MCE checked by Guo's bins written out as loops
    assert ("auroc" in check.stdout) == (metrics["auroc"] is not None)  # ... and AUROC by scikit-learn
    capsys.readouterr()
    checker = script_module("check_metrics")  # the same check in this process: the checker must notice a wrong figure
    for key in ("brier", "ece"):
        metrics[key] += 1e-4
        (out / "metrics.json").write_text(json.dumps(metrics))
        assert not checker.check(out) and "DISAGREE" in capsys.readouterr().out, key
        metrics[key] -= 1e-4
    assert metrics["trust"] == pytest.approx(metrics["accuracy"] - metrics["ece"])
    for row in rows:
        assert {"id", "question", "choices", "answer", "probs", "pred", "confidence", "correct"} <= set(row)
        assert row["confidence"] == max(row["probs"]) and row["correct"] == (row["pred"] == row["answer"])
    if scoring == "letter":
        assert len(rows[0]["top_tokens"]) == 5 and 0 < metrics["option_mass_mean"] <= 1
    else:
        assert "accuracy_norm" in metrics and len(rows[0]["logliks"]) == len(rows[0]["choices"])
    config = (out / "config.yaml").read_text()
    assert f"scoring: {scoring}" in config and "limit: 8" in config


@pytest.mark.unit
@pytest.mark.parametrize("argv, message", [
    (["--dataset", "arc_chalenge"], "Did you mean 'arc_challenge'"),
    (["--dataset", "arc_challenge", "--data-files", "/nonexistent/test.jsonl"], "/nonexistent/test.jsonl"),
    (["--dataset", "arc_challenge", "--scoring", "cloze", "--template", "first"], "letter template"),
    (["--model", "./no/such/model", "--dataset", "custom", "--data-files", "{ok}"], "is not a model folder"),
    (["--batch-size", "0"], "batch_size"),
])
def test_bad_input_exits_2_with_one_clear_line(tmp_path, argv, message, capsys):
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"question": "2+2?", "choices": ["3", "4"], "answer": "B"}\n')
    argv = [a.format(ok=ok) for a in argv]
    assert main(["evaluate", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.unit
def test_malformed_custom_file_is_rejected_with_file_and_line(tmp_path, capsys):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"question": "2+2?", "choices": ["3", "4"], "answer": "B"}\n'
                    '{"question": "1+1?", "choices": ["2", "3"], "answer": "7"}\n')
    argv = ["evaluate", "--dataset", "custom", "--data-files", str(data), "--on-bad-rows", "error",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert f"{data}:2" in capsys.readouterr().err


@pytest.mark.unit
def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="^modle: unknown key; did you mean model"):
        EvalConfig.from_dict({"modle": "bundled"})


@pytest.mark.unit
def test_out_of_memory_is_reported_not_raised(tmp_path, monkeypatch, capsys):
    import torch

    import lab.cli

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(lab.cli, "evaluate", oom)
    assert main(["evaluate", "--batch-size", "64", "--out", str(tmp_path / "run")]) == 3
    assert "out of memory at --batch-size 64" in capsys.readouterr().err
