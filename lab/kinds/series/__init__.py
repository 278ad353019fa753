"""The ``series`` kind: a list of models (sizes, checkpoints, stages, seeds) evaluated on a list of tasks."""
