"""Command construction for one device, several GPUs and several machines, checked by accelerate's own parser."""
import sys
from pathlib import Path

import pytest
from accelerate.commands.launch import launch_command_parser

from jobs.launch import Launch, build_command, job_env, slurm_script

pytestmark = pytest.mark.unit

CONFIG, RUN = Path("/runs/00007-evaluate/config.yaml"), Path("/runs/00007-evaluate")
WORKER = ["run", str(CONFIG), "--run-dir", str(RUN)]


def accelerate_args(argv):
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    return launch_command_parser().parse_args(argv[3:])


def test_one_device_runs_the_worker_directly():
    assert build_command(CONFIG, RUN) == [sys.executable, "-m", "lab", *WORKER]
    assert build_command(CONFIG, RUN, Launch(gpus=(3,))) == [sys.executable, "-m", "lab", *WORKER]


def test_several_gpus_go_through_accelerate_launch():
    args = accelerate_args(build_command(CONFIG, RUN, Launch(gpus=(2, 5), mixed_precision="bf16")))
    assert (args.num_processes, args.num_machines, args.multi_gpu, args.gpu_ids) == (2, 1, True, "2,5")
    assert args.mixed_precision == "bf16"
    assert args.module and args.training_script == "lab" and args.training_script_args == WORKER


def test_cpu_processes_go_through_accelerates_torchrun_launcher():
    """Without GPUs the ranks join over gloo; --multi_gpu is accelerate's name for that launcher."""
    args = accelerate_args(build_command(CONFIG, RUN, Launch(processes=2)))
    assert (args.num_processes, args.num_machines, args.multi_gpu, args.gpu_ids) == (2, 1, True, None)
    assert build_command(CONFIG, RUN, Launch(processes=1)) == [sys.executable, "-m", "lab", *WORKER]
    with pytest.raises(ValueError, match="one process per GPU"):
        Launch(gpus=(0, 1), processes=2)
    with pytest.raises(ValueError, match="processes >= 1"):
        Launch(processes=0)


def test_several_machines():
    launch = Launch(gpus=(0, 1, 2, 3), num_machines=2, machine_rank=1, main_process_ip="10.0.0.5", main_process_port=29555)
    args = accelerate_args(build_command(CONFIG, RUN, launch))
    assert (args.num_processes, args.num_machines, args.machine_rank) == (8, 2, 1)
    assert (args.main_process_ip, args.main_process_port) == ("10.0.0.5", 29555)
    with pytest.raises(ValueError, match="main_process_ip"):
        Launch(gpus=(0,), num_machines=2)
    with pytest.raises(ValueError, match="machine_rank"):
        Launch(num_machines=2, machine_rank=2, main_process_ip="h")


def test_worker_sees_only_its_gpus():
    assert job_env((1, 3), base={"PATH": "/bin"}) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1,3", "PYTHONUNBUFFERED": "1"}
    assert job_env((), base={})["CUDA_VISIBLE_DEVICES"] == ""  # a CPU job sees no GPU


def test_slurm_script_runs_one_accelerate_launch_per_node():
    script = slurm_script(CONFIG, RUN, nodes=2, gpus_per_node=4, partition="gpu")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script and "#SBATCH --partition=gpu" in script
    assert f"#SBATCH --output={RUN}/log.txt" in script
    line = next(l for l in script.splitlines() if l.startswith("srun "))
    assert "#SBATCH --cpus-per-task" not in script and "CUDA_VISIBLE_DEVICES" not in script
    inner = line[len("srun bash -c '"):-1].split()
    filled = [a.replace("$SLURM_NODEID", "1").replace("$MAIN_IP", "node001") for a in inner]
    args = accelerate_args(filled)
    assert (args.num_processes, args.num_machines, args.machine_rank, args.main_process_ip) == (8, 2, 1, "node001")
    assert args.training_script_args == WORKER
