from pathlib import Path

import pytest


@pytest.fixture
def shared_data() -> Path:
    """The real dataset files in ../shared/data (see SOURCES.md there); skip where they are absent."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path}")
    return path


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M-Instruct, converted once per machine (about 30 s the first time)."""
    from lab.models import load_model

    return load_model("bundled", device="cpu")


@pytest.fixture
def arc_records(shared_data):
    from lab.data import load_records

    return load_records("arc_challenge", "test", [str(shared_data / "arc_challenge" / "test.jsonl")], limit=6).records
