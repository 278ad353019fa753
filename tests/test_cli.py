"""``python -m lab evaluate`` end to end on the bundled model, and its bad-input paths."""
import json

import numpy as np
import pytest

from lab.cli import main
from lab.evaluate import EvalConfig

REQUIRED = {"n", "accuracy", "ece", "cw_ece", "mce", "brier", "nll", "trust", "n_bins", "scoring", "model", "dataset"}


def _run(tmp_path, shared_data, *extra):
    out = tmp_path / "run"
    argv = ["evaluate", "--model", "bundled", "--dataset", "arc_challenge", "--data-files",
            str(shared_data / "arc_challenge" / "test.jsonl"), "--limit", "8", "--out", str(out), *extra]
    return main(argv), out


def _independent_metrics(rows, n_bins):
    """Recompute from predictions.jsonl with torchmetrics and explicit formulas."""
    import torch
    from torchmetrics.functional.classification import multiclass_calibration_error

    width = max(len(r["probs"]) for r in rows)
    probs = np.array([r["probs"] + [0.0] * (width - len(r["probs"])) for r in rows])
    y = np.array([r["answer"] for r in rows])
    onehot = np.eye(width)[y]
    return {
        "accuracy": float(np.mean(probs.argmax(1) == y)),
        "ece": float(multiclass_calibration_error(torch.tensor(probs), torch.tensor(y), num_classes=width,
                                                  n_bins=n_bins, norm="l1")),
        "brier": float(np.mean(((probs - onehot) ** 2).sum(1))),
        "nll": float(np.mean(-np.log(probs[np.arange(len(y)), y]))),
    }


@pytest.mark.parametrize("scoring", ["letter", "cloze"])
def test_evaluate_writes_metrics_that_match_an_independent_recomputation(tmp_path, shared_data, scoring, capsys):
    code, out = _run(tmp_path, shared_data, "--scoring", scoring, "--bins", "5")
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert REQUIRED <= set(metrics) and metrics["n"] == len(rows) == 8
    assert metrics["scoring"] == scoring and metrics["n_bins"] == 5 and metrics["dataset"] == "arc_challenge"
    for key, value in _independent_metrics(rows, 5).items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
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
    assert "accuracy=" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "arc_chalenge"], "Did you mean 'arc_challenge'"),
    (["--dataset", "arc_challenge", "--data-files", "/nonexistent/test.jsonl"], "/nonexistent/test.jsonl"),
    (["--dataset", "arc_challenge", "--scoring", "cloze", "--template", "first"], "letter template"),
    (["--model", "./no/such/model", "--dataset", "custom", "--data-files", "{ok}"], "does not exist"),
    (["--batch-size", "0"], "batch_size"),
])
def test_bad_input_exits_2_with_one_clear_line(tmp_path, argv, message, capsys):
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"question": "2+2?", "choices": ["3", "4"], "answer": "B"}\n')
    argv = [a.format(ok=ok) for a in argv]
    assert main(["evaluate", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_malformed_custom_file_is_rejected_with_file_and_line(tmp_path, capsys):
    data = tmp_path / "mine.jsonl"
    data.write_text('{"question": "2+2?", "choices": ["3", "4"], "answer": "B"}\n'
                    '{"question": "1+1?", "choices": ["2", "3"], "answer": "7"}\n')
    argv = ["evaluate", "--dataset", "custom", "--data-files", str(data), "--on-bad-rows", "error",
            "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert f"{data}:2" in capsys.readouterr().err


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="Unknown evaluate option"):
        EvalConfig.from_dict({"modle": "bundled"})
