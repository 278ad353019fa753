"""The lab's Trainer callbacks: progress, validation and stop requests as events; room on disk before
each checkpoint, and the learning-rate schedule of a run resumed without its optimizer; snapshots."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from transformers import TrainerCallback

from lab.core.events import EventWriter
from lab.models import distributed
from lab.models.weights import size_text
from lab.training.checkpoints import last_checkpoint
from lab.training.disk import ensure_room, folder_bytes
from lab.training.snapshots import save_snapshot
from lab.training.validation import tracked

PART_PREFIXES = ("loss_", "rank_")  # a method trainer's loss components and RCFT's rank-violation share


class LabCallback(TrainerCallback):
    """Training progress and per-epoch validation as events (and to the trackers of ``report_to``,
    through ``log``: the Trainer's own); stops at the user's request, every rank at the same step."""

    def __init__(self, events: EventWriter, stage: str, validate: Optional[Callable[[Any, int], dict]],
                 should_stop: Callable[[], bool], eval_steps: Optional[int] = None, at_start: bool = False) -> None:
        self.events, self.stage, self.validate, self.should_stop = events, stage, validate, should_stop
        self.eval_steps, self.at_start = eval_steps, at_start
        self.history: list[dict[str, Any]] = []
        self.stopping = False  # agreed by every rank
        self.log: Callable[[dict[str, float]], None] = lambda logs: None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            parts = {k: float(v) for k, v in logs.items() if k.startswith(PART_PREFIXES)}
            self.events.emit(self.stage, step=state.global_step, total=state.max_steps, epoch=round(state.epoch or 0, 3),
                             loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)), **parts)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.global_step == 0:  # the model before training: where the curve starts
            self._validate(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.stopping = distributed.agree(self.should_stop())
        if self.stopping:
            control.should_training_stop = True
            control.should_save = True
        elif self.eval_steps and state.global_step % self.eval_steps == 0:
            self._validate(state, model)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self.stopping and not (self.eval_steps and state.global_step % self.eval_steps == 0):
            self._validate(state, model)

    def on_train_end(self, args, state, control, **kwargs):
        """End the W&B run with the stage (transformers' callback leaves it open until the process
        exits): a job of several stages (FIRST's teacher and students) gets a run each, in its own
        folder (W&B reads ``WANDB_DIR`` once per process: teardown makes the next stage read it again),
        and an offline run's file is whole when the stage is done. MLflow's callback ends its own run."""
        wandb = sys.modules.get("wandb")
        if "wandb" in (args.report_to or []) and wandb is not None and wandb.run is not None:
            wandb.finish()
            wandb.teardown()

    def _validate(self, state, model) -> None:
        if self.validate is None:
            return
        metrics = self.validate(model, state.global_step)
        record = {"epoch": round(state.epoch or 0, 3), "step": state.global_step, **metrics}
        self.history.append(record)
        self.events.emit(f"{self.stage}_eval", **record)
        self.log(tracked(metrics))


class CheckpointCallback(TrainerCallback):
    """Checkpoints that fit, and resuming from one without the optimizer's state.

    Before each save (``should_save`` is set by then: transformers' flow callback and
    :class:`LabCallback` run first) the disk must hold a whole new checkpoint — the larger of
    ``checkpoint`` (the estimate) and the last one written — beside the one it replaces;
    ``weights_only`` (the size without the optimizer's state, when it is saved) is offered as the
    way out. A weights-only checkpoint has no scheduler state either, so a run resumed from one would
    restart the learning-rate schedule: it is stepped on to where the run was."""

    def __init__(self, folder: Path, checkpoint: float, weights_only: Optional[float]) -> None:
        self.folder, self.checkpoint, self.weights_only = folder, checkpoint, weights_only

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if lr_scheduler is None or not state.global_step or lr_scheduler.last_epoch >= state.global_step:
            return
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": on purpose here
            warnings.simplefilter("ignore")
            for _ in range(state.global_step - lr_scheduler.last_epoch):
                lr_scheduler.step()

    def on_step_end(self, args, state, control, **kwargs):
        self._ensure_room(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._ensure_room(control)

    def _ensure_room(self, control) -> None:
        if not control.should_save:
            return
        last = last_checkpoint(self.folder)
        need = max(self.checkpoint, folder_bytes(last) if last else 0)
        hint = "" if self.weights_only is None else \
            f" (or set save_optimizer: false: {size_text(self.weights_only)} a checkpoint, weights only)"
        ensure_room(self.folder, need, "the checkpoint", hint)


class SnapshotCallback(TrainerCallback):
    """With ``snapshots`` on, the weights of every save kept in ``snapshots/step-N/``
    (:mod:`lab.training.snapshots`): the checkpoints themselves are pruned to the last one."""

    def __init__(self, folder: Path, tokenizer, lora: bool, weights: float) -> None:
        self.folder, self.tokenizer, self.lora, self.weights = folder, tokenizer, lora, weights

    def on_save(self, args, state, control, model=None, **kwargs):
        ensure_room(self.folder, self.weights, "a snapshot", " (or train without snapshots)")
        if distributed.is_main():
            save_snapshot(model, self.tokenizer, self.folder, state.global_step, self.lora)
