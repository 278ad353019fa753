"""Is the Hugging Face hub reachable? Asked once, so offline machines fail fast.

Without this, ``from_pretrained`` and ``load_dataset`` retry an unreachable hub with back-off
for about 45 s before they give up; with it, an offline lookup goes straight to the local
cache (``local_files_only``) and an unknown name is reported at once.
"""
from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

_TRUE = {"1", "true", "yes", "on"}


def hub_offline_mode() -> bool:
    """The user asked Hugging Face libraries to use their local cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """True when ``HF_ENDPOINT`` (default huggingface.co) accepts a TCP connection."""
    if hub_offline_mode():
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False
