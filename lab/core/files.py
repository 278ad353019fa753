"""Files: writing results so that a reader (the UI, a resumed run) never sees half of one; the model cache."""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside ``path`` and rename: readers see the old file or the new one."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def files_stamp(paths: Iterable[str | Path]) -> tuple[tuple[str, int, int], ...]:
    """What ``paths`` are now, in their order: each one's whole path, size and modification time (a file gone
    meanwhile is left out). A cache keyed by it sees an edited, added or removed file, and no other folder's."""
    stamp = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            continue
        stamp.append((str(path), stat.st_size, stat.st_mtime_ns))
    return tuple(stamp)


def cache_dir() -> Path:
    """Where converted models live: ``$CALIBRATION_LAB_CACHE`` or ``~/.cache/calibration-lab``."""
    return Path(os.environ.get("CALIBRATION_LAB_CACHE", Path.home() / ".cache" / "calibration-lab"))


def make_folder_once(target: Path, make: Callable[[Path], None], marker: str = "config.json") -> Path:
    """``target``, made by ``make`` unless it holds ``marker`` already. ``make`` writes into a
    temporary folder beside it, renamed into place: an interrupted first use never leaves or sees
    half a folder. Under a lock beside it, so first uses at once (a job and the app, or parallel test
    workers, on a fresh machine: the bundled model's 30 s conversion) make it once, the others waiting."""
    target = Path(target)
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / marker).is_file():  # made by the process this one waited for
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            make(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
