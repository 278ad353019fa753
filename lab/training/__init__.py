"""Training shared by the kinds that train: ``TrainConfig``, supervised sequences, memory estimates,
the transformers Trainer loop with the lab's callbacks, and one Trainer subclass per objective
(label smoothing and RCFT, top-k distillation) beside its loss."""
