"""Files: writing results so that a reader (the UI, a resumed run) never sees half of one; the model cache."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


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


def cache_dir() -> Path:
    """Where converted models live: ``$CALIBRATION_LAB_CACHE`` or ``~/.cache/calibration-lab``."""
    return Path(os.environ.get("CALIBRATION_LAB_CACHE", Path.home() / ".cache" / "calibration-lab"))


def make_folder_once(target: Path, make: Callable[[Path], None], marker: str = "config.json") -> Path:
    """``target``, made by ``make`` unless it holds ``marker`` already. ``make`` writes into a
    temporary folder beside it, renamed into place: an interrupted or concurrent first use never
    leaves or sees half a folder (when two race, the loser's copy is dropped: it is the same)."""
    target = Path(target)
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        make(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
