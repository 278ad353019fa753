"""``sharding: fsdp`` from submit to launch: the refusals at submit, naming the field, and the launch
command with accelerate's FSDP2 options, read back through accelerate's own parser, environment and plugin
(what the worker's Trainer builds its FSDP from). FSDP itself cannot run on a CPU (accelerate refuses
``--cpu`` with ``--use_fsdp``): bench/gpu.py runs it on a GPU."""
import json
import sys
from pathlib import Path

import pytest
from accelerate.commands.launch import launch_command_parser
from accelerate.utils.launch import prepare_multi_gpu_env

from jobs import preflight
from jobs.launch import Launch, build_command, slurm_script
from jobs.sharding import check_sharding, fsdp_of
from jobs.store import JobStore
from lab.core.config import ConfigError
from lab.core.events import read_events
from lab.models import distributed


CONFIG, RUN = Path("/runs/00007-finetune/config.yaml"), Path("/runs/00007-finetune")
FSDP = {"kind": "finetune", "sharding": "fsdp"}


def _args(argv):
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    return launch_command_parser().parse_args(argv[3:])


@pytest.mark.unit
@pytest.mark.parametrize("offload", [False, True])
def test_fsdp_goes_through_accelerate_launch_even_on_one_gpu(offload, monkeypatch):
    args = _args(build_command(CONFIG, RUN, Launch(gpus=(0,), fsdp=True, fsdp_offload=offload)))
    assert (args.num_processes, args.use_fsdp, args.fsdp_version) == (1, True, "2")
    env = prepare_multi_gpu_env(args)  # what accelerate gives every rank
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_OFFLOAD_PARAMS"] == str(offload).lower()
    for name, value in env.items():
        if name.startswith("FSDP_") or name == "ACCELERATE_USE_FSDP":
            monkeypatch.setenv(name, value)
    from accelerate import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = FullyShardedDataParallelPlugin()  # as the Trainer's Accelerator builds it from the environment
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) == offload
    assert plugin.transformer_cls_names_to_wrap is None  # read from the model's _no_split_modules when it wraps


@pytest.mark.unit
def test_fsdp_on_several_gpus_and_nodes():
    args = _args(build_command(CONFIG, RUN, Launch(gpus=(0, 1, 2, 3), fsdp=True)))
    assert (args.num_processes, args.multi_gpu, args.use_fsdp, args.gpu_ids) == (4, True, True, "0,1,2,3")
    script = slurm_script(CONFIG, RUN, nodes=2, gpus_per_node=8, fsdp=True, fsdp_offload=True)
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    args = _args([a.replace("$SLURM_NODEID", "1").replace("$MAIN_IP", "n1") for a in line[len("srun bash -c '"):-1].split()])
    assert (args.num_processes, args.num_machines, args.use_fsdp, args.fsdp_offload_params) == (16, 2, True, "true")
    assert "--use_fsdp" not in slurm_script(CONFIG, RUN, nodes=1, gpus_per_node=8)


@pytest.mark.unit
def test_a_launch_without_gpus_cannot_shard():
    with pytest.raises(ValueError, match="sharding: fsdp"):
        Launch(processes=2, fsdp=True)
    with pytest.raises(ValueError, match="fsdp_offload"):
        Launch(gpus=(0,), fsdp_offload=True)


@pytest.mark.unit
def test_the_launch_options_come_from_the_config_wherever_the_kind_keeps_them():
    assert fsdp_of("finetune", FSDP) == (True, False)
    assert fsdp_of("finetune", {**FSDP, "fsdp_offload": True}) == (True, True)
    assert fsdp_of("first", {"training": {"sharding": "fsdp", "fsdp_offload": True}}) == (True, True)
    assert fsdp_of("sft", {"sharding": "fsdp"}) == (True, False)
    assert fsdp_of("finetune", {}) == (False, False) and fsdp_of("evaluate", {}) == (False, False)


@pytest.mark.unit
@pytest.mark.parametrize("config, gpus, field, said", [
    (FSDP, 0, "sharding", "asks for none"),
    ({"kind": "cft", "training": {"sharding": "fsdp"}}, 0, "training.sharding", "asks for none"),
    ({**FSDP, "method": "qlora"}, 2, "sharding", "QLoRA"),
    ({**FSDP, "save_optimizer": False}, 2, "save_optimizer", "sharded"),
    ({**FSDP, "snapshots": True}, 2, "snapshots", "shard"),
    ({"kind": "finetune", "fsdp_offload": True}, 2, "fsdp_offload", "sharding: fsdp"),
    ({"kind": "dpo", "sharding": "fsdp"}, 0, "sharding", "asks for none"),
])
def test_what_fsdp_cannot_do_is_refused_naming_the_field(config, gpus, field, said):
    kind = config["kind"]
    values = {k: v for k, v in config.items() if k != "kind"}
    with pytest.raises(ConfigError) as refused:
        check_sharding(kind, values, gpus)
    assert str(refused.value).startswith(f"{field}: ") and said in str(refused.value)


@pytest.mark.unit
def test_submit_refuses_fsdp_on_a_cpu_job_and_queues_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "visible_gpus", lambda: [])
    store = JobStore(tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"^sharding: fsdp splits the model across GPUs"):
        store.submit(FSDP, gpus=0)
    assert store.list() == []
    check_sharding("finetune", FSDP, 2)  # two GPUs: accepted


@pytest.mark.unit
def test_validation_runs_every_question_on_every_rank_of_a_sharded_model(monkeypatch):
    """Each forward of an FSDP model gathers its layers from every rank: a rank scoring a smaller share
    would leave the others waiting in a collective, so under FSDP no rank's share is smaller."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    seen = []
    assert distributed.map_sharded(lambda share: seen.append(share) or share, [1, 2, 3], lockstep=True) == [1, 2, 3]
    assert seen == [[1, 2, 3]]
    assert distributed.shard([1, 2, 3]) == [2]  # without lockstep: rank 1's share


@pytest.mark.model
@pytest.mark.parametrize("method", ["full", "lora"])
def test_an_fsdp_launched_worker_loads_to_host_memory_and_writes_one_consolidated_folder(tmp_path, monkeypatch,
                                                                                          tiny_model_dir, method):
    """The worker's own FSDP steps, as far as a CPU runs them: with accelerate's FSDP variable set (on a CPU
    accelerate makes no FSDP plugin, so the Trainer trains unsharded) the model loads in host memory and the
    trained weights are written through the accelerator's full state dict, as one folder ``run:<id>`` reads."""
    from lab.core.yamlio import dump_yaml
    from lab.jobkit.worker import run
    from lab.models.loading import load_model
    from lab.training import sharding

    monkeypatch.setenv(sharding.FSDP_ENV, "true")
    assert sharding.load_device("cuda") == "cpu"
    config = {"kind": "finetune", "model": str(tiny_model_dir), "dataset": "obqa", "data_files": ["bundled"],
              "limit": 8, "val_limit": 4, "epochs": 1, "batch_size": 4, "device": "cpu", "method": method}
    (tmp_path / "config.yaml").write_text(dump_yaml(config))
    run(tmp_path / "config.yaml", tmp_path / "run")
    events = read_events(tmp_path / "run" / "events.jsonl")[0]
    assert next(e for e in events if e["stage"] == "done")
    used = next(e for e in events if e["stage"] == sharding.MEASURED_EVENT)
    assert used["host"] > 0 and "gpu" not in used  # a CPU run: no GPU peak to report
    trained = tmp_path / "run" / ("adapter" if method == "lora" else "model")
    loaded = load_model(str(tiny_model_dir) if method == "lora" else str(trained),
                        adapter=str(trained) if method == "lora" else None, device="cpu")
    assert sum(p.numel() for p in loaded.model.parameters()) == sum(
        p.numel() for p in load_model(str(tiny_model_dir), device="cpu").model.parameters())


@pytest.mark.unit
def test_submit_refuses_a_max_memory_gpu_the_job_will_not_see(tmp_path):
    store = JobStore(tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"^max_memory"):
        store.submit({"kind": "evaluate", "device_map": "auto", "max_memory": {"3": "1GiB"}}, gpus=1)
    with pytest.raises(ConfigError, match=r"^device_map: .*sharding: fsdp"):
        store.submit({"kind": "finetune", "device_map": "auto"}, gpus=1)
    assert store.list() == []


def _fsdp_rank(rank: int, world: int, model_dir: str, out: str, port: str) -> None:
    """One gloo rank: the tiny Llama sharded as accelerate's FSDP2 plugin shards it (each decoder layer, then the
    root), scored by the trainer's validation and consolidated into one folder by the worker's own code."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from lab.data import load
    from lab.data.templates import default_template
    from lab.models.loading import load_model
    from lab.training.sharding import save_consolidated
    from lab.training.validation import letter_probs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(world), RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    loaded = load_model(model_dir, device="cpu")
    model, tokenizer = loaded.model, loaded.tokenizer
    records = load("obqa", "test", ["bundled"], limit=5 + rank).records  # unequal shares, were it split
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert distributed.in_lockstep(model)
    probs = letter_probs(model, tokenizer, records, default_template("obqa", "letter"))
    save_consolidated(model, Path(out) / "consolidated", tokenizer, lora=False)
    Path(out, f"probs{rank}.json").write_text(json.dumps([list(map(float, p)) for p in probs]))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.model
@pytest.mark.e2e
@pytest.mark.slow
def test_a_model_sharded_by_fsdp2_validates_in_lockstep_and_consolidates_into_one_folder(tmp_path, tiny_model_dir):
    """torch's own ``fully_shard`` over gloo on 2 CPU processes, the lab's code around it: each rank scores every
    question of its list (the ranks' lists differ in length: a split share would leave a rank waiting in a
    collective), the probabilities equal the unsharded model's, and the gathered state dict written by rank 0
    is the model's weights, a folder ``load_model`` reads."""
    import socket

    import torch
    import torch.multiprocessing as mp

    from lab.data import load
    from lab.data.templates import default_template
    from lab.models.loading import load_model
    from lab.models.scoring import score_letter
    from lab.data.templates import get_template

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp.spawn(_fsdp_rank, args=(2, str(tiny_model_dir), str(tmp_path), port), nprocs=2, join=True)
    plain = load_model(str(tiny_model_dir), device="cpu")
    template = get_template(default_template("obqa", "letter"))
    for rank in range(2):
        records = load("obqa", "test", ["bundled"], limit=5 + rank).records
        expected = [s.probs for s in score_letter(plain.model, plain.tokenizer,
                                                  [template.render(r, plain.tokenizer) for r in records])]
        got = json.loads((tmp_path / f"probs{rank}.json").read_text())
        assert len(got) == len(records)
        assert max(abs(a - b) for p, q in zip(got, expected) for a, b in zip(p, q)) <= 1e-5
    from lab.models.weights import count_parameters

    # a tied output layer is stored once, as save_pretrained stores it unsharded
    assert count_parameters(tmp_path / "consolidated") == count_parameters(tiny_model_dir)
    consolidated = load_model(str(tmp_path / "consolidated"), device="cpu").model.state_dict()
    for name, weight in plain.model.state_dict().items():
        assert torch.equal(consolidated[name], weight), name
