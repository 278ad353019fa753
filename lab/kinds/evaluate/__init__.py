"""The ``evaluate`` kind: accuracy and calibration of a model on a multiple-choice dataset."""
