"""Config YAML in and out, bounded so that one request cannot hold the server.

A config is a few hundred bytes of plain values, so whatever is not that is refused while it is
parsed, before anything walks it: more than ``MAX_BYTES``, an alias or anchor (a 357-byte alias
bomb expands to gigabytes, and every later walk visits shared nodes again), nesting deeper than
``MAX_DEPTH`` (the composer recurses), more than ``MAX_NODES`` values, or more than
``BUDGET_S`` seconds of parsing. Text that is not UTF-8 is refused with the byte that is wrong.
Every refusal is a :class:`~lab.core.config.ConfigError` naming the limit.
"""
from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from lab.core.config import ConfigError

MAX_BYTES = 256 << 10  # a real config is a few KB; parsing this much takes about 0.25 s
MAX_DEPTH = 32
MAX_NODES = 100_000
BUDGET_S = 5.0


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the limits above checked as each node is composed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._deadline = time.monotonic() + BUDGET_S

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError("YAML anchors and aliases (&name, *name) are not accepted in a config; "
                              "write each value out")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise ConfigError(f"the config holds more than {MAX_NODES:,} values; the limit is {MAX_NODES:,}")
        if time.monotonic() > self._deadline:
            raise ConfigError(f"the config took more than {BUDGET_S:g} s to parse; send a smaller one")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConfigError(f"the config is nested more than {MAX_DEPTH} levels deep; the limit is {MAX_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(data: str | bytes, what: str = "the config") -> Any:
    """Parse config YAML within the limits; raises :class:`ConfigError` saying which one."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", errors="surrogatepass"))
    if size > MAX_BYTES:
        raise ConfigError(f"{what} is {size:,} bytes; the limit is {MAX_BYTES:,} bytes")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at position {e.start}); "
                              "save it as UTF-8") from None
    try:
        return yaml.load(data, Loader=_BoundedLoader)  # noqa: S506 — a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(e).split())[:300]}") from None
    except RecursionError:  # the scanner's own recursion, before a node is composed
        raise ConfigError(f"the config is nested more than {MAX_DEPTH} levels deep; the limit is {MAX_DEPTH}") from None


def read_yaml_file(path: str | Path) -> Optional[tuple[str, Any]]:
    """A YAML file's text and what it parses to (shared between callers: read them, never change them), parsed once
    per version of the file (its size and time); None when it is gone, unreadable, not UTF-8 or not YAML within the
    limits. The pickers walk the runs folder's configs every few seconds (YAML took 14 ms a file on a loaded 2-core
    CPU: 80 adapters, 1.1 s of every walk), and building the app reads every example for every kind's presets (the
    34 files were parsed 608 times, most of the 2 s of CPU a build took)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _parsed_file(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _parsed_file(path: str, size: int, mtime_ns: int) -> Optional[tuple[str, Any]]:
    try:
        text = Path(path).read_bytes().decode("utf-8")
        return text, load_yaml(text, path)
    except (OSError, ValueError):  # gone meanwhile, or not UTF-8 or YAML (ConfigError is a ValueError)
        return None


class _PlainDumper(yaml.SafeDumper):
    """Never writes anchors: a stored config must load again through :func:`load_yaml`."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(value: Any) -> str:
    return yaml.dump(value, Dumper=_PlainDumper, sort_keys=False)
