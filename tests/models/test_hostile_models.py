"""Crafted model folders (issue 43, R7 and R15): a safetensors header that claims more than its file, nests past
the recursion limit or gives shapes that are not counts; a config.json whose sizes are zero, text or null; a
chat template that raises, never ends, is no text or has no place for the reply. Each is refused at submit,
through the store as the form and the API submit, naming the file inside the folder and what is wrong in it,
never the server's path; and when the worker loads such a model (one changed since, or a hub model first read
then), the failure blames the model, not the lab."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from jobs.store import JobStore
from lab.core.config import ConfigError
from lab.core.errors import USER_ERRORS, ModelLoadError
from lab.models.tokenizers import check_folder_template
from lab.models.weights import count_parameters, model_shape

CONFIG = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 24}
TENSORS = {"model.embed_tokens.weight": [16, 8], "model.layers.0.self_attn.q_proj.weight": [8, 8],
           "model.layers.0.mlp.gate_proj.weight": [24, 8]}
GOOD_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _header(tensors: dict[str, list[int]]) -> dict:
    """A safetensors header for F32 ``tensors`` laid out one after another."""
    header, at = {}, 0
    for name, shape in tensors.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + size]}
        at += size
    return header


def _safetensors(header: object, length: int | None = None, data: int | None = None) -> bytes:
    """A safetensors file: the header's length (or ``length``, a lie), the header, then zeros for its tensors."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    data = sum(4 * s[0] * s[1] for s in TENSORS.values()) if data is None else data
    return struct.pack("<Q", len(raw) if length is None else length) + raw + bytes(data)


def _folder(root: Path, config: object = CONFIG, weights: bytes | None = None, template: object = GOOD_TEMPLATE,
            tokenizer_config: bytes | None = None, **files: bytes) -> Path:
    """A model folder as a user may upload one: config.json, model.safetensors, tokenizer_config.json."""
    folder = root / "model"
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    (folder / "model.safetensors").write_bytes(_safetensors(_header(TENSORS)) if weights is None else weights)
    (folder / "tokenizer_config.json").write_bytes(
        json.dumps({"chat_template": template}).encode() if tokenizer_config is None else tokenizer_config)
    for name, content in files.items():
        (folder / name.replace("__", ".")).write_bytes(content)
    return folder


def _entry(**info) -> bytes:
    """A file whose one tensor entry is ``info`` (the rest as a valid entry has it)."""
    return _safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], **info}}, data=16)


DEEP = ("[" * 100_000 + "]" * 100_000).encode()
# (what the folder is made of, the file the refusal names, what it says is wrong)
HOSTILE = {
    "header length past 2^63": (dict(weights=struct.pack("<Q", 2**64 - 1) + b"{}"), "model.safetensors",
                                "safetensors allows 100,000,000"),
    "header longer than the file": (dict(weights=struct.pack("<Q", 5000) + b"{}"), "model.safetensors",
                                    "claims 5,000 bytes, but the file holds 2"),
    "file of 4 bytes": (dict(weights=b"\x01\x02\x03\x04"), "model.safetensors", "too short"),
    "header not JSON": (dict(weights=_safetensors(b"not json")), "model.safetensors: the header", "is not JSON"),
    "header not UTF-8": (dict(weights=_safetensors(b"\xff\xfe{}")), "model.safetensors: the header", "is not JSON"),
    "header nested 100,000 deep": (dict(weights=_safetensors(DEEP)), "model.safetensors: the header", "too deeply"),
    "header a list": (dict(weights=_safetensors([1, 2])), "model.safetensors", "is a JSON list"),
    "shape of text": (dict(weights=_entry(shape=["a", 2])), "model.safetensors: tensor 'w'", "['a', 2]"),
    "shape of fractions": (dict(weights=_entry(shape=[2.5, 2])), "model.safetensors: tensor 'w'", "[2.5, 2]"),
    "shape negative": (dict(weights=_entry(shape=[-2, -2])), "model.safetensors: tensor 'w'", "non-negative"),
    "shape of booleans": (dict(weights=_entry(shape=[True, 2])), "model.safetensors: tensor 'w'", "[True, 2]"),
    "shape a number": (dict(weights=_entry(shape=4)), "model.safetensors: tensor 'w'", "got 4"),
    "tensor entry a number": (dict(weights=_safetensors({"w": 5}, data=0)), "model.safetensors: tensor 'w'",
                              "got None"),
    "data past the file": (dict(weights=_entry(data_offsets=[0, 10**12])), "model.safetensors: tensor 'w'",
                           "within the file's 16 bytes"),
    "shape of 10^18 parameters": (dict(weights=_entry(shape=[10**9, 10**9])), "model.safetensors: tensor 'w'",
                                  "data_offsets span 16"),
    "num_attention_heads 0": (dict(config={**CONFIG, "num_attention_heads": 0}), "config.json",
                              "num_attention_heads must be a positive integer, got 0"),
    "hidden_size as text": (dict(config={**CONFIG, "hidden_size": "8"}), "config.json", "got '8'"),
    "num_hidden_layers 0": (dict(config={**CONFIG, "num_hidden_layers": 0}), "config.json", "got 0"),
    "intermediate_size null": (dict(config={**CONFIG, "intermediate_size": None}), "config.json", "got None"),
    "vocab_size a fraction": (dict(config={**CONFIG, "vocab_size": 16.5}), "config.json", "got 16.5"),
    "vocab_size true": (dict(config={**CONFIG, "vocab_size": True}), "config.json", "got True"),
    "num_key_value_heads as text": (dict(config={**CONFIG, "num_key_value_heads": "two"}), "config.json",
                                    "num_key_value_heads must be a positive integer, got 'two'"),
    "head_dim negative": (dict(config={**CONFIG, "head_dim": -4}), "config.json", "head_dim must be"),
    "config.json not JSON": (dict(config=b"{vocab_size: 16"), "config.json", "is not JSON"),
    "config.json nested deep": (dict(config=DEEP), "config.json", "too deeply"),
    "config.json a list": (dict(config=[CONFIG]), "config.json", "a JSON list"),
    "no config.json, an adapter": (dict(config=None, adapter_config__json=b"{}"), "config.json",
                                   "it is a LoRA adapter"),
    "chat template raises": (dict(template="{{ raise_exception('no chat here') }}"), "tokenizer_config.json",
                             "TemplateError: no chat here"),
    "chat template loops": (dict(template="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                          "{% endfor %}"), "tokenizer_config.json", "did not finish"),
    "chat template 10^9 characters": (dict(template="{{ 'x' * 1000000000 }}"), "tokenizer_config.json",
                                      "did not finish"),
    "chat template a number": (dict(template=5), "tokenizer_config.json", "must be Jinja text, got a JSON int"),
    "chat template without the reply": (dict(template="{% for m in messages if m.role == 'user' %}{{ m.content }}"
                                                      "{% endfor %}"), "tokenizer_config.json", "no place for the "
                                                                                                "assistant's reply"),
    "chat template in .jinja, bad Jinja": (dict(chat_template__jinja=b"{% for %}"), "chat_template.jinja",
                                           "is not valid Jinja"),
    "tokenizer_config.json not JSON": (dict(tokenizer_config=b"{chat"), "tokenizer_config.json", "is not JSON"),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_crafted_model_folder_is_refused_at_submit_naming_its_file(tmp_path, case):
    made, file, wrong = HOSTILE[case]
    folder = _folder(tmp_path / "upload", **made)
    store = JobStore(tmp_path / "runs")
    for kind in ("evaluate", "finetune"):  # inference, and training (pre-flight's memory and disk estimates)
        with pytest.raises(ConfigError) as refused:
            store.submit({"kind": kind, "model": str(folder), "dataset": "synthetic", "data_files": ["bundled"]},
                         roots=[tmp_path])
        message = str(refused.value)
        assert message.startswith(f"model: in the model folder, {file}") and wrong in message, message
        assert str(tmp_path) not in message
    assert store.list() == []


@pytest.mark.unit
def test_a_wellformed_folder_passes_and_is_counted(tmp_path):
    """The cases above differ from this folder in one thing each: it passes, with its shape read."""
    folder = _folder(tmp_path / "upload")
    store = JobStore(tmp_path / "runs")
    store.submit({"kind": "finetune", "model": str(folder), "dataset": "synthetic", "data_files": ["bundled"]},
                 roots=[tmp_path])
    assert count_parameters(folder) == 16 * 8 + 8 * 8 + 24 * 8
    assert model_shape(folder).linear_names == ("q_proj", "gate_proj")


@pytest.mark.unit
@pytest.mark.parametrize("case", [c for c, (_, file, _) in HOSTILE.items() if file.startswith(("model.", "config"))])
def test_the_size_readers_answer_none_for_a_crafted_folder(tmp_path, case):
    """The lane's memory budget and the trainer's advice read sizes with no refusal to make: None, never a crash."""
    made, file, _ = HOSTILE[case]
    folder = _folder(tmp_path, **made)
    assert model_shape(folder) is None
    if file.startswith("model.safetensors"):
        assert count_parameters(folder) is None


@pytest.mark.model
def test_a_hostile_template_found_at_run_time_blames_the_model(tiny_model_dir, tmp_path):
    """A model whose template changed after submit (or a hub model, first read by the worker) fails as the
    user's input, naming the model and its template, not as an internal error."""
    import shutil

    from lab.models.loading import load_model

    folder = tmp_path / "mine"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('no chat here') }}")
    with pytest.raises(ModelLoadError, match=r"^model 'mine': its chat template fails on a one-question "
                                              r"conversation: TemplateError: no chat here") as failed:
        load_model(str(folder), device="cpu")
    assert isinstance(failed.value, USER_ERRORS) and str(tmp_path) not in str(failed.value)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    with pytest.raises(ModelLoadError, match="^model 'mine': config.json: num_attention_heads must be a positive"):
        load_model(str(folder), device="cpu")


@pytest.mark.unit
def test_a_real_chat_template_passes(tmp_path):
    """The bundled model's template (SmolLM2's ChatML) and a Gemma-style one that refuses a system turn pass:
    the probe is a user's question and the reply, nothing a real template refuses."""
    gemma = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
             "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}"
             "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + "
             "role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt"
             " %}{{'<start_of_turn>model\\n'}}{% endif %}")
    chatml = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
              "system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
              "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    for i, template in enumerate((gemma, chatml, [{"name": "default", "template": chatml}])):
        check_folder_template(_folder(tmp_path / str(i), template=template))
