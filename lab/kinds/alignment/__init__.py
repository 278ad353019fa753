"""What the alignment kinds (``sft``, ``dpo``) share, and no kind itself: their config section
(:mod:`.section`) and the calibration tasks measured on the model in training (:mod:`.calibration`)."""
