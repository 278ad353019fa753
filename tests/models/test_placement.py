"""device_map: auto (accelerate's big-model inference): a model spread over the CPU and an offload folder scores
exactly as one in memory, its folder lives inside the run directory only while the run does, and every placement
value a user may get wrong is refused at submit, naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import make_tiny_model
from lab.core.config import ConfigError
from lab.kinds.evaluate.config import EvalConfig
from lab.models import placement

# Four decoder layers of 41 KB each in float32 and a 77 KB embedding: 120 KB of CPU holds the embedding and
# not one layer more, so every layer is read from the offload folder.
CPU_BUDGET = "120KB"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("deep") / "model", layers=4)


@pytest.fixture(scope="module")
def lora_adapter(deep_model, tmp_path_factory) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lab.models.loading import peft_quietly

    with peft_quietly():
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(deep_model),
                               LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    out = tmp_path_factory.mktemp("lora") / "adapter"
    model.save_pretrained(out)
    return out


def _probs(run: Path) -> list[list[float]]:
    return [row.get("probs") or [row["target_prob"]] for row in map(json.loads, (run / "predictions.jsonl").open())]


def _spread_and_whole(tmp_path, monkeypatch, **values) -> tuple[float, list[dict]]:
    """The largest |Δp| between an evaluation in memory and one with device_map auto, and what each load of the
    spread one saw (its device map, its offload folder and whether that existed then)."""
    import lab.models.loading
    from lab.kinds.evaluate.run import evaluate

    real, seen = lab.models.loading.load_model, []

    def spy(*args, **kwargs):
        loaded = real(*args, **kwargs)
        folder = kwargs.get("offload_folder")
        seen.append({"map": dict(getattr(loaded.model, "hf_device_map", {})), "folder": folder,
                     "existed": folder is not None and folder.is_dir()})
        return loaded

    monkeypatch.setattr(lab.models.loading, "load_model", spy)
    base = {"limit": 12, "device": "cpu", **values}
    evaluate(EvalConfig.from_dict(base), tmp_path / "whole", log=lambda m: None)
    spread = EvalConfig.from_dict({**base, "device_map": "auto", "max_memory": {"cpu": CPU_BUDGET}})
    evaluate(spread, tmp_path / "spread", log=lambda m: None)
    whole, placed = _probs(tmp_path / "whole"), _probs(tmp_path / "spread")
    assert len(whole) == len(placed) > 0
    return max(abs(a - b) for u, v in zip(whole, placed) for a, b in zip(u, v)), seen[1:]


@pytest.mark.model
@pytest.mark.parametrize("scoring", ["letter", "cloze"])
def test_an_offloaded_evaluation_scores_as_one_in_memory(deep_model, tmp_path, monkeypatch, scoring):
    delta, seen = _spread_and_whole(tmp_path, monkeypatch, model=str(deep_model), scoring=scoring)
    print(f"max |Δp| {scoring}: {delta:.3g}")
    assert delta <= TOLERANCE
    (load,) = seen
    layers = [device for name, device in load["map"].items() if ".layers" in name or name.endswith("layers")]
    assert layers and set(layers) == {"disk"}, load["map"]  # every decoder layer read from the offload folder
    assert load["existed"] and load["folder"].parent == tmp_path / "spread"  # inside the run directory
    assert not load["folder"].exists()  # ... and gone once the run ended


@pytest.mark.model
def test_an_offloaded_token_task_scores_as_one_in_memory(deep_model, tmp_path, monkeypatch):
    delta, _ = _spread_and_whole(tmp_path, monkeypatch, model=str(deep_model), task="clm", limit=4)
    print(f"max |Δp| clm: {delta:.3g}")
    assert delta <= TOLERANCE


@pytest.mark.model
def test_an_adapter_is_merged_before_its_model_is_spread(deep_model, lora_adapter, tmp_path, monkeypatch):
    delta, seen = _spread_and_whole(tmp_path, monkeypatch, model=str(deep_model), adapter=str(lora_adapter),
                                    scoring="letter")
    print(f"max |Δp| letter + LoRA: {delta:.3g}")
    assert delta <= TOLERANCE and "disk" in seen[0]["map"].values()


@pytest.mark.model
def test_the_offload_folder_goes_when_the_run_fails(deep_model, tmp_path, monkeypatch):
    import lab.kinds.evaluate.run as run

    def fail(*args, **kwargs):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(run, "evaluate_records", fail)
    cfg = EvalConfig.from_dict({"model": str(deep_model), "limit": 2, "device": "cpu", "device_map": "auto",
                                "max_memory": {"cpu": CPU_BUDGET}, "offload_folder": "weights/offloaded"})
    with pytest.raises(RuntimeError, match="scoring failed"):
        run.evaluate(cfg, tmp_path / "run", log=lambda m: None)
    assert not (tmp_path / "run" / "weights" / "offloaded").exists()


# ---------------------------------------------------------------- refusals at submit
def _refusal(values: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        EvalConfig.from_dict({"device_map": "auto", **values})
    return str(caught.value)


@pytest.mark.unit
@pytest.mark.parametrize("max_memory, field, says", [
    ({"gpu0": "1GiB"}, "max_memory:", "not valid here"),
    ({"-1": "1GiB"}, "max_memory:", "not valid here"),
    ({"cpu": "lots"}, "max_memory.cpu:", "is not a size"),
    ({"cpu": "20 gigabytes"}, "max_memory.cpu:", "is not a size"),
    ({"cpu": "1e3GB"}, "max_memory.cpu:", "is not a size"),
    ({"0": "0GiB"}, "max_memory.0:", "is zero"),
    ({"cpu": "99999999GiB"}, "max_memory.cpu:", "no device holds"),
    ({"cpu": 20}, "max_memory.cpu:", "must be text"),
    ({str(i): "1GiB" for i in range(placement.MAX_DEVICES + 1)}, "max_memory:", "the limit is"),
])
def test_a_bad_max_memory_is_refused_naming_the_key(max_memory, field, says):
    message = _refusal({"max_memory": max_memory})
    assert message.startswith(field) and says in message


@pytest.mark.unit
@pytest.mark.parametrize("folder, says", [
    ("/tmp/offload", "a folder inside the run directory (a relative name)"), ("~/offload", "(a relative name)"),
    ("../offload", "(a relative name)"), ("a/../../b", "(a relative name)"), (".", "(a relative name)"),
    ("", "(a relative name)"), ("C:offload", "(a relative name)"), ("a//b", "(a relative name)"),
    ("topk", "the run keeps its own topk"), ("metrics.json", "the run keeps its own"),
])
def test_an_offload_folder_outside_the_run_directory_is_refused(folder, says):
    message = _refusal({"offload_folder": folder})
    assert message.startswith("offload_folder:") and says in message


@pytest.mark.unit
def test_a_link_leading_out_of_the_run_directory_is_refused_when_the_run_starts(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "offload").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="offload_folder: 'offload' leads out of the run directory"):
        with placement.offload_folder(tmp_path / "run", "offload"):
            pass
    (tmp_path / "run" / "mine").mkdir()  # a folder the loader did not make is neither used nor deleted
    with pytest.raises(ConfigError, match="already exists"):
        with placement.offload_folder(tmp_path / "run", "mine"):
            pass
    assert (tmp_path / "run" / "mine").is_dir()


@pytest.mark.unit
def test_placement_fields_need_device_map_auto_and_a_free_device():
    assert EvalConfig.from_dict({"max_memory": {}}).device_map == "none"
    for values, field in (({"device_map": "none", "max_memory": {"cpu": "1GiB"}}, "max_memory:"),
                          ({"device_map": "none", "offload_folder": "elsewhere"}, "offload_folder:")):
        with pytest.raises(ConfigError, match=f"^{field} applies with device_map auto"):
            EvalConfig.from_dict(values)
    assert _refusal({"device": "cuda:1"}).startswith("device: with device_map auto")
    assert _refusal({"device": "cpu", "max_memory": {"0": "1GiB"}}).startswith("max_memory.0: names a GPU")
    cfg = EvalConfig.from_dict({"device_map": "auto", "max_memory": {0: "20GiB", "cpu": "64GB"}})  # YAML's 0:
    assert cfg.max_memory == {"0": "20GiB", "cpu": "64GB"}
    assert placement.parse_max_memory(cfg.max_memory) == {0: 20 * 2**30, "cpu": 64 * 10**9}


@pytest.mark.unit
def test_sizes_are_read_as_accelerate_reads_them():
    from accelerate.utils import convert_file_size_to_int

    for text in ("20GiB", "500MiB", "20GB", "1.5GB", "750MB", "64KiB", "3KB", "0.5GiB"):
        assert placement.size_bytes("max_memory.cpu", text) == convert_file_size_to_int(text), text


@pytest.mark.model
def test_a_budget_smaller_than_one_decoder_layer_is_refused(tiny_model_dir):
    layer = placement.layer_bytes(tiny_model_dir, 4)
    assert layer == 4 * (4 * 32 * 32 + 3 * 64 * 32 + 2 * 32)  # float32: q, k, v, o; gate, up, down; two norms
    model = str(tiny_model_dir)
    message = _refusal({"model": model, "device": "cpu", "max_memory": {"cpu": f"{layer // 2000}KB"}})
    assert message.startswith("max_memory.cpu:") and "cannot hold one decoder layer" in message and "float32" in message
    message = _refusal({"model": model, "max_memory": {"0": f"{layer // 2 // 1000 - 1}KB"}})  # bfloat16 on a GPU
    assert message.startswith("max_memory.0:") and "bfloat16" in message
    EvalConfig.from_dict({"model": model, "device_map": "auto", "max_memory": {"0": f"{layer // 1000 + 1}KB"}})
    EvalConfig.from_dict({"model": model, "device_map": "auto", "max_memory": {"cpu": "1KB"}})  # GPUs unknown yet
    with pytest.raises(ConfigError, match="^max_memory.cpu: .* cannot hold one decoder layer"):
        placement.check_job_gpus(EvalConfig, {"model": model, "device_map": "auto", "max_memory": {"cpu": "1KB"}}, 0)
    with pytest.raises(ConfigError, match=r"^max_memory.2: the job sees only the 2 GPU\(s\)"):
        placement.check_job_gpus(EvalConfig, {"model": model, "device_map": "auto", "max_memory": {"2": "1GiB"}}, 2)
    placement.check_job_gpus(EvalConfig, {"model": model, "device_map": "auto", "max_memory": {"1": "1GiB"}}, 2)


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["finetune", "sft", "dpo", "first", "cft"])
def test_a_training_kind_refuses_device_map_saying_what_to_use(kind):
    from lab.jobkit.kinds import parse_config

    for key, value in (("device_map", "auto"), ("max_memory", {"0": "1GiB"}), ("offload_folder", "x")):
        with pytest.raises(ConfigError, match=f"^{key}: this config trains its model; .*sharding: fsdp"):
            parse_config({"kind": kind, key: value})


@pytest.mark.unit
def test_the_inference_kinds_take_the_placement_fields_and_a_series_sets_them_for_its_cells():
    from lab.jobkit.kinds import parse_config

    for kind in ("evaluate", "extract", "series", "compare"):
        _, cfg = parse_config({"kind": kind, "device_map": "auto", "max_memory": {"cpu": "8GiB"}})
        assert cfg.device_map == "auto"
    with pytest.raises(ConfigError, match=r"^tasks\[0\]\.device_map: may not be set here"):
        parse_config({"kind": "series", "tasks": [{"task": "clm", "device_map": "auto"}]})
    with pytest.raises(ConfigError, match=r"^models\[0\]\.train\.device_map: this config trains its model"):
        parse_config({"kind": "series", "axis": "seed", "models": [{"train": {"device_map": "auto"}}]})
