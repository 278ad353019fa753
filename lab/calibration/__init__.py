"""The science of confidence, as plain functions over arrays: metrics and their input checks, temperature
scaling (every form and search), the teacher transforms of FIRST, recalibrators, selective prediction,
confidence signals, the Bayes oracle of the controlled task, and the metrics an evaluation reports."""
