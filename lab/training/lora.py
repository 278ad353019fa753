"""LoRA and QLoRA: peft's adapters around the model to train, on the linear layers a config names."""
from __future__ import annotations

import torch

from lab.core.errors import DataError
from lab.models.loading import peft_quietly
from lab.models.weights import ALL_LINEAR, unknown_targets
from lab.training.config import TrainConfig


def with_lora(model, cfg: TrainConfig):
    """``model`` inside LoRA adapters as ``cfg`` sets them (rank, alpha, dropout, targets); for QLoRA
    (``cfg.method``) its 4-bit weights prepared for training first."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.method == "qlora":
        model = prepare_model_for_kbit_training(model)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=lora_target_modules(model, cfg.lora_targets), task_type="CAUSAL_LM")
    with peft_quietly():
        return get_peft_model(model, lora)


def lora_target_modules(model, targets: list[str]) -> str | list[str]:
    """peft's ``target_modules`` for ``targets``, each module name checked against ``model``'s linear
    layers first (:func:`lab.models.weights.unknown_targets`)."""
    if targets == [ALL_LINEAR]:
        return ALL_LINEAR
    output = model.get_output_embeddings()
    problem = unknown_targets((name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                               if isinstance(module, torch.nn.Linear) and module is not output), targets)
    if problem:
        raise DataError(f"lora_targets: the model has {problem}")
    return list(targets)
