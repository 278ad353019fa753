"""Jobs on a Slurm cluster: their options, the batch file, submission, state and cancel, through
Slurm's own tools (``sbatch``, ``scontrol``, ``squeue``, ``scancel``).

A Slurm job is a row of the same store with ``executor = 'slurm'``. The scheduler submits it with
``sbatch`` (Slurm queues it, not us), follows its state with ``scontrol show job`` and maps it
onto ours; the job itself runs the same ``python -m lab run`` (under ``accelerate launch`` for
several processes, GPUs or nodes, :func:`jobs.launch.slurm_script`) and writes events, log and
``result.json`` into its run directory, which must be on a file system the cluster's nodes and
the lab share. The result file says how the work ended; Slurm's state says what it did to a job
that could not say (a time limit, a node failure, the out-of-memory killer).

Every option comes from a form, an API call or the command line: each is declared with its
shape and checked here. An extra ``#SBATCH`` line must be one ``--option[=value]`` of safe
characters, since the batch file is a shell script, and the option must be one of
:data:`EXTRA_OPTIONS`: resources and scheduling only. An option that names a file or folder
(``--output``, ``--error``, ``--chdir``, ``--export`` …) would let a browser write or truncate any
file the server's user can, and one the lab sets itself (``--nodes``, ``--time`` …) would change
what the lab believes it asked for; values hold no ``/``, so that no allowed option names a path
either (``--nodelist`` reads a file when its value has one).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from jobs.launch import slurm_script
from lab.core.config import ConfigError, check_int
from lab.core.layout import CONFIG_FILE

BATCH_FILE = "job.sbatch"
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a partition or an account
EXTRA_LINE = re.compile(r"--(?P<name>[a-z][a-z-]{0,40})(=[A-Za-z0-9_.,:@+%-]{1,120})?")
# sbatch options a user may add (sbatch(1)): resources and scheduling, none that names a path. Only
# whole names: sbatch would also take an unambiguous prefix (--out for --output), which is refused.
EXTRA_OPTIONS = frozenset({
    "mem", "mem-per-cpu", "mem-per-gpu", "gres", "gpus", "gpus-per-task", "cpus-per-gpu", "gpu-bind", "gpu-freq",
    "constraint", "prefer", "qos", "reservation", "exclusive", "oversubscribe", "nice", "priority", "exclude",
    "nodelist", "comment", "mail-type", "mail-user", "begin", "deadline", "signal", "requeue", "no-requeue", "hint",
    "licenses", "switches", "tmp", "wckey", "distribution", "contiguous", "mincpus", "network", "time-min",
})
# What the lab's batch file sets itself (jobs.launch.slurm_script), or this form's own fields.
LAB_OPTIONS = {"nodes": "nodes", "time": "minutes", "partition": "partition", "account": "account",
               "gpus-per-node": "gpus_per_node", "cpus-per-task": "processes", "ntasks-per-node": None,
               "job-name": None, "output": None, "error": None, "open-mode": None, "chdir": None}
MAX_EXTRA = 20
MAX_NODES = 1024
MAX_GPUS_PER_NODE = 64
MAX_MINUTES = 366 * 24 * 60
TIMEOUT_S = 30  # a Slurm command that takes longer is a controller in trouble

# Slurm's job states (``scontrol show job``'s JobState) and what they are in our store.
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
ENDED = {  # state → (our status, what to tell the user when the job itself left no result)
    "COMPLETED": ("failed", "Slurm says the job completed, but the worker left no result; see the log"),
    "CANCELLED": ("cancelled", "cancelled in Slurm (scancel)"),
    "FAILED": ("failed", "the job's batch script failed; see the log"),
    "TIMEOUT": ("failed", "timeout: the job ran past its Slurm time limit; ask for more time"),
    "NODE_FAIL": ("failed", "node failure: a node of the job failed; resume it to continue from its checkpoint"),
    "OUT_OF_MEMORY": ("failed", "out of memory: Slurm's memory limit killed the job; ask for more memory (--mem)"),
    "BOOT_FAIL": ("failed", "boot failure: Slurm could not start the job's node"),
    "DEADLINE": ("failed", "deadline: Slurm ended the job at its deadline"),
    "PREEMPTED": ("failed", "preempted by a higher-priority job; resume it to continue from its checkpoint"),
}


@dataclass(frozen=True)
class SlurmOptions:
    """What a Slurm job asks of the cluster; ``processes`` (CPU processes per node) is the job's own."""

    partition: Optional[str] = None  # None: the cluster's default
    nodes: int = field(default=1, metadata={"range": (1, MAX_NODES)})
    gpus_per_node: int = field(default=0, metadata={"range": (0, MAX_GPUS_PER_NODE)})
    minutes: int = field(default=24 * 60, metadata={"range": (1, MAX_MINUTES)})  # the time limit
    account: Optional[str] = None  # None: the submitting user's
    extra: tuple[str, ...] = ()  # up to MAX_EXTRA more #SBATCH options, one --option[=value] each

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def parse_options(values: Any) -> SlurmOptions:
    """Slurm options from a mapping a browser, an API call or the command line sent; a refusal
    names the field. Unknown keys, wrong types and unsafe ``#SBATCH`` lines are refused."""
    if values is None:
        values = {}
    if isinstance(values, str):
        try:
            values = json.loads(values) if values.strip() else {}
        except ValueError as e:
            raise ConfigError(f"slurm: options must be a JSON object ({e})") from e
    if not isinstance(values, dict):
        raise ConfigError(f"slurm: options must be a mapping, got {type(values).__name__}")
    known = {f.name: f for f in fields(SlurmOptions)}
    unknown = sorted(map(str, set(values) - set(known)))
    if unknown:
        raise ConfigError(f"slurm: unknown option(s) {unknown}; known: {sorted(known)}")
    checked: dict[str, Any] = {}
    for name, value in values.items():
        spec = known[name]
        if value is None and spec.default is None:
            checked[name] = None
        elif "range" in spec.metadata:
            checked[name] = check_int(f"slurm.{name}", value, *spec.metadata["range"])
        elif name == "extra":
            lines = [value] if isinstance(value, str) else value
            if not isinstance(lines, (list, tuple)) or len(lines) > MAX_EXTRA:
                raise ConfigError(f"slurm.extra: must be a list of at most {MAX_EXTRA} options like --mem=16G")
            checked[name] = tuple(_extra_line(line) for line in lines)
        elif not isinstance(value, str) or not NAME.fullmatch(value):
            raise ConfigError(f"slurm.{name}: must be a name of letters, digits and _.- (at most 64), got {value!r}")
        else:
            checked[name] = value
    return SlurmOptions(**checked)


def _extra_line(line: Any) -> str:
    """One checked extra ``#SBATCH`` option, without its ``#SBATCH`` prefix."""
    option = line.strip().removeprefix("#SBATCH").strip() if isinstance(line, str) else None
    match = EXTRA_LINE.fullmatch(option) if option is not None else None
    if match is None:
        raise ConfigError(f"slurm.extra: {line!r} is not one --option or --option=value of letters, digits and "
                          "_.,:@+%-")
    name = match["name"]
    if name in LAB_OPTIONS:
        field_name = LAB_OPTIONS[name]
        instead = f"set slurm.{field_name} instead" if field_name else "the lab sets it itself"
        raise ConfigError(f"slurm.extra: --{name} cannot be given here: {instead}")
    if name not in EXTRA_OPTIONS:
        raise ConfigError(f"slurm.extra: --{name} is not an option the lab passes on; allowed: "
                          f"{', '.join('--' + o for o in sorted(EXTRA_OPTIONS))}")
    return option


def batch_file(run_dir: Path, options: SlurmOptions, processes: int, fsdp: tuple[bool, bool] = (False, False)) -> str:
    """The ``sbatch`` file of a job in ``run_dir``: its config, on the resources it asked for; ``fsdp``: its
    sharding and offload (:func:`jobs.sharding.fsdp_of`)."""
    return slurm_script(run_dir / CONFIG_FILE, run_dir, nodes=options.nodes, gpus_per_node=options.gpus_per_node,
                        partition=options.partition, minutes=options.minutes, processes=processes,
                        account=options.account, extra=options.extra, fsdp=fsdp[0] and options.gpus_per_node > 0,
                        fsdp_offload=fsdp[1] and options.gpus_per_node > 0)


def _run(argv: list[str], cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd)


def submit(run_dir: Path, options: SlurmOptions, processes: int, fsdp: tuple[bool, bool] = (False, False)) -> str:
    """Write the batch file into ``run_dir`` and submit it; Slurm's job id. Raises ``RuntimeError``
    with sbatch's own words when Slurm refuses it (a partition that does not exist, too much memory).

    The job's output goes to the run directory's log (:func:`jobs.launch.slurm_script`), and sbatch
    runs in the run directory too: nothing of a job is ever written into the lab's current folder."""
    run_dir = Path(os.path.abspath(run_dir))
    path = run_dir / BATCH_FILE
    path.write_text(batch_file(run_dir, options, processes, fsdp), encoding="utf-8")
    try:
        done = _run(["sbatch", "--parsable", str(path)], cwd=run_dir)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"sbatch could not be run: {e}") from e
    if done.returncode != 0:
        said = " ".join(line.removeprefix("sbatch: error: ") for line in done.stderr.strip().splitlines())
        raise RuntimeError(f"sbatch refused the job: {said or f'exit code {done.returncode}'}")
    return done.stdout.strip().split(";")[0]  # "id" or "id;cluster"


@dataclass(frozen=True)
class SlurmState:
    state: str  # Slurm's JobState
    reason: str  # its Reason (None, TimeLimit, NonZeroExitCode …)
    fields: dict[str, str]  # every field scontrol printed


def state(slurm_id: str) -> Optional[SlurmState]:
    """What Slurm says of the job now; None when it no longer knows it (ended longer ago than its
    ``MinJobAge``) or cannot be asked."""
    try:
        done = _run(["scontrol", "show", "job", "-o", str(slurm_id)])
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    values = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
    return SlurmState(values.get("JobState", "UNKNOWN"), values.get("Reason", "None"), values)


def over(now: Optional[SlurmState]) -> bool:
    """The job is no longer pending or running, or Slurm no longer knows it."""
    return now is None or now.state not in PENDING | RUNNING


def cancel(slurm_id: str) -> None:
    """``scancel``: Slurm sends SIGTERM to every process of the job, then SIGKILL after its KillWait."""
    try:
        _run(["scancel", str(slurm_id)])
    except (OSError, subprocess.TimeoutExpired):
        pass  # the job's state will say whether it ended


def describe(options_json: Optional[str], slurm_id: Optional[str]) -> str:
    """How the Jobs page shows where a Slurm job runs: its id and partition."""
    partition = (json.loads(options_json).get("partition") if options_json else None) or "default partition"
    return f"slurm {slurm_id} ({partition})" if slurm_id else f"slurm ({partition})"
