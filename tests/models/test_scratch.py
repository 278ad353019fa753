"""A model created from a config (lab.models.scratch) is an ordinary model directory: the lab loads it,
renders every template with its tokenizer and scores with it like any other."""
from __future__ import annotations

import numpy as np
import pytest

from lab.data import load
from lab.data.templates import get_template
from lab.models.loading import load_model
from lab.models.scoring import score_cloze, score_letter
from tests.helpers import TINY_VOCAB, make_tiny_model


@pytest.fixture(scope="module")
def scratch(tiny_model_dir):
    """The tiny model conftest makes with lab.models.scratch.create (tests.helpers.make_tiny_model)."""
    return tiny_model_dir


@pytest.mark.model
def test_the_model_loads_and_scores_like_any_other(scratch):
    loaded = load_model(str(scratch), device="cpu")
    assert len(loaded.tokenizer) <= TINY_VOCAB and loaded.model.config.num_hidden_layers == 2
    test = load("synthetic", "test", ["bundled"], limit=4).records
    for name, scorer in (("first", score_letter), ("cft_chat", score_letter), ("cloze_plain", score_cloze)):
        prompts = [get_template(name).render(r, loaded.tokenizer) for r in test]
        scores = scorer(loaded.model, loaded.tokenizer, prompts)
        assert all(s.probs.shape == (4,) and np.isclose(s.probs.sum(), 1) for s in scores), name


@pytest.mark.model
def test_the_tokenizer_keeps_the_option_letters_whole_and_the_chat_template(scratch):
    tok = load_model(str(scratch), device="cpu").tokenizer
    letters = [tok.encode(f" {c}", add_special_tokens=False) for c in "ABCD"]
    assert all(len(ids) == 1 for ids in letters) and len({ids[0] for ids in letters}) == 4
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")


@pytest.mark.model
def test_creation_is_seeded(scratch, tmp_path):
    import torch
    from safetensors.torch import load_file

    again = make_tiny_model(tmp_path / "again")  # the same records and config, made again
    one, two = load_file(scratch / "model.safetensors"), load_file(again / "model.safetensors")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.unit
def test_the_name_scratch_is_a_model_made_once_on_first_use(monkeypatch, tmp_path):
    from lab.jobkit.kinds import parse_config
    from lab.models import scratch as module
    from lab.models.loading import resolve_model_path
    from lab.models.weights import local_model_dir

    made = []
    monkeypatch.setattr("lab.models.weights.scratch_target", lambda: tmp_path / "cache" / "scratch-synthetic")
    monkeypatch.setattr(module, "create", lambda out, records, cfg=None: made.append(len(records)) or
                        (out / "config.json").write_text("{}"))
    assert local_model_dir("scratch") is None  # not made yet: the pre-flight knows
    first, again = resolve_model_path("scratch"), resolve_model_path("scratch")
    assert first == again == str(tmp_path / "cache" / "scratch-synthetic") and made == [2000]
    assert local_model_dir("scratch") == tmp_path / "cache" / "scratch-synthetic"
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == [".scratch-synthetic.lock"]
    # no half-made folder left: only the lock that made first uses wait for one another
    assert parse_config({"kind": "evaluate", "model": "scratch", "dataset": "synthetic"})[1].model == "scratch"
