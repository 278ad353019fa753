"""A training run's checkpoints as transformers leaves them: the newest whole one, and whether it holds the optimizer."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME: the last file of a checkpoint
OPTIMIZER_FILE = "optimizer.pt"  # transformers' OPTIMIZER_NAME: absent from a weights-only checkpoint
MTIME_NOTICE = "mtime may not be reliable"


class _QuietCheckpointOrder(logging.Filter):
    """transformers orders checkpoints by mtime before removing the oldest (``save_total_limit``),
    and where two were saved within a second (a small model's epochs) it says "mtime may not be
    reliable on this filesystem" and orders them by step instead: right here (checkpoints are named
    by step), and no fault of the filesystem, so in a job's log it is only noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return MTIME_NOTICE not in record.getMessage()


logging.getLogger("transformers.trainer_utils").addFilter(_QuietCheckpointOrder())


def last_checkpoint(folder: Path) -> Optional[Path]:
    """The newest whole checkpoint in ``folder``: the Trainer writes its state file last, so a
    checkpoint a kill interrupted has none and the one before it (still there: transformers deletes
    it only after the new one's state file is written) is used."""
    if not folder.is_dir():
        return None
    steps = {int(p.name.rsplit("-", 1)[1]): p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
             if p.name.rsplit("-", 1)[1].isdigit() and (p / STATE_FILE).is_file()}
    return steps[max(steps)] if steps else None


def has_optimizer(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds AdamW's state: one file, or FSDP's sharded folder (``optimizer_0``)."""
    return (checkpoint / OPTIMIZER_FILE).is_file() or any(checkpoint.glob(f"{OPTIMIZER_FILE.removesuffix('.pt')}_*"))
