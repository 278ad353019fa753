import socket
import threading
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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, bundled):
    """A 2-layer random Llama with the bundled tokenizer: real training code paths in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=bundled.model.config.vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    path = tmp_path_factory.mktemp("tiny") / "model"
    LlamaForCausalLM(config).save_pretrained(path)
    bundled.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def csqa_files(shared_data):
    return [f"train={shared_data / 'commonsenseqa' / 'train.jsonl'}", f"validation={shared_data / 'commonsenseqa' / 'dev.jsonl'}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(ctx):
    """The app for ``ctx`` with its scheduler on a free loopback port; yields its URL."""
    from jobs.scheduler import Scheduler
    from ui.app import build
    from ui.messages import CSS

    stop = threading.Event()
    threading.Thread(target=Scheduler(ctx.store).run_forever, args=(stop, 0.2), daemon=True).start()
    demo = build(ctx)
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop.set()
        demo.close()


@pytest.fixture
def served(tmp_path, shared_data, bundled):
    """The app with its scheduler, on a free loopback port; ``../shared/data`` allowed."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs", (shared_data,))
    for url in _serve(ctx):
        yield ctx, url


@pytest.fixture
def served_bare(tmp_path):
    """The app on an empty runs folder, no extra folders allowed, no model loaded."""
    from ui.context import LabContext

    ctx = LabContext(tmp_path / "runs")
    for url in _serve(ctx):
        yield ctx, url
