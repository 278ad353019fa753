"""The ``dpo`` kind: TRL's DPOTrainer computes the DPO paper's loss (and IPO's and the hinge's) from
log-probabilities summed over the response's tokens, checked against the formulas with log-probs
computed by hand; a job trains, measures calibration before training and after each epoch, saves full
weights or an adapter; bad configs are refused naming the field, and bad pairs are skipped and named."""
import json
from pathlib import Path

import pytest
import torch

from lab.core.config import ConfigError
from lab.core.events import read_events
from lab.data import load, samples
from lab.data.preferences import PreferencePair
from lab.data.chat_templates import ALPACA_HEADER
from lab.jobkit.kinds import parse_config
from lab.jobkit.worker import JobContext
from lab.kinds.dpo.run import preference_examples, run_job

CALIBRATION = [{"task": "mcq", "dataset": "synthetic", "data_files": ["bundled"], "split": "test", "limit": 12,
                "scoring": "letter"}]


def _config(model: Path, **fields) -> dict:
    return {"kind": "dpo", "model": str(model), "preferences": ["bundled"], "limit": 8, "epochs": 1,
            "batch_size": 4, "learning_rate": 1e-3, "max_length": 256, "device": "cpu", "bootstrap": 20,
            "calibration": CALIBRATION, **fields}


def _run(config: dict, out: Path) -> dict:
    _, cfg = parse_config(config)
    out.mkdir(parents=True, exist_ok=True)
    return run_job(cfg, JobContext(out))


def _response_logps(model, batch) -> torch.Tensor:
    """log π(y|x) by hand: each response token's log-probability under the model, summed, prompt excluded."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return (token_logps * batch["completion_mask"][:, 1:]).sum(dim=1)


@pytest.mark.model
def test_the_loss_is_the_papers_formula_on_response_log_probs(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig

    from lab.kinds.dpo.run import trainer_class
    from lab.models.loading import load_model

    pairs = load("ultrafeedback", files=["bundled"], task="preferences", limit=2).records
    rows, _ = preference_examples(pairs)
    policy = load_model(str(tiny_model_dir), device="cpu", dtype="float32").model
    with torch.no_grad():  # the policy moved away from the reference, so that the log-ratios are not zero
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    reference = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    for loss_type, beta, formula in [
        ("sigmoid", 0.1, lambda d, n: -torch.nn.functional.logsigmoid(0.1 * (d[0] - d[1]))),
        ("sigmoid", 2.0, lambda d, n: -torch.nn.functional.logsigmoid(2.0 * (d[0] - d[1]))),
        ("hinge", 0.5, lambda d, n: torch.relu(1 - 0.5 * (d[0] - d[1]))),
        ("ipo", 0.5, lambda d, n: (d[0] / n[0] - d[1] / n[1] - 1 / (2 * 0.5)) ** 2),  # TRL's per-token average
    ]:
        args = DPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=[loss_type], max_length=256, report_to="none",
                         use_cpu=True, bf16=False, gradient_checkpointing=False, per_device_train_batch_size=2)
        trainer = trainer_class({})(model=policy, ref_model=reference.model, args=args,
                                    processing_class=reference.tokenizer, train_dataset=Dataset.from_list(rows))
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])  # [chosen…, rejected…]
        policy.eval()
        with torch.no_grad():
            loss = trainer.compute_loss(policy, batch)
        logratio = _response_logps(policy, batch) - _response_logps(reference.model, batch)
        n_tokens = batch["completion_mask"].sum(dim=1).float()
        assert logratio.abs().min() > 1e-3  # a real difference between policy and reference, not 0 = 0
        by_hand = formula(logratio.chunk(2), n_tokens.chunk(2)).mean()
        assert loss.item() == pytest.approx(by_hand.item(), rel=1e-4, abs=1e-6), loss_type


@pytest.mark.model
def test_the_reference_is_a_second_copy_for_full_training_and_the_base_under_lora(tiny_model_dir, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig

    from lab.kinds.dpo.run import trainer_class
    from lab.training.trainer import prepare_model

    rows, _ = preference_examples(load("ultrafeedback", files=["bundled"], task="preferences", limit=2).records)
    args = DPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                     gradient_checkpointing=False)
    _, cfg = parse_config(_config(tiny_model_dir))
    model, tokenizer, _ = prepare_model(cfg)
    trainer = trainer_class({})(model=model, args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list(rows))
    assert trainer.ref_model is not None and trainer.ref_model is not model and not trainer.ref_model.training
    assert all(torch.equal(a, b) for a, b in zip(trainer.ref_model.parameters(), model.parameters()))
    _, cfg = parse_config(_config(tiny_model_dir, method="lora", lora_r=4))
    model, tokenizer, _ = prepare_model(cfg)
    trainer = trainer_class({})(model=model, args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list(rows))
    assert trainer.ref_model is None  # TRL scores the reference with the adapter disabled


@pytest.mark.model
def test_a_dpo_job_measures_calibration_before_and_after_and_saves_the_model(tiny_model_dir, tmp_path):
    out = tmp_path / "runs" / "00001-dpo"
    summary = _run(_config(tiny_model_dir), out)
    events = read_events(out / "events.jsonl")[0]
    evals = [e for e in events if e["stage"] == "train_eval"]
    assert [e["step"] for e in evals] == [0, 2]  # before training, then after the epoch (8 pairs in batches of 4)
    assert all(e["tasks"]["t0-mcq"]["n"] == 12 for e in evals)
    assert summary["n_train"] == 8 and summary["final_t0-mcq_ece"] == evals[-1]["ece"]
    assert 0 <= summary["final_rewards_accuracies"] <= 1
    assert (out / "model" / "model.safetensors").is_file()
    assert any("reference: a frozen copy of the model" in e.get("message", "") for e in events)


@pytest.mark.model
def test_lora_dpo_saves_an_adapter_and_uses_the_base_as_reference(tiny_model_dir, tmp_path):
    out = tmp_path / "runs" / "00002-dpo"
    _run(_config(tiny_model_dir, method="lora", lora_r=4, calibration=[], loss_type="ipo"), out)
    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "model").exists()
    messages = [e.get("message", "") for e in read_events(out / "events.jsonl")[0]]
    assert any("reference: the adapter-disabled base" in m for m in messages)


@pytest.mark.model
def test_a_base_model_without_a_chat_template_is_aligned_on_alpaca_prompts(base_model_dir, tmp_path):
    from lab.kinds.dpo.run import plain_preference

    (pair,) = load("ultrafeedback", files=["bundled"], task="preferences", limit=1).records
    example = plain_preference(preference_examples([pair])[0][0])
    assert example == {"prompt": f"{ALPACA_HEADER}\n\n### Instruction:\n{pair.prompt.strip()}\n\n### Response:\n",
                       "chosen": pair.chosen, "rejected": pair.rejected}
    out = tmp_path / "runs" / "00003-dpo"
    _run(_config(base_model_dir, method="lora", lora_r=4, calibration=[]), out)
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.model
def test_bad_pairs_are_skipped_and_named(tiny_model_dir, tmp_path):
    good = [json.loads(line) for line in samples.PREFERENCES.read_text(encoding="utf-8").splitlines()[:4]]
    rows = [good[0], {**good[1], "rejected": good[1]["chosen"]}, good[2],
            {**good[3], "id": "spaced", "rejected": " " + good[3]["chosen"] + "\n"}]
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "runs" / "00003-dpo"
    summary = _run(_config(tiny_model_dir, preferences=[str(pairs_file)], calibration=[], batch_size=2), out)
    messages = [e.get("message", "") for e in read_events(out / "events.jsonl")[0]]
    assert any(f"{pairs_file}:2" in m and "the same text" in m for m in messages)  # the loader's file:line
    assert any("skipped pair spaced: 'chosen' and 'rejected' differ only in whitespace" in m for m in messages)
    assert (summary["n_train"], summary["skipped"]) == (2, 2)


@pytest.mark.unit
def test_a_blank_prompt_is_refused_by_id():
    rows, refused = preference_examples([PreferencePair("a", " ", "yes", "no"), PreferencePair("b", "Q?", "yes", "no")])
    assert refused == ["a: empty prompt"]
    assert rows == [{"prompt": [{"role": "user", "content": "Q?"}], "chosen": [{"role": "assistant", "content": "yes"}],
                     "rejected": [{"role": "assistant", "content": "no"}]}]


@pytest.mark.unit
@pytest.mark.parametrize("fields, message", [
    ({"beta": 0}, r"^beta: must be"),
    ({"beta": 11}, r"^beta: must be"),
    ({"loss_type": "kto"}, r"^loss_type: must be one of 'sigmoid', 'ipo', 'hinge'"),
    ({"calibration": [{**CALIBRATION[0], "model": "bundled"}]}, r"^calibration\[0\]\.model: may not be set here"),
    ({"calibration": [{"task": "mcq", "scoring": "letter", "template": "cloze_plain"}]},
     r"^calibration\[0\]: template: 'cloze_plain' is a cloze template"),
    ({"method": "dora"}, r"^method: must be one of 'full', 'lora', 'qlora'"),
    ({"limit": 0}, r"^limit: must be"),
    ({"learning_rate": 0}, r"^learning_rate: must be"),
])
def test_a_dpo_config_is_refused_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"kind": "dpo", **fields})


@pytest.mark.unit
def test_the_defaults_are_dpo_practice():
    _, cfg = parse_config({"kind": "dpo"})
    assert (cfg.beta, cfg.loss_type, cfg.learning_rate, cfg.preferences, cfg.limit) == (0.1, "sigmoid", 5e-6,
                                                                                         ["bundled"], 64)
