"""What the data tests share: the scripts that made the bundled samples, imported to check them."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def script_module(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module: scripts/ is not a package, so it is on the path only while importing."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
