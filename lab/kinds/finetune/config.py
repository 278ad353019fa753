"""The ``finetune`` kind: one :class:`~lab.training.config.TrainConfig` run, registered (the run: :mod:`.run`).

Its config is the training layer's own, because FIRST and CFT train each of their models with it.
"""
from lab.core.layout import ADAPTER_DIR, CHECKPOINTS_DIR, MODEL_DIR
from lab.jobkit.kinds import JobKind, register
from lab.training.config import TrainConfig

register(JobKind(
    "finetune", "hard-label fine-tuning (full or LoRA; cross-entropy, label smoothing or RCFT), ECE per epoch",
    TrainConfig, "lab.kinds.finetune.run:run_job", outputs=(f"{MODEL_DIR}/", f"{ADAPTER_DIR}/", f"{CHECKPOINTS_DIR}/"),
    key_fields=("model", "method", "dataset", "data_files", "split", "limit", "objective", "epochs", "learning_rate",
                "batch_size", "lora_r"),
    data_parallel=True,
))
