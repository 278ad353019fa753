"""lm-eval's index of its ~14,700 installed tasks, kept in the lab's cache: building it reads every
task YAML (6.5 s on an idle core, 13 s or more beside other work) in each process that meets a task
not shipped with the lab (a job on ``lm-eval:mmlu``, the Launch form's picker after a restart);
reading it back takes about 0.5 s."""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

from lab.core.files import cache_dir, files_stamp, make_folder_once

INDEX_DIR, INDEX_FILE = "lm-eval-index", "index.pickle"  # under the lab's cache (lab.core.files.cache_dir)
KEEP = {True: 4, False: 32}  # indexes kept with lm-eval's tasks (~16 MB each) and without (a few kB each)


def _installed_stamp(defaults: bool) -> tuple:
    """lm-eval's version, where it is installed and, with ``defaults``, every task file it ships (name,
    size, time): a reinstall, an upgrade or an edited task makes another index. About 0.15 s for its
    ~14,700 files."""
    import lm_eval
    import lm_eval.tasks

    tasks = Path(lm_eval.tasks.__file__).parent
    files = [os.path.join(folder, name) for folder, _, names in (os.walk(tasks) if defaults else ())
             for name in names if name.endswith((".yaml", ".yml", ".py"))]
    return getattr(lm_eval, "__version__", "?"), str(tasks), files_stamp(sorted(files))


@functools.lru_cache(maxsize=8)
def cached_index(folders: tuple[str, ...], defaults: bool, stamp: tuple) -> Any:
    """lm-eval's ``TaskManager`` over ``folders`` and, with ``defaults``, its installed tasks: built once per machine,
    then read from the cache (and kept for the process). Keyed by everything it was read from
    (:func:`_installed_stamp`, ``folders`` and their ``stamp``) and made under
    :func:`lab.core.files.make_folder_once`'s lock, so workers starting at once build it once. The pickle is the
    lab's own, in the user's own cache; a damaged one is removed and the index built again; where the cache cannot
    be written, this process keeps the index it built."""
    from lm_eval.tasks import TaskManager

    read_from = (sys.version_info[:2], folders, defaults, stamp, _installed_stamp(defaults))
    key = ("full-" if defaults else "own-") + hashlib.sha256(repr(read_from).encode()).hexdigest()[:24]
    built: list[Any] = []

    def make(tmp: Path) -> None:
        built.append(TaskManager(include_path=list(folders), include_defaults=defaults))
        with open(tmp / INDEX_FILE, "wb") as f:
            pickle.dump(built[0], f, protocol=pickle.HIGHEST_PROTOCOL)

    root = cache_dir() / INDEX_DIR
    try:
        target = make_folder_once(root / key, make, marker=INDEX_FILE)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):  # no cache to write: this process's index
        return built[0] if built else TaskManager(include_path=list(folders), include_defaults=defaults)
    if built:
        _keep_newest(root, key.split("-")[0], KEEP[defaults])
        return built[0]
    try:
        with open(target / INDEX_FILE, "rb") as f:
            index = pickle.load(f)
        if isinstance(index, TaskManager):
            os.utime(target)  # used: the last to go
            return index
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        pass
    shutil.rmtree(target, ignore_errors=True)
    return TaskManager(include_path=list(folders), include_defaults=defaults)


def _keep_newest(root: Path, kind: str, keep: int) -> None:
    """Remove all but the ``keep`` last used indexes of ``kind`` (``full`` or ``own``): each lm-eval
    upgrade, include folder and edit of a task makes one, and an include folder's must not push out
    the ~16 MB index of lm-eval's own tasks."""
    made = sorted(root.glob(f"{kind}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in made[keep:]:
        shutil.rmtree(old, ignore_errors=True)
        (root / f".{old.name}.lock").unlink(missing_ok=True)
