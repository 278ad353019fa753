"""What every job config shares: fields that declare what they are, one validator derived from
those declarations, and the resolved config written back out whole.

A field says where it is defined what its value may be (``doc(help, role=…, ge=…, …)``): the
help text, the *role* of a text value (a file path, a model, a registry name, free text), the
bounds of a number, the schema of nested entries. :func:`validate` checks a mapping from a
browser, a YAML file or the command line against the declarations, recursively and before any
file is touched, and names the field path in every refusal (``ood[0].limt: unknown key; did you
mean limit?``); :mod:`lab.jobkit.paths` resolves the fields whose role names a file; the launch form
and the command line read the same declarations. A new field therefore cannot slip past the
checks by being forgotten in a list kept elsewhere.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Literal, Mapping, Optional, TypeVar

from lab.core.limits import TEMPERATURE_RANGE
from lab.core.registry import UnknownNameError

C = TypeVar("C", bound="ConfigMixin")

# What a text value is. The path roles are resolved and checked by lab.jobkit.paths:
#   data_files  files, folders, globs or SPLIT=PATH, in a dataset's own format
#   files       files, folders or globs (no split)
#   dir         an existing directory (an adapter)
#   temperature a positive number, or a temperature.json / a folder holding one
#   calibrator  a calibrator.json / a folder holding one (lab.calibration.calibrators)
#   tasks       a folder of lm-eval task YAMLs (lab.data.harness): code, so also a folder the server trusts
#   model       'bundled', a local model directory, a Hugging Face hub id, or run:<id>: another job's
#               trained weights (lab.jobkit.chain), a LoRA run's adapter going to `adapter_field`
# The other roles never name a file:
#   name        a name looked up in a registry (`registry`) or matched by `pattern`
#   text        free text shown or scored, never opened
Role = Literal["data_files", "files", "dir", "tasks", "temperature", "calibrator", "model", "name", "text"]
PATH_ROLES = ("data_files", "files", "dir", "tasks", "temperature", "calibrator", "model")
MAX_TEXT = 4096  # characters of a text value, unless the field says otherwise
MAX_ITEMS = 256  # entries of a list, unless the field says otherwise


class ConfigError(ValueError):
    """A config refused before it runs; the message starts with the path of the offending field."""


@dataclass(frozen=True)
class Spec:
    """The declaration of one config field (see the module docstring)."""

    help: str
    role: Optional[str] = None
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    max_len: int = MAX_TEXT
    max_items: int = MAX_ITEMS  # ... and keys of a mapping of text (`key_pattern`)
    min_items: int = 0  # a list that must not be empty (an empty one would fail later, at run time)
    pattern: Optional[str] = None  # what a text value (a mapping's values too) must match whole
    key_pattern: Optional[str] = None  # a mapping of text to text (dict[str, str]): what each key must match whole
    registry: Any = None  # a lab.core.registry.Registry whose names are the valid values
    families: bool = False  # ... and the names of its families too (lab.core.registry.Registry.add_family)
    entries: Optional[type] = None  # the dataclass each mapping of a dict / list-of-dict field follows
    exclude: tuple[str, ...] = ()  # entries' fields that may not be set here
    exclude_reason: str = ""
    trained_by: Optional[str] = None  # a model field: the field saying how the job trains it (pre-flight)
    adapter_field: Optional[str] = None  # a model field: the field of its entry a LoRA run:<id>'s adapter goes to

    def bounds_text(self) -> str:
        parts = [f"{op} {int(v):,}" if float(v).is_integer() else f"{op} {v:g}"
                 for op, v in (("≥", self.ge), (">", self.gt), ("≤", self.le), ("<", self.lt)) if v is not None]
        return " and ".join(parts)


def doc(text: str, **declaration: Any) -> dict[str, Any]:
    """Field metadata: the help text the command line and the form show, and the declaration."""
    return {"help": text, "spec": Spec(text, **declaration)}


def spec_of(f: dataclasses.Field) -> Spec:
    return f.metadata.get("spec") or Spec(f.metadata.get("help", ""))


def redeclare(section: type, name: str, *, default: Any = dataclasses.MISSING, required: bool = False,
              **declaration: Any) -> Any:
    """A section's field again with another default, help text or declaration item, the rest kept.

    A config composed of shared sections sometimes needs one field to differ (extraction reads the
    train split, evaluation the test split; a training job's model is trained by ``method``; an
    out-of-domain entry must name its dataset): this
    says so in one line instead of copying the field and the bounds that come with it.
    """
    base = next(f for f in dataclasses.fields(section) if f.name == name)
    spec = dataclasses.replace(spec_of(base), **declaration)
    if required:  # an entry that means nothing without it (an evaluation's dataset); needs kw_only
        kwargs = {}
    elif default is not dataclasses.MISSING:
        kwargs = {"default": default}
    elif base.default_factory is not dataclasses.MISSING:
        kwargs = {"default_factory": base.default_factory}
    else:
        kwargs = {"default": base.default}
    return dataclasses.field(**kwargs, metadata={"help": spec.help, "spec": spec})


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``Optional[X]`` → (X, True); anything else → (hint, False)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def suggest(word: str, options: list[str]) -> Optional[str]:
    """The option a typo most likely meant: a close spelling, or one the word begins."""
    close = difflib.get_close_matches(word, options, n=1)
    if close:
        return close[0]
    return next((o for o in options if len(word) >= 3 and o.startswith(word)), None)


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _check_number(path: str, value: Any, hint: Any, spec: Spec) -> Any:
    bounds = spec.bounds_text()
    if hint is int:
        what = "an integer" + (f" {bounds}" if bounds else "")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # 3.0 from a number box or YAML: the integer it spells
        if not isinstance(value, int) or isinstance(value, bool):
            raise _fail(path, f"must be {what}, got {_show(value)}")
    else:
        what = "a finite number" + (f" {bounds}" if bounds else "")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise _fail(path, f"must be {what}, got {_show(value)}")
    if ((spec.ge is not None and value < spec.ge) or (spec.gt is not None and value <= spec.gt)
            or (spec.le is not None and value > spec.le) or (spec.lt is not None and value >= spec.lt)):
        raise _fail(path, f"must be {what}, got {_show(value)}")
    return value


def check_int(path: str, value: Any, low: int, high: int) -> int:
    """A whole number in [low, high] outside a config dataclass (a job's resources), checked and
    worded as a declared field's is."""
    return _check_number(path, value, int, Spec(path, ge=low, le=high))


def _check_text(path: str, value: Any, spec: Spec) -> str:
    if not isinstance(value, str):
        raise _fail(path, f"must be text, got {_show(value)}")
    if len(value) > spec.max_len:
        raise _fail(path, f"is {len(value):,} characters long; the limit is {spec.max_len:,}")
    if "\x00" in value:
        raise _fail(path, "must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\udcff" in JSON): no file, table or page can hold it
        raise _fail(path, "must be valid Unicode text (it holds a lone surrogate)") from None
    if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
        raise _fail(path, f"{_show(value)} is not valid here ({spec.help})")
    if spec.registry is not None and value not in spec.registry:
        family = spec.registry.family_of(value)
        if family is not None and spec.families:
            return value  # checked where it is used (lm-eval:<task>: lab.data.harness.check_task)
        if family is not None:
            raise _fail(path, f"{_show(value)}: {family}… names are taken by {spec.registry.family_use(family)}, not "
                              f"here; this field takes a registered {spec.registry.kind}: {', '.join(spec.registry)}")
        close = suggest(value, list(spec.registry))
        hint = f" Did you mean {close!r}?" if close else ""
        valid = [*spec.registry, *(spec.registry.family_forms() if spec.families else [])]
        raise _fail(path, f"unknown {spec.registry.kind} {_show(value)}.{hint} Valid: {', '.join(valid)}")
    return value


def _check_mapping(path: str, value: Any, spec: Spec) -> dict[str, str]:
    """A mapping of text to text: at most ``max_items`` keys, each matching ``key_pattern`` (a whole number
    from YAML, ``0:``, is the text it spells), each value checked as a text field's."""
    if not isinstance(value, Mapping):
        raise _fail(path, f"must be a mapping of text to text, got {_show(value)}")
    if len(value) > spec.max_items:
        raise _fail(path, f"has {len(value):,} keys; the limit is {spec.max_items:,}")
    out = {}
    for key, item in value.items():
        text = str(key) if isinstance(key, int) and not isinstance(key, bool) else key
        if not isinstance(text, str) or not re.fullmatch(spec.key_pattern or "", text):
            raise _fail(path, f"key {_show(key)} is not valid here ({spec.help})")
        out[text] = _check_text(f"{path}.{text}", item, spec)
    return out


def check_value(path: str, value: Any, hint: Any, spec: Spec) -> Any:
    """``value`` checked against a field's type hint and declaration; returns it normalised."""
    hint, optional = unwrap_optional(hint)
    if value is None:
        if optional:
            return None
        raise _fail(path, "must be set")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if spec.role == "temperature" and isinstance(value, str):
        try:
            value = float(value)  # "1.5" from a text box or the command line; other text names a file
        except ValueError:
            pass
    if spec.role == "temperature" and isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = TEMPERATURE_RANGE
        if not (math.isfinite(value) and low <= value <= high):
            raise _fail(path, f"must be a temperature from {low:g} to {high:g} (a number, a temperature.json or its "
                              f"folder), got {_show(value)}")
        return float(value)
    if origin is Literal:
        if not isinstance(value, str) or value not in args:
            close = suggest(value, [str(a) for a in args]) if isinstance(value, str) else None
            hint_text = f"; did you mean {close!r}?" if close else ""
            raise _fail(path, f"must be one of {', '.join(map(repr, args))}, got {_show(value)}{hint_text}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _fail(path, f"must be true or false, got {_show(value)}")
        return value
    if hint in (int, float):
        return _check_number(path, value, hint, spec)
    if hint is str:
        return _check_text(path, value, spec)
    if origin is list:
        if isinstance(value, str) and args[0] is str:
            value = [value]  # one path where a list was meant
        if not isinstance(value, list):
            raise _fail(path, f"must be a list, got {_show(value)}")
        if len(value) > spec.max_items:
            raise _fail(path, f"has {len(value):,} entries; the limit is {spec.max_items:,}")
        if len(value) < spec.min_items:
            raise _fail(path, f"must have at least {spec.min_items} entr{'y' if spec.min_items == 1 else 'ies'}, "
                              "or be left unset for the default")
        return [check_value(f"{path}[{i}]", v, args[0], spec) for i, v in enumerate(value)]
    if origin is dict and spec.entries is None and args == (str, str) and spec.key_pattern is not None:
        return _check_mapping(path, value, spec)
    if origin is dict:
        if spec.entries is None:
            raise TypeError(f"{path}: a mapping field needs `entries` (or, of text to text, `key_pattern`) in its "
                            "declaration")
        return validate(spec.entries, value, path, exclude=spec.exclude, exclude_reason=spec.exclude_reason)
    raise TypeError(f"{path}: no check for type {hint!r}; declare the field with a checkable type")


# Keys of the inference kinds (device_map: a model larger than a GPU) that a config training its model
# does not take, each with what it takes instead: said in place of "unknown key".
TRAINING_INSTEAD = {
    "device_map": "to spread training over GPUs use sharding: fsdp",
    "max_memory": "to spread training over GPUs use sharding: fsdp (fsdp_offload: true keeps weights in host memory)",
    "offload_folder": "to keep weights off the GPUs while training use sharding: fsdp with fsdp_offload: true",
}


def _trains(cls: type) -> bool:
    """A config that trains a model: one of its model fields says which field decides how (``trained_by``)."""
    return any(spec_of(f).trained_by for f in dataclasses.fields(cls))


def validate(cls: type, values: Any, where: str = "", *, exclude: tuple[str, ...] = (),
             exclude_reason: str = "") -> dict[str, Any]:
    """``values`` checked against the dataclass ``cls``'s declarations; raises :class:`ConfigError`.

    Nothing is read from disk here: shapes, types, bounds and names only, so a hostile value is
    refused before any path or model check walks it.
    """
    if not isinstance(values, Mapping):
        raise _fail(where or "config", f"must be a mapping of {cls.__name__} fields, got {_show(values)}")
    declared = {f.name: f for f in dataclasses.fields(cls)}
    allowed = [name for name in declared if name not in exclude]
    hints = typing.get_type_hints(cls)
    moved = getattr(cls, "MOVED", {})
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and key in moved and key not in declared:
            raise _fail(path, f"this key moved: write it as {moved[key]}")
        if isinstance(key, str) and key in TRAINING_INSTEAD and key not in declared and _trains(cls):
            raise _fail(path, f"this config trains its model; {TRAINING_INSTEAD[key]}")
        if not isinstance(key, str) or key not in declared:
            close = suggest(str(key), allowed)
            guess = f"; did you mean {close}?" if close else ""
            raise _fail(path, f"unknown key{guess} (valid: {', '.join(allowed)})")
        if key in exclude:
            raise _fail(path, f"may not be set here{': ' + exclude_reason if exclude_reason else ''}")
        out[key] = check_value(path, value, hints[key], spec_of(declared[key]))
    for name, f in declared.items():
        if name not in out and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _fail(f"{where}.{name}" if where else name, f"must be set ({spec_of(f).help})")
    return out


def walk(cls: type, values: Mapping[str, Any], where: str = "") -> Iterator[tuple[str, Spec, Any, str, type]]:
    """(field path, declaration, the mapping holding it, its key, the class declaring it) for every
    set field, nested entries too."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        spec, path, value = spec_of(f), f"{where}.{f.name}" if where else f.name, values[f.name]
        yield path, spec, values, f.name, cls
        if spec.entries is not None and value is not None:
            inner, _ = unwrap_optional(hints[f.name])
            if typing.get_origin(inner) is list:
                for i, entry in enumerate(value):
                    yield from walk(spec.entries, entry, f"{path}[{i}]")
            else:
                yield from walk(spec.entries, value, path)


def model_fields(cls: type, values: Mapping[str, Any]) -> list[tuple[str, Spec, Any, str, type]]:
    """:func:`walk`'s tuples of the set model fields (``role="model"``) that name a model, nested entries
    too; listed whole before the caller sees one, so that it may replace the values as it goes."""
    return [t for t in walk(cls, values) if t[1].role == "model" and isinstance(t[2][t[3]], str)]


def with_defaults(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` completed with ``cls``'s declared defaults, so that an entry of a list field (a CFT
    source) means what its declaration says to every reader, not what each reader assumes."""
    out = dict(values)
    for f in dataclasses.fields(cls):
        if f.name not in out and f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        elif f.name not in out and f.default is not dataclasses.MISSING:
            out[f.name] = f.default
    return out


class ConfigMixin:
    """For dataclasses: ``from_dict`` validates against the fields' declarations first.

    ``MOVED`` maps a key an older config shape used to where it lives now, so a config written
    before the change is refused with the new key named rather than "unknown key".
    """

    MOVED: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_dict(cls: type[C], values: Any) -> C:
        return cls.from_checked(validate(cls, values))

    @classmethod
    def from_checked(cls: type[C], checked: dict[str, Any]) -> C:
        """The config from values :func:`validate` (or :func:`lab.jobkit.paths.checked_config`) accepted;
        ``__post_init__``'s cross-field checks speak of the user's values, so they are refused as such."""
        try:
            return cls(**checked)
        except ConfigError:
            raise
        except (ValueError, UnknownNameError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
