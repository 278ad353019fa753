"""Stored runs read back: the catalogue of a runs folder, evaluations as arrays (analysis), case
studies, and the report files pipelines write. Below the kinds, because pipelines read their own
evaluations back."""
