"""Training: ``TrainConfig`` (the ``finetune`` kind), records turned into supervised sequences, and the
generic fine-tuning loop; each method's own Trainer lives beside its loss (``lab.cft``, ``lab.distill``)."""
