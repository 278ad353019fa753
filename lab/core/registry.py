"""A small name → object registry, in the manner of lm-evaluation-harness.

Datasets, templates and scorers are registered by name so that the command line, the job
configs and the UI's dropdowns all read the same list, and an unknown name is answered with
the valid ones (and a "did you mean") instead of a KeyError.
"""
from __future__ import annotations

import difflib
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that is not in a registry; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to objects; refuses duplicates; explains unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(
                f"Unknown {self.kind} {name!r}.{hint} Valid names: {', '.join(sorted(self._items))}."
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """The names in the order they were added (a registry that is also a menu)."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
