"""A model's tokenizer, loaded as every scorer and trainer needs it: with a pad token."""
from __future__ import annotations

from lab.core.errors import ModelLoadError
from lab.core.hub import hub_reachable


def offline_hint(name: str) -> str:
    return (
        f"Model {name!r} is not a local directory and could not be fetched from the Hugging Face hub "
        f"(offline, or no such model). Pass a local directory with config.json and weights, or 'bundled'."
    )


def load_tokenizer(path: str, name: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not hub_reachable())
    except (OSError, ValueError) as e:
        raise ModelLoadError(offline_hint(name) if path == name else f"Cannot load the tokenizer in {path}: {e}") from e
    if tokenizer.pad_token is None:  # batching needs a pad id; its embedding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
