"""Memory and checkpoint estimates (lab.training.estimates): hand counts from a small config's dimensions,
then what PyTorch really allocates on this CPU — a training step under the memory profiler, in fp32
and under bf16 autocast as on a GPU, and the lab's own trainer — and what peft really trains.

What a CPU cannot check is the GPU's own kernels (flash attention, fused AdamW on CUDA, a bool
dropout mask) and the CUDA context: docs/gpu-checklist.md says what the GPU bench compares."""
import dataclasses

import pytest
import torch

from lab.models.weights import count_parameters, model_shape, size_text
from lab.training.estimates import (CHECKPOINT_EXTRA, CPU, GPU, NF4_BYTES, Precision, TrainingMemory, checkpoint_bytes,
                                    disk_peak, layer_activations, memory_advice, run_checkpoint_bytes, training_memory)

pytestmark = pytest.mark.model

# The small config of the hand counts: head_dim 16, so q is 64 wide and k, v 32.
H, I, LAYERS, HEADS, KV_HEADS, V = 64, 128, 2, 4, 2, 1000
B, T = 2, 16
N = B * T  # tokens in a micro-batch
R = 8  # LoRA rank
# (out, in) of one layer's linear weights: q, k, v, o, gate, up, down.
LINEARS = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)]
NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL = ["all-linear"]  # lora_targets' default
QV = ["q_proj", "v_proj"]  # the alignment-calibration paper's LoRA targets
QV_ADAPTER = R * LAYERS * (64 + 64 + 32 + 64)  # 3,584
N_LINEAR = LAYERS * sum(o * i for o, i in LINEARS)  # 73,728
P = N_LINEAR + LAYERS * 2 * H + H + V * H  # + two norms a layer, the final norm, the (tied) embedding: 138,048
ADAPTER = R * LAYERS * sum(o + i for o, i in LINEARS)  # 16,384


def _save(path, **dims):
    """A random Llama of exactly these dimensions, weights only: the hand counts below are worked out for
    them (vocabulary V included), so it is not conftest's tiny model, whose vocabulary its tokenizer sets."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=dims.get("vocab", V), hidden_size=dims.get("hidden", H),
                         intermediate_size=dims.get("intermediate", I), num_hidden_layers=dims.get("layers", LAYERS),
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("small") / "model")


@pytest.fixture(scope="module")
def shape(small):
    return model_shape(small)


def test_the_shape_is_read_from_config_and_headers(small, shape):
    assert shape.n_params == count_parameters(small) == P == 138_048
    assert sorted(shape.linears) == sorted(LINEARS * LAYERS) and shape.n_linear == N_LINEAR
    assert (shape.hidden, shape.intermediate, shape.layers, shape.vocab) == (H, I, LAYERS, V)
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (HEADS, KV_HEADS, 16)
    assert shape.lora_params(R) == ADAPTER == 16_384
    assert sorted(zip(shape.linear_names, shape.linears)) == sorted(list(zip(NAMES, LINEARS)) * LAYERS)
    assert shape.lora_params(R, QV) == QV_ADAPTER == 3_584


@pytest.mark.parametrize("targets", [["all-linear"], QV, ["down_proj"]])
def test_peft_trains_exactly_the_adapter_parameters_counted(small, shape, targets):
    """The reference is peft itself, given the target_modules prepare_model gives it."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from lab.training.lora import lora_target_modules

    model = LlamaForCausalLM.from_pretrained(small)
    model = get_peft_model(model, LoraConfig(r=R, target_modules=lora_target_modules(model, targets),
                                             task_type="CAUSAL_LM"))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == shape.lora_params(R, targets)


def test_a_target_the_model_lacks_is_refused_naming_its_linear_layers(small):
    """peft itself refuses a list only when no name matches: a misspelt one beside q_proj would train q alone."""
    from transformers import LlamaForCausalLM

    from lab.core.errors import DataError
    from lab.training.lora import lora_target_modules

    model = LlamaForCausalLM.from_pretrained(small)
    with pytest.raises(DataError, match=r"^lora_targets: the model has no linear layer named v_prj; its linear layers "
                                        r"are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj \(or "
                                        r"all-linear for every one\)$"):
        lora_target_modules(model, ["q_proj", "v_prj"])
    with pytest.raises(DataError, match="no linear layer named lm_head"):  # the output layer is not LoRA's here
        lora_target_modules(model, ["lm_head"])


def test_full_fine_tune_by_hand(shape):
    m = training_memory(shape, "full", B, T, GPU)
    assert m.weights == 4 * P and m.gradients == 4 * P and m.optimizer == 8 * P  # fp32 master weights, AdamW
    assert m.weight_copies == 2 * (N_LINEAR + V * H)  # autocast's bf16 copy of every linear, output layer too
    per_layer = (2 * (8 * H + 4)  # two RMSNorms: fp32 input and output, 1/rms
                 + 5 * 2 * H + 2 * I  # q, k, v, gate, up cast their input to bf16; down's input
                 + 2 * (2 * 64 + 2 * 32) + 4 * HEADS  # SDPA's q, k, v, output; fp32 log-sum-exp per head
                 + 3 * 2 * I)  # SiLU's input and output, up's output
    head = 8 * H + 4 + 2 * H + 8  # final norm, output layer's bf16 input, the labels
    assert per_layer == 3096 and m.activations == N * (LAYERS * per_layer + head) == 219_008
    assert m.logits == 3 * 4 * N * V == 384_000
    assert m.layer_backward == 4 * N_LINEAR / LAYERS + 4 * V * H + N * 4 * 2 * I == 436_224
    assert m.peak == 4 * P + 8 * P + m.weight_copies + m.activations + m.layer_backward == 2_587_264
    assert list(m.peak_parts()) == ["weights", "optimizer", "weight copies", "activations", "layer backward"]


def test_a_deeper_model_on_one_token_peaks_at_the_optimizer_step(shape):
    deeper = dataclasses.replace(shape, layers=8, linears=tuple(LINEARS * 8), linear_names=NAMES * 8,
                                 n_params=8 * (36_864 + 2 * H) + H + V * H)
    m = training_memory(deeper, "full", 1, 1, GPU)
    assert m.peak == 16 * 360_000 and list(m.peak_parts()) == ["weights", "gradients", "optimizer"]


def test_lora_by_hand(shape):
    m = training_memory(shape, "lora", B, T, GPU, base_dtype_bytes=2, lora_r=R, lora_dropout=0.05)
    assert m.weights == 2 * P + 4 * ADAPTER  # the frozen base in bf16, fp32 adapters
    assert (m.gradients, m.optimizer, m.weight_copies) == (4 * ADAPTER, 8 * ADAPTER, 2 * ADAPTER)
    inputs = 5 * H + 64 + I  # Σ of one layer's linear input widths
    per_layer = (2 * (4 * H + 4)  # RMSNorms with frozen weights: fp32 input, 1/rms
                 + (1 + 2) * inputs + 7 * 2 * R  # per linear: CUDA's bool dropout mask, bf16 input, A's output
                 + 2 * (2 * 64 + 2 * 32) + 4 * HEADS + 3 * 2 * I)
    first = 4 * H + 4 + 3 * H  # the first layer's input needs no gradient: its first norm and q, k, v masks
    assert per_layer == 3336 and m.activations == N * (LAYERS * per_layer - first + 4 * H + 4 + 8) == 207_616
    assert m.layer_backward == 4 * ADAPTER / LAYERS + N * 4 * 2 * I
    assert m.peak == m.weights + 8 * ADAPTER + 2 * ADAPTER + m.activations + 384_000 == 1_097_088


def test_lora_on_q_and_v_by_hand(shape):
    """Only q and v adapted: their masks, inputs and A outputs; every frozen layer's activations stay (the
    gradient passes through them to the adapters below)."""
    m = training_memory(shape, "lora", B, T, GPU, base_dtype_bytes=2, lora_r=R, lora_dropout=0.05, lora_targets=QV)
    assert m.weights == 2 * P + 4 * QV_ADAPTER and m.optimizer == 8 * QV_ADAPTER
    per_layer = (2 * (4 * H + 4) + (1 + 2) * 2 * H + 2 * 2 * R  # q's and v's mask, bf16 input, A's output
                 + 2 * (2 * 64 + 2 * 32) + 4 * HEADS + 3 * 2 * I)
    first = 4 * H + 4 + 2 * H  # the first layer: its first norm, q's and v's masks
    assert per_layer == 2104 and m.activations == N * (LAYERS * per_layer - first + 4 * H + 4 + 8)
    fp32 = layer_activations(shape, "lora", CPU, R, lora_dropout=0.0, lora_targets=QV)
    assert fp32 == 2 * (4 * H + 4) + 4 * (2 * 64 + 2 * 32) + 4 * HEADS + 3 * 4 * I + 4 * H + 2 * 4 * R  # one input
    assert layer_activations(shape, "lora", CPU, R, 0.0, ["o_proj", "down_proj"]) == (
        fp32 - 4 * H - 2 * 4 * R + 4 * I + 2 * 4 * R)  # o's input is SDPA's output, kept already; down's is not
    assert run_checkpoint_bytes(shape, "lora", R, False, QV) == (4 * QV_ADAPTER + CHECKPOINT_EXTRA, 4 * QV_ADAPTER)


def test_qlora_by_hand(shape):
    m = training_memory(shape, "qlora", B, T, GPU, lora_r=R)
    assert NF4_BYTES == 0.5 + 1 / 64 + 4 / (64 * 256)  # 4.127 bits a weight with double quantisation
    assert m.weights == NF4_BYTES * N_LINEAR + 4 * (P - N_LINEAR) + 4 * ADAPTER  # the rest upcast to fp32
    assert m.weight_copies == 2 * V * H  # the fp32 output layer's bf16 cast, kept for backward
    # Gradient checkpointing: each layer keeps its fp32 input; the top one is recomputed in backward.
    assert m.activations == N * (LAYERS * 4 * H + 4 * H + 4 + 8) == 24_960
    recomputed = 3336 + 2 * (5 * H + 64 + I)  # LoRA's layer, plus the 4-bit matmuls' bf16 inputs
    assert m.layer_backward == 4 * ADAPTER / LAYERS + N * 4 * 2 * I + N * recomputed
    assert m.peak == m.weights + 8 * ADAPTER + 2 * V * H + m.activations + m.logits == pytest.approx(1_028_882)


def test_checkpoint_sizes_and_the_disk_they_take_at_once_by_hand(shape):
    full, final = run_checkpoint_bytes(shape, "full", R, save_optimizer=True)
    assert full == 12 * P + CHECKPOINT_EXTRA and final == 4 * P  # fp32 weights + AdamW's moments
    assert run_checkpoint_bytes(shape, "full", R, save_optimizer=False) == (4 * P + CHECKPOINT_EXTRA, 4 * P)
    for method in ("lora", "qlora"):  # the fp32 adapter alone
        assert run_checkpoint_bytes(shape, method, R, True) == (12 * ADAPTER + CHECKPOINT_EXTRA, 4 * ADAPTER)
    assert checkpoint_bytes(100, 10, save_optimizer=True) == 100 + 80 + CHECKPOINT_EXTRA
    assert disk_peak([(full, final)], kept=1) == 2 * full  # the old one goes once the new one is whole
    assert disk_peak([(full, final)], kept=2) == 3 * full
    assert disk_peak([(10, 4), (6, 1)], kept=1) == (10 + 4) + (6 + 1) + 6  # the last run's save on top
    assert disk_peak([], kept=1) == 0


# ---------------------------------------------------------------- against what PyTorch allocates on this CPU
def _peak_bytes(step, preexisting: bool) -> int:
    """The most bytes of tensors alive at once while ``step`` runs, from torch's memory profiler
    (the CPU's counterpart of torch.cuda.max_memory_allocated); ``preexisting``: count the tensors
    ``step`` uses that were allocated before it (the weights and moments of a warmed-up step)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch.profiler._memory_profiler import Action
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            step()
        timeline = prof._memory_profile().timeline
    except (ImportError, AttributeError) as e:  # a private API: another torch may move it
        pytest.skip(f"torch's memory profiler is not where this test looks: {e}")
    counted = (Action.CREATE, Action.PREEXISTING) if preexisting else (Action.CREATE,)
    seen, live, peak = set(), 0, 0  # a running sum: the profiler may give two allocations one key
    for _, action, (key, _), size in timeline:
        if action in counted:
            seen.add(key)
            live += size
        elif action == Action.DESTROY and key in seen:  # not a tensor from before that we never counted
            live -= size
        peak = max(peak, live)
    return peak


# (method, precision, gradient checkpointing, LoRA targets, LoRA dropout); bf16 autocast runs on a CPU too,
# with fp32 dropout masks
CASES = {
    "full fp32": ("full", CPU, False, ALL, 0.05),
    "full bf16 autocast": ("full", Precision(compute=2, mask=4), False, ALL, 0.05),
    "lora fp32": ("lora", CPU, False, ALL, 0.05),
    "lora bf16 autocast": ("lora", Precision(compute=2, mask=4), False, ALL, 0.05),
    "lora checkpointed": ("lora", Precision(compute=2, mask=4), True, ALL, 0.05),  # QLoRA's structure
    "lora q v fp32": ("lora", CPU, False, QV, 0.05),
    "lora o down fp32 no dropout": ("lora", CPU, False, ["o_proj", "down_proj"], 0.0),
}


@pytest.mark.parametrize("case", CASES)
def test_a_training_step_allocates_what_the_estimate_says(case, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from lab.training.lora import lora_target_modules

    method, precision, checkpointing, targets, dropout = CASES[case]
    path = _save(tmp_path / "model", hidden=128, intermediate=352, layers=3, vocab=4000)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    if method == "lora":
        model = get_peft_model(model.to(torch.bfloat16 if precision.autocast else torch.float32),
                               LoraConfig(r=R, lora_dropout=dropout, target_modules=lora_target_modules(model, targets),
                                          task_type="CAUSAL_LM"))
    if checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    ids = torch.randint(0, 4000, (4, 64))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the moments exist from the second step on
    measured = _peak_bytes(step, preexisting=True)
    estimate = training_memory(model_shape(path), method, 4, 64, precision, 2 if precision.autocast else 4, R, dropout,
                               checkpointing=checkpointing, lora_targets=targets)
    assert estimate.peak == pytest.approx(measured, rel=0.03), estimate.parts()


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """The tiny model (tests.helpers.make_tiny_model) at lab.models.scratch's default width, 128. At
    conftest's width of 32 the estimate falls 7 % short of what the trainer allocates: small tensors
    it leaves out (a real model's width makes them negligible) weigh more than 3 % there; at 128 it is
    within 1.2 % (full) and 2.1 % (LoRA). The earlier tiny model, width 32 with the bundled 49k
    vocabulary, hid them behind its logits, most of its peak."""
    from tests.helpers import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("wide") / "model", hidden=128, intermediate=384)


@pytest.mark.slow  # the fast tier measures the estimate on single steps (test_a_training_step_allocates_...)
@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_lab_trainer_allocates_what_it_reports(method, wide_model_dir, csqa_files, tmp_path, monkeypatch):
    """The whole training code path — prepare_model, transformers' Trainer, accelerate — on this CPU
    (fp32), against the estimate the job reports in its ``memory`` event (at its longest example).
    Two epochs: the batch holding the longest example then also comes after the first step, when
    AdamW's moments exist (the estimate's assumption; a long run meets it)."""
    from transformers import Trainer

    from lab.core.events import EventWriter, read_events
    from lab.training.config import TrainConfig
    from lab.training.trainer import finetune

    measured = []
    train = Trainer.train
    monkeypatch.setattr(Trainer, "train", lambda self, **kw: measured.append(
        _peak_bytes(lambda: train(self, **kw), preexisting=True)))  # the loop alone: loading is not profiled
    cfg = TrainConfig(model=str(wide_model_dir), method=method, dataset="csqa", data_files=csqa_files, limit=8,
                      val_split=None, epochs=2, batch_size=4)
    finetune(cfg, tmp_path / "run", EventWriter(tmp_path / "events.jsonl"))
    (event,) = [e for e in read_events(tmp_path / "events.jsonl")[0] if e["stage"] == "memory"]
    assert "of RAM at the peak, batches of 4 ×" in event["message"]
    assert event["peak"] == pytest.approx(measured[0], rel=0.03)
    assert {f.name for f in dataclasses.fields(TrainingMemory)} <= set(event)  # every term, for the GPU bench


# ---------------------------------------------------------------- TRL's trainers: the sft and dpo kinds
def test_trls_fused_head_replaces_the_logits_by_hand(shape):
    """SFTTrainer's fused LM head: no B·T·V logits, a 32768-wide tile buffer, no bf16 copy of the output layer."""
    m = training_memory(shape, "full", B, T, GPU, trainer="sft")
    assert m.weight_copies == 2 * N_LINEAR  # the output layer is cast chunk by chunk, not kept
    head = 8 * H + 4 + 4 * H + 8 + 2 * 4  # final norm; the head's fp32 input copy, targets, log-normaliser, entropy
    assert m.activations == N * (LAYERS * 3096 + head)
    tile = min(N, 4096)  # tokens a tile: all 32 here
    assert m.logits == (2 * tile * 32768  # the bf16 tile buffer, as wide as TRL's vocabulary chunk whatever V
                        + 2 * (tile + V) * H  # bf16 casts of the input's token chunk and the weight's vocabulary chunk
                        + 4 * N * H + 4 * V * H)  # fp32 gradients: the head's input and the (tied) output layer
    assert (m.reference, m.reference_forward) == (0, 0)
    on_cpu = training_memory(shape, "full", B, T, CPU, trainer="sft")  # torch folds the tiles: temporaries
    assert on_cpu.logits == 4 * tile * 32768 + 7 * 4 * tile * V + tile * V + 4 * N * H + 4 * V * H
    lora = training_memory(shape, "lora", B, T, GPU, lora_r=R, trainer="sft")
    assert lora.logits == 2 * tile * 32768 + 4 * N * H  # a bf16 base: no casts; a frozen output layer: no gradient


def test_dpo_doubles_the_batch_and_holds_a_reference_by_hand(shape):
    sft = training_memory(shape, "full", 2 * B, T, GPU, trainer="sft")
    m = training_memory(shape, "full", B, T, GPU, trainer="dpo")  # B pairs: 2B sequences
    assert (m.activations, m.logits, m.layer_backward) == (sft.activations, sft.logits, sft.layer_backward)
    assert m.reference == 4 * P  # a second copy in the policy's dtype, fp32 for full training
    tokens = 2 * N
    head = 2 * tokens * 32768 + 2 * 4 * tokens * H + 2 * (tokens + V) * H  # tile, the norm's output and its copy
    assert m.reference_forward == 2 * N_LINEAR + max(head, 3 * 2 * I * tokens)  # autocast's casts of the copy
    assert m.peak == 4 * P + 4 * P + 8 * P + m.weight_copies + m.activations + max(m.logits, m.layer_backward,
                                                                                   m.reference_forward)
    assert "reference" in m.peak_parts()
    precomputed = training_memory(shape, "full", B, T, GPU, trainer="dpo", precompute_ref=True)
    assert (precomputed.reference, precomputed.reference_forward) == (0, 0)
    assert precomputed.peak == sft.peak
    lora = training_memory(shape, "lora", B, T, GPU, lora_r=R, trainer="dpo")
    lora_head = 2 * tokens * 32768 + 2 * 2 * tokens * H  # the bf16 base's own: no casts
    assert lora.reference == 0 and lora.reference_forward == max(lora_head, 3 * 2 * I * tokens)


def test_lora_without_dropout_keeps_no_masks_by_hand(shape):
    """DPOTrainer turns dropout off, LoRA's too: no masks. In fp32 an adapter keeps its linear's own input
    (q, k, v share one, gate and up one); under autocast peft's fp32 cast and autocast's bf16 one make a copy
    per adapter."""
    shared = 2 * (4 * H + 4) + 2 * (2 * 64 + 2 * 32) + 4 * HEADS + 3 * 2 * I  # as in test_lora_by_hand, in bf16
    assert layer_activations(shape, "lora", GPU, R, lora_dropout=0.0) == shared + 2 * (5 * H + 64 + I) + 7 * 2 * R
    fp32 = 2 * (4 * H + 4) + 4 * (2 * 64 + 2 * 32) + 4 * HEADS + 3 * 4 * I
    assert layer_activations(shape, "lora", CPU, R, lora_dropout=0.0) == fp32 + 4 * (2 * H + I) + 7 * 4 * R
    assert training_memory(shape, "lora", B, T, GPU, lora_r=R, lora_dropout=0.05, trainer="dpo").activations == (
        training_memory(shape, "lora", 2 * B, T, GPU, lora_r=R, lora_dropout=0.0, trainer="sft").activations)


def test_pre_flight_counts_sft_and_dpo_jobs_as_trl_trains_them(small, shape):
    """Their own fields (DPO's max_length defaults to 1024, not TrainConfig's 512) and their trainer's terms."""
    from jobs.preflight import plan

    (dpo,) = plan("dpo", {"model": str(small), "batch_size": 2})
    assert dpo.memory == training_memory(shape, "full", 2, 1024, GPU, 2, 16, 0.05, trainer="dpo").peak
    assert "batches of 2 pairs (4 sequences) × 1024 tokens" in dpo.how and "reference" in dpo.how
    (precomputed,) = plan("dpo", {"model": str(small), "batch_size": 2, "precompute_ref_log_probs": True})
    assert precomputed.memory == training_memory(shape, "full", 2, 1024, GPU, trainer="dpo", precompute_ref=True).peak
    (sft,) = plan("sft", {"model": str(small), "method": "lora", "lora_r": R})
    assert sft.memory == training_memory(shape, "lora", 8, 1024, GPU, 2, R, 0.05, trainer="sft").peak


def test_out_of_memory_advice_says_what_to_lower_largest_saving_first(shape):
    settings = {"batch_size": 8, "grad_accum": 1, "max_length": 64, "method": "full", "lora_r": R, "lora_dropout": 0.05,
                "lora_targets": ["all-linear"]}

    def peak(method="full", batch=8, seq_len=64, precompute=False):
        return training_memory(shape, method, batch, seq_len, GPU, 2, R, 0.05, trainer="dpo",
                               precompute_ref=precompute).peak

    lowered = {"batch_size 8 → 4 and grad_accum 1 → 2 (the same 8 pairs a step)": peak(batch=4),
               "max_length 64 → 32": peak(seq_len=32), "method full → lora": peak(method="lora"),
               "precompute_ref_log_probs false → true": peak(precompute=True)}
    assert all(after < peak() for after in lowered.values())
    items = [f"{text}: {size_text(peak())} → {size_text(after)}" for text, after in sorted(lowered.items(),
                                                                                          key=lambda item: item[1])]
    heading = "To fit, lower (largest saving first, estimated peak before → after): "
    assert memory_advice(settings, shape, trainer="dpo") == heading + "; ".join(items + ["a smaller model"])
    # Without the model's shape, no figures: the usual order. A batch of 7 goes to 1 to keep 14 examples a step.
    assert memory_advice({**settings, "batch_size": 7, "grad_accum": 2}) == (
        "To fit, lower: batch_size 7 → 1 and grad_accum 2 → 14 (the same 14 examples a step); max_length 64 → 32; "
        "method full → lora; a smaller model")
    # Nothing left to lower but the model: one example a step, QLoRA, examples already shorter than max_length / 2.
    nothing_left = {**settings, "batch_size": 1, "method": "qlora"}
    assert memory_advice(nothing_left, shape, seq_len=20) == heading + "a smaller model"
    assert "method lora → qlora" in memory_advice({**settings, "method": "lora"})


# (kind, method, other fields). The model is the module's wide tiny one (width 128, vocabulary 600): on a
# CPU TRL's fused head allocates its tile buffer 32768 wide whatever the vocabulary, 128 KiB a token in fp32,
# about 70 % of these runs' peaks (a GPU's bf16 buffer of at most 4096 tokens is 256 MiB: little in a real run).
# Measured: estimate / allocated 0.998 to 1.002 here; 0.987 (dpo lora) to 0.999 with width 256 and 4 layers,
# where the buffer is 35 % of the peak. Hence 2 %.
TRL_CASES = {
    "sft full": ("sft", "full", {}),
    "sft lora": ("sft", "lora", {}),
    "dpo full": ("dpo", "full", {}),
    "dpo lora": ("dpo", "lora", {}),
    "dpo precomputed": ("dpo", "full", {"precompute_ref_log_probs": True}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", TRL_CASES)
def test_trls_trainers_allocate_what_the_lab_reports(case, wide_model_dir, tmp_path, monkeypatch):
    """The sft and dpo kinds' whole training code path on this CPU (fp32, torch folding the fused head's
    tiles), against the estimate the job reports in its ``memory`` event. One batch an epoch, two epochs:
    the second step runs with AdamW's moments, as the estimate assumes; no checkpoint is written in them
    (``save_steps``), which would only slow the profiler."""
    import importlib

    from transformers import Trainer

    from lab.core.events import read_events
    from lab.jobkit.kinds import parse_config
    from lab.jobkit.worker import JobContext

    kind, method, extra = TRL_CASES[case]
    measured = []
    train = Trainer.train
    monkeypatch.setattr(Trainer, "train", lambda self, **kw: measured.append(
        _peak_bytes(lambda: train(self, **kw), preexisting=True)))
    data = {"dataset": "alpaca", "data_files": ["bundled"]} if kind == "sft" else {"preferences": ["bundled"]}
    _, cfg = parse_config({"kind": kind, "model": str(wide_model_dir), "method": method, "limit": 2, "epochs": 2,
                           "batch_size": 2, "max_length": 128, "save_steps": 100, "device": "cpu", "calibration": [],
                           **data, **extra})
    importlib.import_module(f"lab.kinds.{kind}.run").run_job(cfg, JobContext(tmp_path))
    (event,) = [e for e in read_events(tmp_path / "events.jsonl")[0] if e["stage"] == "memory"]
    assert event["peak"] == pytest.approx(measured[0], rel=0.02), (measured[0], event)
    assert (event["reference"] > 0) == (case == "dpo full")


@pytest.mark.model
@pytest.mark.parametrize("kind", ["finetune", "dpo"])
def test_a_run_out_of_memory_says_what_to_lower_with_the_estimates(kind, wide_model_dir, tmp_path, monkeypatch):
    """Through the worker, as a job fails: its result names the stage, torch's words and the advice of
    :func:`memory_advice` for this job's own settings (DPO's pairs and reference copy included)."""
    import json

    from transformers import Trainer

    from lab.core.yamlio import dump_yaml
    from lab.jobkit.worker import run

    def out_of_memory(self, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore details")

    monkeypatch.setattr(Trainer, "train", out_of_memory)
    config = {"kind": kind, "model": str(wide_model_dir), "method": "full", "batch_size": 8, "max_length": 256,
              "limit": 8, "epochs": 1, "device": "cpu"}
    config.update({"finetune": {"dataset": "synthetic", "data_files": ["bundled"], "val_split": None},
                   "dpo": {"preferences": ["bundled"], "calibration": []}}[kind])
    (tmp_path / "config.yaml").write_text(dump_yaml(config))
    assert run(tmp_path / "config.yaml", tmp_path / "run") == 3
    error = json.loads((tmp_path / "run" / "result.json").read_text())["error"]
    assert error.startswith("out of memory: train: CUDA out of memory. Tried to allocate 2.00 GiB. To fit, lower "
                            "(largest saving first, estimated peak before → after): "), error
    unit = "pairs" if kind == "dpo" else "examples"
    assert f"batch_size 8 → 4 and grad_accum 1 → 2 (the same 8 {unit} a step): " in error
    assert error.endswith("; a smaller model")  # (LoRA saves nothing on a model this small: not offered)
    assert ("precompute_ref_log_probs false → true" in error) == (kind == "dpo")
