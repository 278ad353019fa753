"""The ``sft`` kind: instruction tuning with TRL's SFTTrainer, calibration measured every epoch."""
