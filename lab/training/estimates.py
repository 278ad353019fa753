"""What a training run holds: GPU memory at its peak, and the disk its checkpoints take.

Plain functions of a model's shape (:class:`lab.models.weights.ModelShape`, read from its headers and
config.json, no torch), so the web server's pre-flight (:mod:`jobs.preflight`) and the worker
(before each checkpoint, :mod:`lab.training.trainer`) count with the same formula. Every term follows
the code path of :func:`lab.training.trainer.prepare_model` and ``training_arguments``:

- **full**: weights loaded in fp32 and trained under bf16 autocast on a GPU
  (``TrainingArguments.bf16``): fp32 master weights (4 B/param), fp32 gradients (4), AdamW's two
  fp32 moments (8) = 16 B/param, plus the bf16 copy of every linear weight (2 B/param of those)
  that autocast makes in the forward pass and the backward pass keeps.
- **lora**: the frozen base in the job's dtype (bf16: 2 B/param), the adapters — r·(in + out) per
  linear layer, counted from the weight shapes — in fp32 with their gradients and moments (16 B).
- **qlora**: ``prepare_model_for_kbit_training``: linear weights in 4-bit NF4 with double
  quantisation (:data:`NF4_BYTES`), every other weight (embeddings, norms) upcast to fp32, and
  gradient checkpointing on; adapters as LoRA.

Activations, per token (B·T of them; pre-flight takes T = ``max_length``, the longest a batch can
be; the worker the longest example it really has), are the tensors each decoder layer keeps for
its backward pass, counted for a Llama-type layer (RMSNorm, SDPA attention that keeps no T×T
matrix, SwiGLU MLP) in :func:`layer_activations`: 30h + 4kv + 8i + 4a + 8 bytes a token for full
training under autocast. The loss upcasts the logits to fp32: at the start of the backward pass
three B·T·V fp32 tensors are alive (log-softmax's output and the gradients into and out of it),
which weighs most in a small model with a large vocabulary (SmolLM2-135M: 0.6 MB a token, its 30
layers 0.9 MB). Transformers picks fused AdamW (torch ≥ 2.8), whose step makes no temporaries.

The peak is the larger of two moments (:meth:`TrainingMemory.peak_parts`): the start of the backward
pass (weights, moments, weight copies, every saved activation, and the logits' three tensors or the
top layer's backward, whichever is larger) and the optimizer step (weights, gradients, moments). It is
what ``torch.cuda.max_memory_allocated()`` reports; the CUDA context and the caching allocator's
slack come on top (pre-flight adds :data:`jobs.preflight.CUDA_CONTEXT`). On a CPU (fp32 throughout,
no autocast) the same formula holds with :data:`CPU` precision; tests/training/test_estimates.py measures a
training step there with torch's memory profiler and compares.

TRL's trainers (the ``sft`` and ``dpo`` kinds, ``trainer=`` of :func:`training_memory`; TRL 1.16) differ
in three ways, each a term of its own:

- **no B·T·V logits**: both patch the model with TRL's fused LM head (``add_fused_lm_head``), which
  projects the hidden states through the output layer in tiles of at most :data:`TOKEN_TILE` tokens ×
  :data:`VOCAB_TILE` vocabulary entries, folding each into running log-sum-exp statistics; the entropy
  and token accuracy SFTTrainer logs come out of the same fold, per token. Its tile buffer is
  :data:`VOCAB_TILE` wide whatever the vocabulary, and without Triton (a CPU) torch folds the tiles
  with tile-sized fp32 temporaries (:func:`fused_head`). The output layer's weight is cast chunk by
  chunk, so autocast keeps no bf16 copy of it.
- **DPO's doubled batch**: ``DPOTrainer`` concatenates each pair's chosen and rejected sequences, so
  a batch of B pairs runs the policy on 2B sequences, padded to the longest of them.
- **DPO's reference**: with full training a second copy of the model (``ref_model``, loaded in the
  policy's dtype: fp32, since :func:`lab.training.trainer.prepare_model` loads full training so), run
  under ``no_grad`` after the policy's forward pass, while the policy's activations wait for backward
  (:func:`reference_pass`: a third candidate for the peak beside the logits and the top layer's
  backward); with LoRA the same model with its adapters disabled (no copy); with
  ``precompute_ref_log_probs`` every pair scored once before training (no copy, no reference pass in a
  step). ``DPOConfig.disable_dropout`` (on by default) also zeroes LoRA's dropout: no masks.

tests/training/test_estimates.py runs both kinds' jobs on a CPU under the profiler (within 0.3 %, 1.3 % on a
deeper model); on an H200 (SmolLM2-135M's shape) they read 4-11 % above the estimate, as the finetune
kind did there with padded batches (docs/jobs.md, "Memory and disk").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Sequence

from lab.models.weights import ALL_LINEAR, ModelShape, size_text

Method = Literal["full", "lora", "qlora"]
TrainerKind = Literal["transformers", "sft", "dpo"]  # transformers' Trainer (the lab's), TRL's SFT or DPO trainer
MEMORY_EVENT = "memory"  # the worker's event with a training stage's estimate (the job page shows it)
FP32 = 4
ADAMW_MOMENTS = 2 * FP32  # exp_avg and exp_avg_sq, fp32 like the trainable weights
# NF4 with double quantisation (bitsandbytes, QLoRA §2): 4 bits a weight, an 8-bit absmax per
# 64-weight block, an fp32 absmax per 256 blocks.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
LOGITS_COPIES = 3  # fp32 B·T·V tensors alive at the start of backward: log-softmax's output, grad in, grad out
MLP_GRADIENTS = 4  # B·T·i tensors a layer's backward holds at once: the gradients of the MLP's intermediates
INT64 = 8  # a label per token, kept by the cross-entropy
# TRL's fused LM head (trl/kernels/chunked_logprob.py): its tiles are TOKEN_CHUNK_SIZE tokens by the chunk size
# trl.trainer.utils passes (_CHUNKED_LOGPROB_CHUNK_SIZE), and its tile buffer is allocated that wide whatever V.
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# fp32 tile-sized tensors torch's fold holds at once without Triton (a CPU): in backward (_backward_tile) the
# transformed logits twice, log p, p, the gradient, 1[target] − p and its product with the incoming gradient;
# in the forward pass (_forward_tile) at most three (the logits, exp, and exp × logits for the entropy).
TORCH_FOLD_BACKWARD = 7
TORCH_FOLD_FORWARD = 3
# A checkpoint's small files: trainer_state.json (grows a line a logged step), scheduler, RNG, training args.
CHECKPOINT_EXTRA = 1 << 20


@dataclass(frozen=True)
class Precision:
    """How the trainer computes: activation bytes under bf16 autocast (2) or in fp32 (4), the bytes
    of a dropout mask element (CUDA keeps a bool, 1; a CPU a copy in the input's dtype), and whether
    TRL's fused LM head folds its tiles in a Triton kernel (CUDA) or in torch, with temporaries."""

    compute: int
    mask: int
    triton: bool = False

    @property
    def autocast(self) -> bool:
        return self.compute < FP32


GPU = Precision(compute=2, mask=1, triton=True)  # TrainingArguments.bf16 on a GPU with bf16
CPU = Precision(compute=4, mask=4)  # use_cpu: fp32 throughout (prepare_model loads fp32)


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes a training run holds, by what holds them (see the module docstring for each)."""

    weights: float  # the model as loaded, adapters included
    gradients: float  # fp32, of the trainable weights
    optimizer: float  # AdamW's two moments
    weight_copies: float  # bf16 casts of weights that the backward pass keeps
    activations: float  # what the decoder layers keep for backward, B·T tokens
    logits: float  # the loss's fp32 B·T·V tensors at the start of backward (TRL: its fused head's backward)
    layer_backward: float  # the top layer's gradients and working tensors while it backpropagates
    reference: float = 0.0  # DPO's frozen copy of the model (full training)
    reference_forward: float = 0.0  # what DPO's no-grad reference pass holds while the policy's activations wait

    def parts(self) -> dict[str, float]:
        """Every term by name (the job's ``memory`` event keeps them all, for the GPU bench)."""
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "weight copies": self.weight_copies, "activations": self.activations, "logits": self.logits,
                "layer backward": self.layer_backward, "reference": self.reference,
                "reference forward": self.reference_forward}

    def peak_parts(self) -> dict[str, float]:
        """The terms alive together at the peak: at the optimizer step (weights, gradients, moments)
        or in the step's forward-backward (weights, moments, weight copies, activations, and the
        largest of three moments' own tensors: the logits' at the start of backward, the top layer's
        backward, DPO's reference pass before it), whichever holds more; DPO's reference copy in both."""
        held = {"reference": self.reference} if self.reference else {}
        step = {"weights": self.weights, **held, "gradients": self.gradients, "optimizer": self.optimizer}
        last = max([("logits", self.logits), ("layer backward", self.layer_backward),
                    ("reference forward", self.reference_forward)], key=lambda part: part[1])
        backward = {"weights": self.weights, **held, "optimizer": self.optimizer, "weight copies": self.weight_copies,
                    "activations": self.activations, last[0]: last[1]}
        return max(step, backward, key=lambda moment: sum(moment.values()))

    @property
    def peak(self) -> float:
        return sum(self.peak_parts().values())


def describe(memory: TrainingMemory) -> str:
    """The terms of its peak as a line, largest first and zeros left out: "optimizer 9.2 GiB, weights 4.6 GiB, …"."""
    return describe_parts(memory.peak_parts())


def describe_parts(parts: Mapping[str, float]) -> str:
    """Bytes by what holds them as a line, largest first and zeros left out (any estimate's terms: one GPU's,
    or a sharded one's, :mod:`lab.training.sharded_memory`)."""
    return ", ".join(f"{name} {size_text(value)}" for value, name in sorted(((v, k) for k, v in parts.items() if v),
                                                                             reverse=True))


# Which input a Llama layer's linears share: q, k and v take the attention norm's output, gate and up the
# MLP norm's; o takes SDPA's output, which attention keeps anyway (None). Another name has an input of its own.
SHARED_INPUT = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "gate_proj": "mlp",
                "up_proj": "mlp", "o_proj": None}


def _in_widths(shape: ModelShape, targets: Sequence[str] = (ALL_LINEAR,)) -> int:
    """Σ of the input widths of one layer's linear weights (q, k, v, gate, up take the hidden
    state, o the attention output, down the MLP's intermediate), or of those LoRA adapts on ``targets``."""
    return sum(inp for _, _, inp in shape.adapted(targets)) // shape.layers


def _own_inputs(shape: ModelShape, targets: Sequence[str]) -> int:
    """Σ of the widths of the distinct inputs one layer's adapted linears take (a shared input counted
    once; o's not at all)."""
    inputs = {SHARED_INPUT.get(name, name): inp for name, _, inp in shape.adapted(targets)}
    return sum(inp for key, inp in inputs.items() if key is not None)


def layer_activations(shape: ModelShape, method: Method, p: Precision, lora_r: int = 16,
                      lora_dropout: float = 0.05, lora_targets: Sequence[str] = (ALL_LINEAR,)) -> float:
    """Bytes one Llama-type decoder layer keeps for backward, per token (all of it; with gradient
    checkpointing only while it is recomputed).

    h hidden, q = heads·head_dim, kv = kv_heads·head_dim, i intermediate, a heads, c the compute
    width (2 under bf16 autocast, 4 in fp32):

    - attention: SDPA keeps q, k, v and its output, c·(2q + 2kv), and a fp32 log-sum-exp per head (4a);
      o_proj's input is that output;
    - MLP: SiLU's input and output and up's output, 3·c·i;
    - full: each RMSNorm keeps its fp32 input and normalised output (its weight trains), 2·(8h + 4);
      the linear layers' inputs: under autocast q, k, v, gate and up each cast theirs to bf16
      (5·c·h), in fp32 they share two (2·4h); down's is the MLP product (c·i);
    - LoRA: an RMSNorm with a frozen weight keeps only its fp32 input, 2·(4h + 4); each adapted
      linear (every one, or those ``lora_targets`` names) keeps its dropout mask (mask·in), the adapter's
      input (c·in: autocast's bf16 cast, or the fp32 dropout output) and A's output (c·r); the frozen
      weights need no input. Without dropout (DPO turns it off) and without autocast, LoRA's adapters
      keep their linear's own input: one tensor for q, k, v, one for gate and up, o's the attention output
      (kept already) and down's the MLP product, c·(2h + i) when all are adapted; under autocast peft casts
      each adapter's input to fp32 and autocast back to bf16, a copy per adapter, c·in (as an H200 measured);
    - QLoRA adds bitsandbytes' 4-bit matmul, which keeps its bf16 input (2·in) for every linear, adapted
      or not.
    """
    h, i, a, c = shape.hidden, shape.intermediate, shape.heads, p.compute
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shared = c * (2 * q + 2 * kv) + FP32 * a + 3 * c * i
    if method == "full":
        inputs = 5 * c * h + c * i if p.autocast else 2 * FP32 * h + FP32 * i
        return 2 * (8 * h + 4) + inputs + shared
    adapted = len(shape.adapted(lora_targets)) // shape.layers
    if lora_dropout > 0:
        adapters = (p.mask + c) * _in_widths(shape, lora_targets)
    elif method == "lora" and not p.autocast:
        adapters = c * _own_inputs(shape, lora_targets)
    else:
        adapters = c * _in_widths(shape, lora_targets)
    adapters += adapted * c * lora_r
    quantised = 2 * _in_widths(shape) if method == "qlora" else 0
    return 2 * (4 * h + 4) + adapters + quantised + shared


def head_activations(shape: ModelShape, method: Method, p: Precision, fused: bool = False,
                     residual: int = FP32) -> float:
    """Bytes per token kept after the last layer: the final RMSNorm (as in :func:`layer_activations`),
    the output layer's input when its weight trains (full: a bf16 cast, or the fp32 norm output),
    and the labels the cross-entropy keeps (the logits are :func:`training_memory`'s own term).
    ``fused``: TRL's fused LM head keeps a copy of its input whatever trains (in the residual stream's
    dtype, ``residual`` bytes), its int64 targets, and a fp32 log-normaliser and entropy per token."""
    h = shape.hidden
    norm = 8 * h + 4 if method == "full" else 4 * h + 4
    if fused:
        return norm + residual * h + INT64 + 2 * FP32
    return norm + ((p.compute if p.autocast else FP32) * h if method == "full" else 0) + INT64


def fused_head(shape: ModelShape, method: Method, p: Precision, tokens: int) -> float:
    """Bytes TRL's fused LM head holds in its backward pass, which recomputes each logits tile and turns
    it into the tile's gradient in place, for ``tokens`` tokens (on a GPU only those with a label are
    projected: the prompt's and the padding's tokens make this an upper bound there); n = min(N,
    :data:`TOKEN_TILE`), w = min(V, :data:`VOCAB_TILE`):

    - the tile buffer, c·n·:data:`VOCAB_TILE` in the compute dtype (allocated that wide for any V);
    - without Triton, torch's fold of a tile: :data:`TORCH_FOLD_BACKWARD` fp32 n × w tensors (one more
      under autocast, the tile's fp32 cast) and a bool target mask, n·w;
    - under autocast, the bf16 casts of a token chunk of its input and a vocabulary chunk of the weight
      (fp32 but for LoRA's, whose base is in the compute dtype already);
    - the gradients it accumulates in fp32: its input's, 4·N·h, and with full training the output
      layer's (the tied embedding's), 4·V·h.
    """
    h, v, c = shape.hidden, shape.vocab, p.compute
    n, w = min(tokens, TOKEN_TILE), min(v, VOCAB_TILE)
    fold = 0 if p.triton else (TORCH_FOLD_BACKWARD + p.autocast) * FP32 * n * w + n * w
    return (c * n * VOCAB_TILE + fold + _head_casts(shape, method, p, n) + FP32 * tokens * h
            + (FP32 * v * h if method == "full" else 0))


def _head_casts(shape: ModelShape, method: Method, p: Precision, n: int) -> float:
    """Under autocast, the fused head's bf16 casts of n tokens of its fp32 input and a vocabulary chunk of
    its fp32 weight; LoRA's base, input and weight, is in the compute dtype already."""
    return p.compute * (n + min(shape.vocab, VOCAB_TILE)) * shape.hidden if p.autocast and method != "lora" else 0


def reference_pass(shape: ModelShape, method: Method, p: Precision, tokens: int, residual: int) -> float:
    """Bytes DPO's reference pass (``no_grad``, after the policy's forward) holds besides the policy's
    activations, for ``tokens`` tokens (2B sequences): the larger of one layer's MLP at work, 3·c·i a
    token (SiLU's output, up's output and their product), and the fused LM head's forward pass (its
    tile buffer; the final norm's output and the head's copy of it, 2·residual·h a token; without
    Triton :data:`TORCH_FOLD_FORWARD` fp32 n × w tensors; under autocast its chunks' casts). A full
    reference's fp32 weights require gradients as loaded, so autocast caches a bf16 copy of each linear
    weight of it (2 B/param) for the whole pass; LoRA's reference is the policy's own frozen base."""
    h, v, c = shape.hidden, shape.vocab, p.compute
    n, w = min(tokens, TOKEN_TILE), min(v, VOCAB_TILE)
    head = (c * n * VOCAB_TILE + 2 * residual * tokens * h + (0 if p.triton else TORCH_FOLD_FORWARD * FP32 * n * w)
            + _head_casts(shape, method, p, n))
    casts = 2 * shape.n_linear if method == "full" and p.autocast else 0
    return casts + max(head, 3 * c * shape.intermediate * tokens)


def training_memory(shape: ModelShape, method: Method, batch: int, seq_len: int, p: Precision = GPU,
                    base_dtype_bytes: int = 2, lora_r: int = 16, lora_dropout: float = 0.05,
                    checkpointing: Optional[bool] = None, trainer: TrainerKind = "transformers",
                    precompute_ref: bool = False, lora_targets: Sequence[str] = (ALL_LINEAR,)) -> TrainingMemory:
    """Peak memory of one training process (one GPU) for micro-batches of ``batch`` × ``seq_len``
    tokens (DPO: ``batch`` pairs, 2·``batch`` sequences). ``base_dtype_bytes``: LoRA's frozen weights (the
    job's dtype on a GPU; fp32 on a CPU). ``checkpointing`` (gradient checkpointing) is on for QLoRA, as
    ``prepare_model_for_kbit_training`` sets it, and off otherwise unless given. ``trainer``: whose
    training loop (the module docstring says what TRL's change); ``precompute_ref``: DPO's
    ``precompute_ref_log_probs``; ``lora_targets``: the linear layers LoRA adapts."""
    fused = trainer != "transformers"
    if trainer == "dpo":
        batch, lora_dropout = 2 * batch, 0.0  # chosen and rejected in one batch; DPOConfig.disable_dropout
    tokens = batch * seq_len
    h, v, layers = shape.hidden, shape.vocab, shape.layers
    adapter = 0 if method == "full" else shape.lora_params(lora_r, lora_targets)
    trainable = shape.n_params if method == "full" else adapter
    if method == "full":
        weights = FP32 * shape.n_params
    elif method == "lora":
        weights = base_dtype_bytes * shape.n_params + FP32 * adapter
    else:
        weights = NF4_BYTES * shape.n_linear + FP32 * (shape.n_params - shape.n_linear) + FP32 * adapter
    checkpointing = method == "qlora" if checkpointing is None else checkpointing
    layer = layer_activations(shape, method, p, lora_r, lora_dropout, lora_targets)
    # With checkpointing a layer keeps only its input, the residual stream: fp32 but for LoRA's
    # frozen base (its dtype; QLoRA's embedding is upcast to fp32).
    residual = base_dtype_bytes if method == "lora" else FP32
    kept_per_layer = residual * h if checkpointing else layer
    # LoRA's frozen embedding gives the first layer an input without a gradient: its first norm and
    # the dropouts of the adapted q, k, v keep nothing (checkpointing makes the input require one).
    mask = p.mask if lora_dropout > 0 else 0
    attention_inputs = sum(inp for name, _, inp in shape.adapted(lora_targets)
                           if SHARED_INPUT.get(name) == "attention") // layers
    first_layer_saves = 0 if method == "full" or checkpointing else 4 * h + 4 + mask * attention_inputs
    head = head_activations(shape, method, p, fused, residual)
    activations = tokens * (layers * kept_per_layer - first_layer_saves + head)
    # TRL's fused head casts the output layer's weight chunk by chunk: autocast keeps no copy of it.
    output_copy = 0 if fused else 2 * v * h
    if method == "full":  # autocast's bf16 copy of every linear weight, the output layer's included
        copies = 2 * shape.n_linear + output_copy if p.autocast else 0
    elif method == "lora":  # the adapters' bf16 casts (recomputed, not kept, with checkpointing)
        copies = 2 * adapter if p.autocast and not checkpointing else 0
    else:  # the fp32 output layer's bf16 cast, kept for the input gradient
        copies = output_copy
    # While the top layer backpropagates: its fp32 weight gradients, the output layer's (tied: the
    # embedding's, full training only), its MLP's gradient tensors, and with checkpointing the layer
    # recomputed. It replaces the logits' tensors (freed by then) at the peak when it is larger.
    layer_grads = FP32 * (shape.n_linear if method == "full" else adapter) / layers
    output_grad = FP32 * v * h if method == "full" else 0
    layer_backward = (layer_grads + output_grad + tokens * MLP_GRADIENTS * p.compute * shape.intermediate
                      + (tokens * layer if checkpointing else 0))
    logits = fused_head(shape, method, p, tokens) if fused else LOGITS_COPIES * FP32 * tokens * v
    # DPO's reference: a second fp32 model with full training, and its pass; neither when precomputed.
    with_reference = trainer == "dpo" and not precompute_ref
    return TrainingMemory(weights=weights, gradients=FP32 * trainable, optimizer=ADAMW_MOMENTS * trainable,
                          weight_copies=copies, activations=activations, logits=logits, layer_backward=layer_backward,
                          reference=FP32 * shape.n_params if with_reference and method == "full" else 0.0,
                          reference_forward=reference_pass(shape, method, p, tokens, residual) if with_reference
                          else 0.0)


def memory_advice(settings: Mapping[str, Any], shape: Optional[ModelShape] = None, seq_len: Optional[int] = None,
                  p: Precision = GPU, base_dtype_bytes: int = 2, trainer: TrainerKind = "transformers",
                  precompute_ref: bool = False) -> str:
    """What to lower when a training run ran out of memory: each change alone, from ``settings`` (the
    job's ``TrainConfig`` values: batch_size, grad_accum, max_length, method, lora_r, lora_dropout,
    lora_targets), with the estimated peak before and after when the model's ``shape`` is known (at
    ``seq_len`` tokens, the longest example, else ``max_length``; ``p``, ``base_dtype_bytes``, ``trainer``
    and ``precompute_ref`` as :func:`training_memory` takes them), the largest saving first; without a
    shape in the order they usually save. Lowering:

    - batch_size to its largest divisor ≤ half, grad_accum up by as much: the same examples a step;
    - max_length by half, when the examples are longer than that (longer ones are dropped or cut);
    - method full → lora → qlora (LoRA trains ~1 % of the weights; QLoRA stores the rest in 4 bits);
    - DPO with full training: precompute_ref_log_probs, so that no reference copy is held;
    - a smaller model, last: it changes what is trained. (The lab has no gradient-checkpointing switch:
      QLoRA turns it on.)
    """
    batch, accum, length, method = (settings["batch_size"], settings["grad_accum"], settings["max_length"],
                                    settings["method"])
    tokens = min(seq_len or length, length)
    unit = "pairs" if trainer == "dpo" else "examples"
    changes: list[tuple[str, dict[str, Any]]] = []
    if batch > 1:
        smaller = max(d for d in range(1, batch // 2 + 1) if batch % d == 0)
        accum_to = accum * batch // smaller
        changes.append((f"batch_size {batch} → {smaller} and grad_accum {accum} → {accum_to} (the same "
                        f"{batch * accum} {unit} a step)", {"batch": smaller}))
    if tokens > length // 2 >= 1:
        changes.append((f"max_length {length} → {length // 2}", {"seq_len": length // 2}))
    lighter = {"full": "lora", "lora": "qlora"}.get(method)
    if lighter:
        changes.append((f"method {method} → {lighter}", {"method": lighter}))
    if trainer == "dpo" and method == "full" and not precompute_ref:
        changes.append(("precompute_ref_log_probs false → true", {"precompute_ref": True}))
    last = "a smaller model"
    if shape is None:
        return "To fit, lower: " + "; ".join([text for text, _ in changes] + [last])
    current = {"method": method, "batch": batch, "seq_len": tokens, "precompute_ref": precompute_ref}

    def peak(change: dict[str, Any]) -> float:
        at = {**current, **change}
        return training_memory(shape, at["method"], at["batch"], at["seq_len"], p, base_dtype_bytes,
                               settings["lora_r"], settings["lora_dropout"], trainer=trainer,
                               precompute_ref=at["precompute_ref"], lora_targets=settings["lora_targets"]).peak

    now = peak({})
    saved = sorted((peak(change), text) for text, change in changes)
    items = [f"{text}: {size_text(now)} → {size_text(after)}" for after, text in saved if after < now]
    return "To fit, lower (largest saving first, estimated peak before → after): " + "; ".join(items + [last])


def checkpoint_bytes(saved_weights: float, trainable: int, save_optimizer: bool) -> float:
    """Disk one checkpoint takes: the weights ``save_model`` writes (full: the fp32 model; LoRA:
    the fp32 adapter), AdamW's two fp32 moments per trainable weight when the optimizer is saved
    (what an exact resume needs: 12 B/param for a full fine-tune), and the small files."""
    return saved_weights + (ADAMW_MOMENTS * trainable if save_optimizer else 0) + CHECKPOINT_EXTRA


def run_checkpoint_bytes(shape: ModelShape, method: Method, lora_r: int, save_optimizer: bool,
                         lora_targets: Sequence[str] = (ALL_LINEAR,)) -> tuple[float, float]:
    """(one checkpoint, the final weights) of a training run of ``shape``: the trainer saves fp32
    weights for full training (it loads them so) and fp32 adapters for LoRA/QLoRA."""
    trainable = shape.n_params if method == "full" else shape.lora_params(lora_r, lora_targets)
    final = FP32 * trainable
    return checkpoint_bytes(final, trainable, save_optimizer), final


def disk_peak(runs: list[tuple[float, float]], kept: int) -> float:
    """The most disk a job's training runs take at once, from each run's (one checkpoint, final
    weights). Transformers deletes the oldest checkpoint only after the new one is whole, so ``kept``
    + 1 exist during a save; a finished run leaves ``kept`` beside its weights. Run by run, the worst
    is the last one's save on top of all the others: Σ (kept·C + W) + max (C − W)."""
    if not runs:
        return 0.0
    return sum(kept * c + w for c, w in runs) + max(c - w for c, w in runs)
