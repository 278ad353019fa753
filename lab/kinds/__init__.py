"""One package per job kind, each the same shape: ``config.py`` (the config dataclass and its
registration, with the runner named as a dotted path), ``run.py`` (the runner: torch only here),
``report.py`` where it writes one; and ``alignment/``, no kind: what the sft and dpo kinds share (their
calibration section and its check), so that neither imports the other."""
