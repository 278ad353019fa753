"""A small name → object registry, in the manner of lm-evaluation-harness.

Datasets, templates and scorers are registered by name so that the command line, the job
configs and the UI's dropdowns all read the same list, and an unknown name is answered with
the valid ones (and a "did you mean") instead of a KeyError.
"""
from __future__ import annotations

import difflib
from typing import Generic, Iterator, Optional, TypeVar

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
        self._families: dict[str, tuple[str, str]] = {}  # prefix -> (what follows it, where such names go)

    def add_family(self, prefix: str, example: str, used_by: str) -> None:
        """Names that start with ``prefix`` are valid too, though not listed: an open family whose members
        another library knows (``lm-eval:<task>``), checked where they are used. ``example`` shows the form;
        ``used_by`` says what takes them, for :meth:`get` to tell code that holds no object for them."""
        self._families[prefix] = (example, used_by)

    def family_of(self, name: object) -> Optional[str]:
        """The prefix of the family ``name`` belongs to (:meth:`add_family`), or None."""
        return next((p for p in self._families if isinstance(name, str) and name.startswith(p) and len(name) > len(p)),
                    None)

    def family_use(self, prefix: str) -> str:
        """What takes a family's names (``used_by`` of :meth:`add_family`)."""
        return self._families[prefix][1]

    def family_forms(self) -> list[str]:
        """How each family's names are written (``lm-eval:<task>``), for messages that list the valid names."""
        return [f"{p}{example}" for p, (example, _) in self._families.items()]

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            family = self.family_of(name)
            if family is not None:
                raise UnknownNameError(f"{name!r} names no registered {self.kind}: {family}… names are read by "
                                       f"{self._families[family][1]}") from None
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
