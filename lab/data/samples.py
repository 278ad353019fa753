"""The dataset samples that ship inside the package, named by the entry ``bundled`` in ``data_files``.

A fresh machine has no network and no dataset files, yet every job kind's defaults must run on it:
small samples of datasets whose licences allow it (``bundled/SOURCES.md``) live in ``bundled/``
beside this module, in their original formats, and each dataset registers its own
(:attr:`DatasetSpec.bundled`: split → file or folder). ``data_files: [bundled]`` stands for them,
as ``model: bundled`` stands for the bundled model; it is a whole entry, never a path prefix, so
``bundled/../x`` stays an ordinary (relative) path for the path checks. Configs keep the entry as
written (:mod:`lab.jobkit.paths` checks it); :mod:`lab.data.files` expands it here, at the moment a load reads.
``scripts/make_bundled_data.py`` regenerates the files from ../shared/data.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from lab.core.errors import DataError

from .spec import DatasetSpec

BUNDLED = "bundled"
ROOT = Path(__file__).resolve().parent / "bundled"  # the samples: an allowed, read-only root (lab.jobkit.paths)
PREFERENCES = ROOT / "preferences" / "openbookqa_dev_pairs.jsonl"  # right vs wrong answers (SOURCES.md)


def entries(spec: DatasetSpec) -> list[str]:
    """``SPLIT=/absolute/path`` for every file or folder of ``spec``'s sample, in registration order."""
    return [f"{split}={ROOT / rel}" for split, rel in spec.bundled]


def no_sample(name: str, with_sample: Iterable[str]) -> DataError:
    """The refusal of ``bundled`` for a dataset without a sample: which have one, and what to do instead."""
    return DataError(f"{name} has no bundled sample; 'bundled' in data_files names one for: "
                     f"{', '.join(with_sample)}. Give {name}'s own files in data_files (or upload them), or "
                     "leave data_files empty to load it from the Hugging Face hub.")


def misplaced(entry: str) -> DataError:
    """``SPLIT=bundled``: the token names every split of a sample, so it is refused with a split."""
    return DataError(f"{entry!r}: 'bundled' stands alone in data_files (it names every split of the sample); "
                     "write data_files: [bundled] and pick the split with the split field.")


def require(spec: DatasetSpec, with_sample: Iterable[str]) -> None:
    """Refuse ``bundled`` for a dataset without a sample; ``with_sample``: those that have one."""
    if not spec.bundled:
        raise no_sample(spec.name, with_sample)


def expand(spec: DatasetSpec, given: Iterable[str], with_sample: Iterable[str]) -> list[str]:
    """``given`` with each whole entry ``bundled`` replaced by the sample's ``SPLIT=PATH`` entries."""
    out: list[str] = []
    for entry in given:
        if entry == BUNDLED:
            require(spec, with_sample)
        out += entries(spec) if entry == BUNDLED else [entry]
    return out


def is_sample(path: Path) -> bool:
    """Whether ``path`` is one of the bundled files (a load then says it read "the bundled sample")."""
    return path.resolve().is_relative_to(ROOT)
