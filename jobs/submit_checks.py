"""What a submit checks beyond the config itself, before anything is queued: the resources asked for
(GPUs, processes, executor and Slurm options) against the kind and this machine, the devices, sharding
and GPU placement, the disk, the LoRA targets; and the checked job as it will be queued.

:class:`jobs.store.JobStore` calls :func:`checked` for every job and pipeline stage, then checks the
jobs it waits for in its own table; ``python -m jobs submit`` checks ``processes`` with
:func:`check_processes` before it asks the store.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from jobs.preflight import check_devices, check_disk, check_gpu_request, check_lora_targets
from jobs.rebuild import EXECUTORS, MAX_PROCESSES, check_gpus
from jobs.sharding import check_sharding
from jobs.slurm import SlurmOptions, parse_options
from lab.core.config import ConfigError, check_int
from lab.jobkit.chain import references
from lab.jobkit.kinds import JobKind
from lab.models.placement import check_job_gpus


def check_processes(value: Any, gpus: int, kind: JobKind) -> int:
    """A CPU job's number of data-parallel processes: 1 unless the kind splits its work across ranks,
    and 1 with GPUs, where a job runs one process per GPU."""
    value = check_int("processes", value, 1, MAX_PROCESSES)
    if value > 1 and gpus:
        raise ConfigError(f"processes: a GPU job runs one process per GPU; set processes to 1 (it asked for {gpus} GPUs)")
    if value > 1 and not kind.data_parallel:
        raise ConfigError(f"processes: a {kind.name} job does not split its work across processes; set processes to 1")
    return value


@dataclass(frozen=True)
class Queued:
    """A job checked in full and not yet inserted: what its row and its ``job.json`` will hold."""

    kind: JobKind
    parsed: Any
    gpus: int
    processes: int
    executor: str
    options: Optional[SlurmOptions]
    folders: Optional[list[str]]
    waits: Optional[list[int]]

    def job_file(self) -> dict[str, Any]:
        """``job.json``: the record of the submission, every key of :data:`jobs.rebuild.JOB_FILE_KEYS`."""
        return {"gpus": self.gpus, "processes": self.processes, "executor": self.executor,
                "slurm": asdict(self.options) if self.options else None, "roots": self.folders,
                "waits_on": self.waits}


def checked(kind: JobKind, parsed: Any, gpus: Any, roots: Optional[Iterable[Path]], processes: Any, executor: Any,
            slurm: Any, after: Iterable[int], root: Path) -> Queued:
    """``parsed`` (a config of ``kind``) as it will be queued under ``root``, once its resources, executor,
    Slurm options, devices, disk and LoRA targets pass; the jobs it waits for are its ``run:<id>`` fields'
    and ``after``. Raises :class:`ConfigError` naming the field."""
    gpus = check_gpus(gpus)
    if executor not in EXECUTORS:
        raise ConfigError(f"executor: must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    options = None
    if executor == "slurm":
        options = parse_options(slurm)
        if gpus:
            raise ConfigError("gpus: a Slurm job asks for GPUs with slurm.gpus_per_node; set gpus to 0")
        if roots is not None and shutil.which("sbatch") is None:
            raise ConfigError("executor: this server has no Slurm (sbatch not found); pick local")
    elif slurm:
        raise ConfigError("slurm: options are for executor slurm")
    processes = check_processes(processes, options.gpus_per_node if options else gpus, kind)
    if roots is not None and executor == "local":
        check_gpu_request(gpus)
        if processes > (os.cpu_count() or 1):
            raise ConfigError(f"processes: this machine has {os.cpu_count()} CPU cores; ask for that many or fewer")
    values = parsed.to_dict()
    check_devices(kind.name, values, options.gpus_per_node if options else gpus,
                  here=roots is not None and executor == "local")
    check_sharding(kind.name, values, options.gpus_per_node if options else gpus)
    check_job_gpus(kind.config, values, options.gpus_per_node if options else gpus)
    check_disk(kind.name, values, root)  # its run directory will be under the root
    check_lora_targets(kind.name, values)
    waits = list(dict.fromkeys([*references(kind.config, values), *after])) or None
    folders = None if roots is None else [os.path.realpath(os.path.expanduser(r)) for r in roots]
    return Queued(kind, parsed, gpus, processes, executor, options, folders, waits)
