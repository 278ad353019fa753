"""A training job's ``sharding``: checked at submit, and turned into the launch's FSDP options.

``sharding: fsdp`` (:mod:`lab.training.config`) runs the job under accelerate's FSDP2 plugin
(:data:`jobs.launch.FSDP_OPTIONS`). What FSDP cannot do is refused when the job is submitted, naming
the field, rather than found by the worker after the queue and the model load:

- it needs GPUs: accelerate refuses ``--cpu`` with ``--use_fsdp``, and transformers' Trainer given ``fsdp``
  on a CPU would quietly train data-parallel instead;
- QLoRA's 4-bit weights are not floating point, so FSDP2 cannot shard them (accelerate leaves them out,
  whole on every GPU); a 7B QLoRA fits one GPU anyway;
- transformers refuses ``save_only_model`` (``save_optimizer: false``) with sharded checkpoints;
- ``snapshots`` saves each rank's copy from rank 0, which under FSDP holds only its shard;
- ``fsdp_offload`` without ``fsdp`` would be silently ignored.
"""
from __future__ import annotations

from typing import Any, Mapping

from jobs.preflight import setting_path, training_settings, trains
from lab.core.config import ConfigError


def fsdp_of(kind: str, config: Mapping[str, Any]) -> tuple[bool, bool]:
    """(``sharding`` is fsdp, ``fsdp_offload``) of a job: what its launch passes to accelerate."""
    if not trains(kind):
        return False, False
    settings = training_settings(kind, config)
    fsdp = settings["sharding"] == "fsdp"
    return fsdp, fsdp and bool(settings["fsdp_offload"])


def check_sharding(kind: str, config: Mapping[str, Any], gpus: int) -> None:
    """Refuse, naming the field, a ``sharding`` the job cannot run with ``gpus`` GPUs per machine."""
    if not trains(kind):
        return
    settings = training_settings(kind, config)
    if settings["sharding"] != "fsdp":
        if settings["fsdp_offload"]:
            raise ConfigError(f"{setting_path(kind, 'fsdp_offload')}: an option of sharding: fsdp, which this job "
                              "does not use; set sharding: fsdp, or fsdp_offload: false")
        return
    field = setting_path(kind, "sharding")
    if not gpus:
        raise ConfigError(f"{field}: fsdp splits the model across GPUs and this job asks for none: ask for GPUs "
                          "(one shard each), or set sharding: none to train on the CPU")
    if settings["method"] == "qlora":
        raise ConfigError(f"{field}: fsdp cannot shard QLoRA's 4-bit weights (each GPU would hold them whole); a "
                          "7B QLoRA fits one GPU: set sharding: none, or train with method: lora")
    if not settings["save_optimizer"]:
        raise ConfigError(f"{setting_path(kind, 'save_optimizer')}: fsdp's checkpoints are sharded, optimizer "
                          "included (transformers cannot save the weights alone from a sharded run); set "
                          "save_optimizer: true")
    if settings["snapshots"]:
        raise ConfigError(f"{setting_path(kind, 'snapshots')}: not with sharding: fsdp (each GPU holds only a shard "
                          "of the weights a snapshot keeps); set snapshots: false, or sharding: none")
