"""The ``first`` kind: FIRST (Shum et al. 2024), trustworthy distillation from a teacher's top-k tokens."""
