"""FIRST (Shum et al. 2024): efficient trustworthy distillation from a teacher's top-k tokens."""
