"""The ``dpo`` kind: preference alignment with TRL's DPOTrainer, calibration measured every epoch."""
