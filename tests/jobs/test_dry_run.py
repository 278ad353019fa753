"""Plan before downloading: ``python -m jobs submit --dry-run`` sizes a job from config.json alone, FSDP's
per-GPU shares are what torch's own ``fully_shard`` holds, and nothing is queued or loaded."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.cli import main
from jobs.store import JobStore
from lab.models.weights import SHIPPED_CONFIGS, count_parameters, model_shape, planning_dir
from lab.training.estimates import CPU, training_memory
from lab.training.sharded_memory import parse_size, sharded_training, spread_inference

GIB = 1024**3
LLAMA_7B = SHIPPED_CONFIGS / "meta-llama" / "Llama-2-7b-hf" / "config.json"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 64, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}


@pytest.fixture
def config_only(tmp_path, monkeypatch):
    """A folder holding LLaMA-2-7B's config.json and nothing else; a fresh shapes cache."""
    monkeypatch.setenv("CALIBRATION_LAB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "llama-2-7b"
    folder.mkdir()
    shutil.copy(LLAMA_7B, folder / "config.json")
    return folder


def _dry_run(tmp_path, capsys, config: dict, gpus: int) -> dict:
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--root", str(tmp_path / "runs"), "submit", str(path), "--gpus", str(gpus), "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def _finetune(model: Path, **settings) -> dict:
    return {"kind": "finetune", "model": str(model), "method": "full", "dataset": "synthetic",
            "data_files": ["bundled"], "batch_size": 2, "max_length": 1024, **settings}


@pytest.mark.e2e
@pytest.mark.slow
def test_a_7b_full_finetune_planned_from_its_config_json_on_8_gpus(tmp_path, capsys, config_only):
    """FSDP over 8 GPUs holds 1/8 of the 16 B/param states and the gathered units, not the whole 100 GiB:
    below 35 % of the DDP figure, above 1/8 of it (activations are not divided); offload lowers it further
    and says how much host memory it takes. Nothing is queued."""
    ddp = _dry_run(tmp_path, capsys, _finetune(config_only), 8)["models"][0]
    fsdp = _dry_run(tmp_path, capsys, _finetune(config_only, sharding="fsdp"), 8)["models"][0]
    off = _dry_run(tmp_path, capsys, _finetune(config_only, sharding="fsdp", fsdp_offload=True), 8)["models"][0]
    assert ddp["n_params"] == 6_738_415_616 and not ddp["fits"] and ddp["advice"]
    assert ddp["per_gpu_gib"] / 8 < fsdp["per_gpu_gib"] < 0.35 * ddp["per_gpu_gib"]
    assert fsdp["replicated_per_gpu_gib"] == ddp["per_gpu_gib"] and fsdp["fits"]
    # host memory: the 8 ranks' fp32 copies while loading (32 B/param), more than the offloaded states' 16
    assert off["per_gpu_gib"] < fsdp["per_gpu_gib"] and off["cpu_gib"] == pytest.approx(8 * 4 * 6.738e9 / GIB, rel=1e-3)
    assert fsdp["cpu_gib"] == off["cpu_gib"]
    assert ddp["accelerate_estimate_memory_gib"]["float32"] == pytest.approx(16 * 6_738_415_616 / GIB, abs=0.01)
    assert JobStore(tmp_path / "runs").list() == []


@pytest.mark.e2e
@pytest.mark.slow
def test_the_meta_build_allocates_no_weights(config_only):
    """Building LLaMA-2-7B on the meta device reads and allocates no weight: the subprocess's peak RSS is a
    small fraction of the 13 GB its bf16 weights would take."""
    probe = ("import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'lab.models.meta', sys.argv[1]], "
             "stdout=subprocess.DEVNULL, check=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    peak_kib = int(subprocess.run([sys.executable, "-c", probe, str(config_only)], capture_output=True, text=True,
                                  check=True, cwd=Path(__file__).resolve().parents[2]).stdout)
    assert peak_kib * 1024 < 2e9
    assert count_parameters(config_only) == 6_738_415_616  # and the cached answer agrees


@pytest.mark.unit
def test_hub_ids_are_planned_from_the_shipped_config_json_and_paths_are_not(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBRATION_LAB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert planning_dir("meta-llama/Llama-2-13b-hf") == SHIPPED_CONFIGS / "meta-llama" / "Llama-2-13b-hf"
    assert planning_dir("meta-llama/../../etc") is None and planning_dir("nobody/no-such-model") is None


@pytest.mark.unit
def test_fsdp_states_are_one_eighth_by_hand():
    """7B full fine-tune over 8 GPUs: weights, gradients and AdamW's moments, 16 B/param, at 1/8 per GPU;
    the activations and logits, the GPU's own batch, as on one GPU."""
    shape = model_shape(planning_dir("meta-llama/Llama-2-7b-hf"))
    one = training_memory(shape, "full", 2, 1024)
    eight = sharded_training(one, shape, "full", 8)
    assert eight.parts["sharded states"] == 16 * shape.n_params / 8
    assert eight.parts["activations"] == one.activations
    # host memory: the offloaded states (16 B/param), or the 8 ranks' fp32 copies while loading, if more
    assert sharded_training(one, shape, "full", 8, offload=True).cpu == max(16, 8 * 4) * shape.n_params
    assert sharded_training(one, shape, "full", 8).cpu == 8 * 4 * shape.n_params
    assert sharded_training(one, shape, "full", 1, offload=True).cpu == 16 * shape.n_params


@pytest.mark.unit
def test_device_map_auto_spreads_weights_over_gpus_host_and_disk():
    weights = 100 * GIB
    assert spread_inference(weights, 4).per_gpu == pytest.approx(25 * GIB * 1.2)
    capped = spread_inference(weights, 2, {"0": "20GiB", "1": "20GiB", "cpu": "50GiB"})
    assert (capped.per_gpu, capped.cpu, capped.disk) == (20 * GIB * 1.2, 50 * GIB, 10 * GIB)
    assert parse_size("1.5 GB") == 1.5e9 and parse_size("lots") is None and parse_size(-3) is None
    assert parse_size("20GiB") == 20 * 2**30


@pytest.mark.unit
@pytest.mark.parametrize("config, args, says", [
    ({"kind": "finetune", "model": "bundled", "batch_size": "eight"}, ["--gpus", "1"], "batch_size"),
    ({"kind": "nope"}, ["--gpus", "1"], "kind:"),
    ({"kind": "finetune", "model": "bundled"}, ["--gpus", "-1"], "gpus:"),
])
def test_a_dry_run_refuses_what_submit_refuses(tmp_path, capsys, config, args, says):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--root", str(tmp_path / "runs"), "submit", str(path), *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and str(tmp_path) not in err


def _fully_shard_rank(rank: int, world: int, config_dir: str, out: str) -> None:
    """One gloo rank: the tiny Llama fully sharded per layer and at the root, one AdamW step; writes the
    bytes of its local shards of parameters, gradients and optimizer moments."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["LAB_TEST_PORT"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = list(model.parameters())
    size = {"params": sum(local(p).numel() * local(p).element_size() for p in params),
            "grads": sum(local(p.grad).numel() * local(p.grad).element_size() for p in params),
            "optimizer": sum(local(v).numel() * local(v).element_size() for p in params
                             for k, v in optimizer.state[p].items() if k != "step")}
    Path(out, f"rank{rank}.json").write_text(json.dumps(size))
    dist.destroy_process_group()


@pytest.mark.e2e
@pytest.mark.slow
def test_fsdp_shards_per_rank_match_torchs_fully_shard(tmp_path, monkeypatch):
    """torch's ``fully_shard`` over gloo on 2 CPU processes: after an AdamW step each rank's local shards
    of parameters, gradients and moments are the estimate's per-rank states (fp32: 4 + 4 + 8 B/param / 2)."""
    import socket

    import torch.multiprocessing as mp

    monkeypatch.setenv("CALIBRATION_LAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    shape = model_shape(tmp_path / "tiny")  # built on the meta device from config.json alone
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("LAB_TEST_PORT", str(s.getsockname()[1]))
    mp.spawn(_fully_shard_rank, args=(2, str(tmp_path / "tiny"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    memory = training_memory(shape, "full", 2, 16, CPU, 4)
    per_rank = sharded_training(memory, shape, "full", 2).parts["sharded states"]
    for held in ranks:
        assert held["params"] == pytest.approx(memory.weights / 2, rel=0.01)
        assert held["grads"] == pytest.approx(memory.gradients / 2, rel=0.01)
        assert held["optimizer"] == pytest.approx(memory.optimizer / 2, rel=0.01)
        assert sum(held.values()) == pytest.approx(per_rank, rel=0.01)
    assert sum(r["params"] for r in ranks) == 4 * shape.n_params


@pytest.mark.unit
def test_a_dry_run_refuses_what_submit_refuses_about_sharding(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"kind": "finetune", "sharding": "fsdp"}))
    assert main(["--root", str(tmp_path / "runs"), "submit", str(path), "--gpus", "0", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("error: sharding: fsdp splits the model across GPUs")
