"""CFT/RCFT trainers and the protocol job on a tiny random model."""
import json

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from lab.core.events import EventWriter, read_events
from lab.data.record import MCQRecord
from lab.kinds.cft.config import CftConfig
from lab.kinds.cft.report import temperature_notes
from lab.kinds.cft.run import run_cft
from lab.training.cft import LabelSmoothingTrainer, RCFTTrainer
from lab.training.cft_losses import ece_regulariser, option_smoothing_loss
from lab.training.config import TrainConfig
from lab.training.data import IGNORE, build_examples, pad_option_batch
from lab.training.trainer import finetune

RECORDS = [MCQRecord("a", "Where do fish live?", ("tree", "water", "sky"), 1, "t"),
           MCQRecord("b", "What is hot?", ("ice", "snow", "fire", "rain"), 2, "t"),
           MCQRecord("c", "Which is a fruit?", ("apple", "stone"), 0, "t")]


@pytest.fixture
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def _batch(tok, completion_only):
    examples = build_examples(RECORDS, "cft_chat", tok, completion_only=completion_only)
    return pad_option_batch(examples, tok.pad_token_id)


def _args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)


@pytest.mark.model
def test_examples_know_their_answer_position_and_option_letters(tiny):
    _, tok = tiny
    batch = _batch(tok, completion_only=False)
    for row, record in enumerate(RECORDS):
        letters = [tok.decode([int(t)]) for t in batch["option_ids"][row] if t >= 0]
        assert letters == ["A", "B", "C", "D"][: len(record.choices)]
        answer_token = batch["input_ids"][row, batch["answer_pos"][row] + 1]
        assert answer_token == batch["option_ids"][row, record.answer]
    assert batch["option_mask"].sum(-1).tolist() == [3, 4, 2]


@pytest.mark.model
def test_rcft_with_lambda_zero_is_plain_sft_and_adds_lambda_times_the_regulariser(tiny, tmp_path):
    model, tok = tiny
    batch = _batch(tok, completion_only=False)
    plain = Trainer(model=model, args=_args(tmp_path))
    sft = plain.compute_loss(model, {k: batch[k] for k in ("input_ids", "attention_mask", "labels")})

    def rcft(lam):
        return RCFTTrainer(model=model, args=_args(tmp_path), ece_lambda=lam, n_bins=10, estep_steps=None,
                           estep=lambda m: [], answers=[], on_estep=lambda **fields: None)

    zero = rcft(0.0)
    zero.bin_acc = torch.full((10,), 0.25, dtype=torch.float64)
    torch.testing.assert_close(zero.compute_loss(model, dict(batch)), sft)
    two = rcft(2.0)
    two.bin_acc = zero.bin_acc
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    answer_logits = logits[torch.arange(3), batch["answer_pos"]]
    reg, _ = ece_regulariser(answer_logits.gather(1, batch["option_ids"].clamp(min=0)), batch["option_mask"],
                             two.bin_acc)
    assert float(reg) > 0
    torch.testing.assert_close(two.compute_loss(model, dict(batch)), sft + 2.0 * reg, atol=1e-5, rtol=1e-5)
    released = rcft(0.4)
    released.lambda_scale, released.bin_acc = "released", zero.bin_acc
    released.bin_counts = torch.full((10,), 5.0, dtype=torch.float64)
    per_bin, _ = ece_regulariser(answer_logits.gather(1, batch["option_ids"].clamp(min=0)), batch["option_mask"],
                                 two.bin_acc, released.bin_counts)
    torch.testing.assert_close(released.compute_loss(model, dict(batch)), 0.6 * sft + 0.4 * 1e-3 * per_bin,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.model
@pytest.mark.parametrize("completion_only", [True, False])
def test_label_smoothing_zero_is_plain_sft_and_smooths_only_the_answer_token(tiny, tmp_path, completion_only):
    model, tok = tiny
    batch = _batch(tok, completion_only)
    sft = Trainer(model=model, args=_args(tmp_path)).compute_loss(
        model, {k: batch[k] for k in ("input_ids", "attention_mask", "labels")})
    zero = LabelSmoothingTrainer(model=model, args=_args(tmp_path), epsilon=0.0)
    torch.testing.assert_close(zero.compute_loss(model, dict(batch)), sft, atol=1e-5, rtol=1e-5)
    eps = 0.2
    smoothed = LabelSmoothingTrainer(model=model, args=_args(tmp_path), epsilon=eps).compute_loss(model, dict(batch))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    rows = torch.arange(3)
    answer_logits = logits[rows, batch["answer_pos"]]
    n_tokens = (batch["labels"][:, 1:] != IGNORE).sum()
    change = (option_smoothing_loss(answer_logits, batch["option_ids"], batch["option_mask"], batch["answer"], eps)
              - option_smoothing_loss(answer_logits, batch["option_ids"], batch["option_mask"], batch["answer"], 0.0))
    torch.testing.assert_close(smoothed, sft + change.sum() / n_tokens, atol=1e-5, rtol=1e-5)


@pytest.mark.model
def test_rcft_finetune_runs_the_e_step_every_epoch_or_every_n_steps(tiny_model_dir, tmp_path):
    records = RECORDS * 4
    common = dict(model=str(tiny_model_dir), dataset="csqa", template="cft_chat", objective="rcft", completion_only=False,
                  epochs=2, batch_size=4, learning_rate=1e-3, warmup_ratio=0.0, ece_lambda=1.0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    events = EventWriter(tmp_path / "a" / "events.jsonl")
    result = finetune(TrainConfig(**common), tmp_path / "a", events, records=records, val=RECORDS)
    seen, _ = read_events(tmp_path / "a" / "events.jsonl")
    esteps = [e for e in seen if e["stage"] == "train_estep"]
    assert [e["step"] for e in esteps] == [0, 3]  # before epoch 1 and before epoch 2 (3 steps per epoch)
    assert sum(esteps[0]["counts"]) == 12 and len(esteps[0]["accuracy"]) == 10
    steps = [e for e in seen if e["stage"] == "train"]
    assert len(steps) == 6 and all("loss_ece" in e and "loss_sft" in e for e in steps)
    # A.4's condition: the share of rows whose targets would rank another option first
    assert all(0.0 <= e["rank_violations"] <= 1.0 for e in esteps + steps[1:])
    assert [h["epoch"] for h in result["history"]] == [1.0, 2.0]
    finetune(TrainConfig(**common, estep_steps=2, eval_steps=2), tmp_path / "b", EventWriter(tmp_path / "b" / "events.jsonl"),
             records=records, val=RECORDS)
    seen, _ = read_events(tmp_path / "b" / "events.jsonl")
    assert [e["step"] for e in seen if e["stage"] == "train_estep"] == [0, 2, 4]
    assert [e["step"] for e in seen if e["stage"] == "train_eval"] == [2, 3, 4, 6]  # every 2 steps and every epoch end


@pytest.mark.unit
def test_cft_config_refuses_bad_values():
    with pytest.raises(ValueError, match=r"^methods\[1\]: must be one of 'ts', 'ls', 'cft', 'rcft', got 'dpo'"):
        CftConfig.from_dict({"methods": ["ts", "dpo"]})
    with pytest.raises(ValueError, match="^training.objective: may not be set here: the protocol sets it"):
        CftConfig.from_dict({"training": {"objective": "rcft"}})
    with pytest.raises(ValueError, match="^training.epoch: unknown key; did you mean epochs"):
        CftConfig.from_dict({"training": {"epoch": 3}})
    with pytest.raises(ValueError, match=r"^lambdas\[0\]: must be a finite number ≥ 0"):
        CftConfig.from_dict({"lambdas": [-1]})
    with pytest.raises(ValueError, match=r"^in_domain\[0\].limit: must be an integer ≥ 1"):
        CftConfig.from_dict({"in_domain": [{"dataset": "mmlu", "limit": 0}]})
    with pytest.raises(ValueError, match=r"^in_domain\[0\].n: this key moved: write it as limit"):
        CftConfig.from_dict({"in_domain": [{"dataset": "mmlu", "n": 10}]})
    with pytest.raises(ValueError, match="^lambdas: `rcft` needs at least one value"):
        CftConfig.from_dict({"lambdas": []})


@pytest.mark.unit
def test_cft_fits_t_by_ece_by_default_and_bins_every_ece_with_the_config_s_bin_edges():
    assert CftConfig().ts_objective == "ece"  # the paper's Appendix: T "searched ... to directly minimize the ECE"
    assert CftConfig(ts_objective="nll").ts_objective == "nll"
    cfg = CftConfig(bins=14, bin_edges="left")
    ecfg = cfg.eval_config("bundled", None, {"dataset": "mmlu"})
    assert (ecfg.bins, ecfg.bin_edges) == (14, "left")
    assert all((t.bins, t.bin_edges) == (14, "left") for _, t in cfg.rows()[2:])  # each trained row's validation ECE


@pytest.mark.unit
def test_cft_report_shows_both_temperature_fits_and_which_one_the_ts_row_uses():
    fit = {"n": 40, "bins": 10, "bin_edges": "right", "at_bound": False}
    by_ece = {**fit, "objective": "ece", "temperature": 28.652, "ece_before": 0.45, "ece_after": 0.0001,
              "nll_before": 2.1, "nll_after": 0.69, "searched": [0.05, 80.0], "widened": True}
    by_nll = {**fit, "objective": "nll", "temperature": 100.0, "ece_before": 0.45, "ece_after": 0.0148,
              "nll_before": 2.1, "nll_after": 0.6923, "searched": None, "widened": False, "at_bound": True}
    lines = temperature_notes({**by_ece, "fits": {"ece": by_ece, "nll": by_nll}})
    assert "fitted on 40 validation questions (10 bins, right-closed); the TS row uses T by ECE:" in lines[1]
    assert lines[5] == "| ECE (TS row) | 28.652 | 45.0 → 0.0 | 2.1000 → 0.6900 | grid T = 0.05…80, widened past an edge |"
    assert lines[6].startswith("| NLL | 100.000 | 45.0 → 1.5 | 2.1000 → 0.6923 | Brent over log T — at the bound")


@pytest.mark.model
@pytest.mark.e2e
def test_cft_protocol_end_to_end_and_resume(tiny_model_dir, shared_data, tmp_path):
    cfg = CftConfig(
        model=str(tiny_model_dir),
        in_domain=[{"dataset": "mmlu", "data_files": [str(shared_data / "mmlu" / "test")], "split": "test", "limit": 10},
                   {"dataset": "medmcqa", "data_files": [str(shared_data / "medmcqa" / "dev.jsonl")], "split": "validation", "limit": 10},
                   {"dataset": "obqa", "data_files": [str(shared_data / "openbookqa" / "train.jsonl")], "split": "train", "limit": 10}],
        train_size=8, val_size=12, test_size=6,
        ood=[{"dataset": "arc_challenge", "data_files": [str(shared_data / "arc_challenge" / "test.jsonl")], "limit": 5}],
        lambdas=[0.0, 1.0], preferences=[str(shared_data / "ultrafeedback_binarized_subset" / "eval.jsonl")],
        preference_limit=3, max_response_tokens=16, bootstrap=20, bin_edges="left",
        training={"method": "full", "epochs": 1, "batch_size": 4, "learning_rate": 1e-3, "max_length": 400},
    )
    report = run_cft(cfg, tmp_path, EventWriter(tmp_path / "events.jsonl"), lambda: False)
    methods = ["base", "ts", "ls", "cft", "rcft_0", "rcft_1"]
    assert [(r["method"], r["set"]) for r in report["rows"]] == [(m, s) for m in methods for s in ("in_domain", "arc_challenge")]
    assert all(r["n"] == (6 if r["in_domain"] else 5) and 0 <= r["ece"] <= 1 for r in report["rows"])
    # The TS row's T is fitted by ECE (the paper's search, now the default); the NLL fit is reported beside it.
    # The old default fitted by NLL, so this test's "nll_after < nll_before" now belongs to the NLL fit.
    t = report["temperature"]
    assert t["objective"] == "ece" and t["bin_edges"] == "left" and set(t["fits"]) == {"ece", "nll"}
    by_ece, by_nll = t["fits"]["ece"], t["fits"]["nll"]
    assert t["temperature"] == by_ece["temperature"] and by_ece["ece_after"] <= by_ece["ece_before"]
    assert by_nll["n"] == 12 and by_nll["temperature"] != pytest.approx(1.0, abs=1e-3) and by_nll["nll_after"] < by_nll["nll_before"]
    ts_row = next(r for r in report["rows"] if r["method"] == "ts" and r["set"] == "in_domain")
    assert ts_row["temperature"] == t["temperature"]
    assert all(yaml.safe_load((d / "config.yaml").read_text())["bin_edges"] == "left"
               for d in (tmp_path / "eval").iterdir() if (d / "config.yaml").exists())
    assert set(report["win_rate"]) == set(methods) and all(w["n"] == 3 for w in report["win_rate"].values())
    assert report["win_rate"]["ts"] == report["win_rate"]["base"]
    assert set(report["training"]) == {"ls", "cft", "rcft_0", "rcft_1"}
    assert all(h and h[-1]["n"] == 12 for h in report["training"].values())
    # every RCFT row's E-steps, with the share of questions whose targets break A.4's rank condition
    assert set(report["esteps"]) == {"rcft_0", "rcft_1"}
    first = report["esteps"]["rcft_1"][0]
    assert (first["step"], sum(first["counts"])) == (0, cfg.train_size) and 0 <= first["rank_violations"] <= 1
    md = (tmp_path / "report.md").read_text()
    assert "| RCFT λ=1 | 0 |" in md and "Rank broken in" in md
    assert "| RCFT λ=1 |" in md and "| Temperature scaling |" in md and "mmlu+medmcqa+obqa (in-domain, n=6)" in md
    assert "| ECE (TS row) |" in md and "| NLL |" in md
    assert json.loads((tmp_path / "ts" / "temperature.json").read_text())["temperature"] == t["temperature"]
    ts_preds = [json.loads(l) for l in (tmp_path / "eval" / "ts-in_domain" / "predictions.jsonl").read_text().splitlines()]
    assert all("raw_probs" in r for r in ts_preds)
    again = run_cft(cfg, tmp_path, EventWriter(tmp_path / "events2.jsonl"), lambda: False)
    assert again["rows"] == report["rows"]
    stages = [e for e in read_events(tmp_path / "events2.jsonl")[0] if e["stage"] == "stage"]
    assert stages == []  # everything reused
