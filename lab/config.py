"""What every job config shares: built from a mapping that may not hold unknown keys, and
written back out whole (the run directory keeps the resolved config)."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

C = TypeVar("C", bound="ConfigMixin")


def doc(text: str) -> dict[str, str]:
    """Field metadata carrying the help text the command line and the UI show."""
    return {"help": text}


class ConfigMixin:
    """For dataclasses: ``from_dict`` rejects unknown keys (a typo must not silently become a default)."""

    @classmethod
    def from_dict(cls: type[C], values: dict[str, Any]) -> C:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown {cls.__name__} option(s) {unknown}; valid ones: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
