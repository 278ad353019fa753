"""Calibration Lab science library: models, data, templates, scoring, metrics, evaluation."""
