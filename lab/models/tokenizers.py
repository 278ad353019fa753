"""A model's tokenizer, loaded as every scorer and trainer needs it: with a pad token, and a chat template
that renders the lab's conversations (:func:`lab.data.chat_templates.chat_template_problem`), checked in the
model's folder at submit (:func:`check_folder_template`) and on the loaded tokenizer at run time."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from lab.core.errors import ModelLoadError
from lab.core.hub import hub_reachable
from lab.data.chat_templates import check_chat_template, has_chat_template
from lab.models.weights import MAX_CONFIG, ModelFolderError, parse_json

TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves a chat template; it wins over the JSON's
TOKENIZER_CONFIG = "tokenizer_config.json"


def offline_hint(name: str) -> str:
    return (
        f"Model {name!r} is not a local directory and could not be fetched from the Hugging Face hub "
        f"(offline, or no such model). Pass a local directory with config.json and weights, or 'bundled'."
    )


def folder_chat_template(folder: Path) -> tuple[str, Optional[Any]]:
    """(the file it is in, the chat template) of a model folder, as transformers reads it: chat_template.jinja,
    else tokenizer_config.json's ``chat_template``; None: the folder has none (a base model)."""
    jinja = folder / TEMPLATE_FILE
    if jinja.is_file():
        if jinja.stat().st_size > MAX_CONFIG:
            raise ModelFolderError(f"{TEMPLATE_FILE}: {jinja.stat().st_size:,} bytes; a chat template is a few KiB")
        return TEMPLATE_FILE, jinja.read_bytes().decode("utf-8", errors="replace")
    path = folder / TOKENIZER_CONFIG
    if not path.is_file():
        return TOKENIZER_CONFIG, None
    if path.stat().st_size > MAX_CONFIG:
        raise ModelFolderError(f"{TOKENIZER_CONFIG}: {path.stat().st_size:,} bytes; a tokenizer's config is a few KiB")
    config = parse_json(path.read_bytes(), TOKENIZER_CONFIG)
    if not isinstance(config, dict):
        raise ModelFolderError(f"{TOKENIZER_CONFIG}: a JSON {type(config).__name__}, expected an object of settings")
    return TOKENIZER_CONFIG, config.get("chat_template")


def check_folder_template(folder: Path) -> None:
    """Refuse a model folder whose chat template cannot render the lab's conversations, naming its file."""
    where, template = folder_chat_template(Path(folder))
    if template is not None:
        check_chat_template(template, where)


def load_tokenizer(path: str, name: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not hub_reachable())
    except (OSError, ValueError) as e:
        raise ModelLoadError(offline_hint(name) if path == name else f"Cannot load the tokenizer in {path}: {e}") from e
    except (TypeError, KeyError, AttributeError, RecursionError) as e:  # a tokenizer file transformers misreads
        raise ModelLoadError(f"Cannot load the tokenizer of model {Path(name).name!r}: its tokenizer files are "
                             f"malformed ({type(e).__name__}: {str(e)[:200]})") from e
    if has_chat_template(tokenizer):  # a hub model's is first seen here; a local folder's was checked at submit
        check_chat_template(tokenizer.chat_template, f"model {Path(name).name!r}")
    if tokenizer.pad_token is None:  # batching needs a pad id; its embedding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
