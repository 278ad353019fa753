"""CFT / RCFT: calibration-aware fine-tuning and its baselines (REFERENCE.md §3)."""
