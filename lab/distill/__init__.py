"""Distillation from a teacher's stored top-k: extraction and knowledge-matching losses (FIRST §4)."""
