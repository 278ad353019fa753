"""The ``finetune`` kind: one supervised fine-tuning run (full, LoRA, QLoRA; SFT, label smoothing, RCFT)."""
