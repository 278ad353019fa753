import pytest
import torch

from lab.core import hub
from lab.core.errors import ModelLoadError
from lab.models.loading import load_model, resolve_model_path, select_device, select_dtype


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.hub_reachable.cache_clear()
    yield
    hub.hub_reachable.cache_clear()


@pytest.mark.model
def test_bundled_is_smollm2_in_fp32_on_cpu(bundled):
    cfg = bundled.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert bundled.dtype == torch.float32 and bundled.device.type == "cpu"
    assert bundled.tokenizer.chat_template  # the GGUF's chat template survived the conversion


@pytest.mark.model
def test_bundled_loads_from_its_local_directory(bundled):
    again = load_model(bundled.path, device="cpu")
    ids = torch.tensor([bundled.tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids).logits, bundled.model(ids).logits)


@pytest.mark.unit
def test_unknown_hub_id_offline_is_one_clear_line(offline):
    with pytest.raises(ModelLoadError) as err:
        load_model("no-such-org/no-such-model")
    message = str(err.value)
    assert "'no-such-org/no-such-model'" in message and "local directory" in message and "\n" not in message


@pytest.mark.unit
def test_missing_local_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope" / "model"))
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model_path(str(tmp_path / "weights.bin"))


@pytest.mark.unit
def test_dtype_and_device_selection():
    cpu = torch.device("cpu")
    assert select_dtype("auto", cpu) == torch.float32
    assert select_dtype("bfloat16", cpu) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="Expected dtype"):
        select_dtype("float8", cpu)
    assert select_device("cpu") == cpu
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            select_device("cuda")


@pytest.mark.model
def test_lora_adapter_is_applied(bundled, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = load_model(bundled.path, device="cpu").model
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([bundled.tokenizer("Hello there")["input_ids"]])
    with torch.no_grad():
        expected = peft_model(ids).logits
        plain = bundled.model(ids).logits
    adapted = load_model(bundled.path, adapter=str(tmp_path / "adapter"), device="cpu")
    with torch.no_grad():
        got = adapted.model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert (got - plain).abs().max() > 1e-3  # the adapter really changed the model


@pytest.mark.model
def test_adapter_directory_must_hold_a_peft_config(bundled, tmp_path):
    with pytest.raises(ModelLoadError, match="adapter_config.json"):
        load_model(bundled.path, adapter=str(tmp_path), device="cpu")
