"""How a job is started: which GPUs exist, and the command line for one device or many.

One device: ``python -m lab run CONFIG --run-dir DIR``. Several GPUs, several CPU processes, or
several machines: the same module under ``accelerate launch`` (``--num_processes``,
``--num_machines``, ``--machine_rank``, ``--main_process_ip``), never a launcher of our own; each
rank runs the same config, the work is split across ranks (:mod:`lab.models.distributed`) and only rank
0 writes events and results. Without GPUs the ranks train over torch's gloo backend: the same
launcher, process group, samplers and gathers as NCCL on GPUs, which is how the test suite runs
them on a CPU. A training job with ``sharding: fsdp`` goes through the same launcher with accelerate's
FSDP options (:data:`FSDP_OPTIONS`), even on one GPU: accelerate applies FSDP only to a torchrun launch.
``slurm_script`` writes the batch file
that runs the same config on a cluster, one ``accelerate launch`` per node, into a run directory
on a shared file system that the lab then reads back like any other run.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lab.core.layout import LOG_FILE


def visible_gpus() -> list[int]:
    """GPU indices this server may hand out: ``CUDA_VISIBLE_DEVICES`` if set, else nvidia-smi's list.

    Asked of nvidia-smi, not torch, so the server process never imports torch.
    """
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [int(x) for x in declared.split(",") if x.strip().isdigit()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(x) for x in out.split() if x.isdigit()]


# accelerate launch's FSDP options, said in full (accelerate would fill unset ones with FSDP1's defaults and warn):
# FSDP2, every rank a shard of every weight, gradient and AdamW moment (reshard_after_forward: ZeRO-3), one unit
# per decoder layer as the model's own ``_no_split_modules`` names them (TRANSFORMER_BASED_WRAP without a class
# list reads them), checkpoints sharded per rank so that a resume restores the optimizer. Every rank loads the
# weights itself (no cpu_ram_efficient_loading): TRL's DPO reference model is sharded by TRL, which would shard
# the empty weights that loading leaves on ranks other than 0. The run's bf16 autocast becomes FSDP's
# mixed-precision policy (fp32 shards, bf16 gathered), set by the Trainer's ``bf16`` argument.
FSDP_OPTIONS = ("--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward", "true",
                "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
                "--fsdp_cpu_ram_efficient_loading", "false", "--fsdp_sync_module_states", "false",
                "--fsdp_activation_checkpointing", "false")


@dataclass(frozen=True)
class Launch:
    """Where a job runs: its GPUs on this machine, and the machines of a multi-node run."""

    gpus: tuple[int, ...] = ()
    processes: int = 1  # processes per machine of a CPU job; a GPU job runs one per GPU
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: Optional[str] = None
    main_process_port: int = 29500
    mixed_precision: Optional[str] = None  # accelerate's: no, fp16, bf16
    fsdp: bool = False  # sharding: fsdp (GPUs only)
    fsdp_offload: bool = False  # ... with parameters, gradients and optimizer state in host memory

    def __post_init__(self) -> None:
        if self.num_machines < 1 or not 0 <= self.machine_rank < self.num_machines:
            raise ValueError(f"Expected 0 <= machine_rank < num_machines, got {self.machine_rank} of {self.num_machines}")
        if self.processes < 1 or (self.gpus and self.processes > 1):
            raise ValueError(f"Expected processes >= 1, and 1 with GPUs (one process per GPU), got {self.processes}")
        if self.num_machines > 1 and not self.main_process_ip:
            raise ValueError("A multi-node launch needs main_process_ip (the address of the rank-0 machine)")
        if self.fsdp and not self.gpus:
            raise ValueError("sharding: fsdp splits the model across GPUs; a launch without GPUs cannot (accelerate "
                             "refuses --cpu with --use_fsdp)")
        if self.fsdp_offload and not self.fsdp:
            raise ValueError("fsdp_offload is an option of sharding: fsdp")

    @property
    def per_machine(self) -> int:
        """Processes on each machine: one per GPU, or the CPU job's count."""
        return len(self.gpus) or self.processes

    @property
    def distributed(self) -> bool:
        return self.per_machine > 1 or self.num_machines > 1


def build_command(config: Path, run_dir: Path, launch: Launch = Launch()) -> list[str]:
    """The argv that runs ``config`` in ``run_dir``."""
    worker = ["lab", "run", str(config), "--run-dir", str(run_dir)]
    if not launch.distributed and not launch.fsdp:
        return [sys.executable, "-m", *worker]
    argv = [sys.executable, "-m", "accelerate.commands.launch",
            "--num_processes", str(launch.per_machine * launch.num_machines),
            "--num_machines", str(launch.num_machines)]
    if launch.per_machine > 1:
        # accelerate's torchrun launcher; on a machine without GPUs its ranks join over gloo.
        argv.append("--multi_gpu")
    if len(launch.gpus) > 1:
        argv += ["--gpu_ids", ",".join(map(str, launch.gpus))]
    if launch.num_machines > 1:
        argv += ["--machine_rank", str(launch.machine_rank),
                 "--main_process_ip", launch.main_process_ip, "--main_process_port", str(launch.main_process_port)]
    if launch.fsdp:
        argv += [*FSDP_OPTIONS, "--fsdp_offload_params", str(launch.fsdp_offload).lower()]
    # Said, not defaulted: accelerate would print a warning per unset option into every job's log.
    argv += ["--mixed_precision", launch.mixed_precision or "no", "--dynamo_backend", "no"]
    return argv + ["--module", *worker]


def job_env(gpus: tuple[int, ...], base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The worker's environment: only its own GPUs visible (none for a CPU job), unbuffered output."""
    env = dict(os.environ if base is None else base)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    env["PYTHONUNBUFFERED"] = "1"  # the log file shows progress as it happens
    return env


PROJECT_DIR = Path(__file__).resolve().parents[1]  # where ``python -m lab`` finds the lab


def slurm_script(config: Path, run_dir: Path, nodes: int, gpus_per_node: int, partition: Optional[str] = None,
                 minutes: int = 24 * 60, processes: int = 1, account: Optional[str] = None,
                 extra: tuple[str, ...] = (), fsdp: bool = False, fsdp_offload: bool = False) -> str:
    """An ``sbatch`` file running ``config`` on ``nodes`` × ``gpus_per_node`` GPUs, or, without
    GPUs, on ``processes`` CPU processes per node (as many cores reserved), within ``minutes``;
    ``extra``: more ``#SBATCH`` options, as checked by :func:`jobs.slurm.parse_options`; ``fsdp`` and
    ``fsdp_offload``: the job's ``sharding`` (:class:`Launch`), the FSDP process group spanning every node.

    Rank 0's hostname is the rendezvous address; ``srun`` starts one ``accelerate launch`` per
    node with that node's rank. ``run_dir`` must be on a file system every node and the lab share;
    the job runs from this checkout (``--chdir``) with this Python, so the nodes must see both.

    Both output streams go to the run directory's log (``--output`` and ``--error``, named
    absolutely, as the config and run directory the worker is given are: the job's working folder
    is the checkout, not the folder the lab was started from), so that Slurm never writes its
    default ``slurm-<id>.out`` into the checkout or the current folder.
    """
    config, run_dir = Path(os.path.abspath(config)), Path(os.path.abspath(run_dir))
    log = str(run_dir / LOG_FILE).replace("%", "%%")  # Slurm expands %j, %x … in these names; %% is a %
    # The user's options come first and the lab's own after them: for an option given twice sbatch
    # takes the last, so nothing a user adds can move the log, the working folder or the resources.
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {option}" for option in extra),
        f"#SBATCH --job-name=calibration-lab-{Path(run_dir).name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}" if gpus_per_node else f"#SBATCH --cpus-per-task={processes}",
        f"#SBATCH --time={minutes}",
        f"#SBATCH --output={log}",
        f"#SBATCH --error={log}",
        "#SBATCH --open-mode=append",  # a resumed run adds to its log rather than replacing it
        f"#SBATCH --chdir={PROJECT_DIR}",
    ]
    lines += [f"#SBATCH --partition={partition}"] * bool(partition) + [f"#SBATCH --account={account}"] * bool(account)
    # A CPU job sees no GPU, as locally (job_env); a GPU job sees the ones Slurm gave it.
    env = ["export PYTHONUNBUFFERED=1", *([] if gpus_per_node else ["export CUDA_VISIBLE_DEVICES="])]
    head = 'export MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    launch = Launch(gpus=tuple(range(gpus_per_node)), processes=1 if gpus_per_node else processes,
                    num_machines=nodes, machine_rank=0, main_process_ip="MAIN_IP", fsdp=fsdp, fsdp_offload=fsdp_offload)
    argv = [shlex.quote(a) for a in build_command(config, run_dir, launch)]
    # Per node: its own rank and the shared rendezvous address, filled in by the shell on that node.
    cmd = " ".join(argv).replace("--machine_rank 0", "--machine_rank $SLURM_NODEID").replace("MAIN_IP", "$MAIN_IP")
    # Since Slurm 22.05 a step does not inherit --cpus-per-task: say it, or the ranks share one core.
    srun = "srun" if gpus_per_node else f"srun --cpus-per-task={processes}"
    return "\n".join([*lines, "", *env, head, f"{srun} bash -c '{cmd}'", ""])
