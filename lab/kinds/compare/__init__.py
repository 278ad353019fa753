"""The ``compare`` kind: 1–4 models on the user's questions, as a job or live through the inference lane."""
