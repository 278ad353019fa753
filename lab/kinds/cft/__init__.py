"""The ``cft`` kind: the CFT / RCFT protocol, calibration-aware fine-tuning and its baselines (REFERENCE.md §3)."""
