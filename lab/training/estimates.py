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
no autocast) the same formula holds with :data:`CPU` precision; tests/test_estimates.py measures a
training step there with torch's memory profiler and compares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from lab.models.weights import ModelShape, size_text

Method = Literal["full", "lora", "qlora"]
MEMORY_EVENT = "memory"  # the worker's event with a training stage's estimate (the job page shows it)
FP32 = 4
ADAMW_MOMENTS = 2 * FP32  # exp_avg and exp_avg_sq, fp32 like the trainable weights
# NF4 with double quantisation (bitsandbytes, QLoRA §2): 4 bits a weight, an 8-bit absmax per
# 64-weight block, an fp32 absmax per 256 blocks.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
LOGITS_COPIES = 3  # fp32 B·T·V tensors alive at the start of backward: log-softmax's output, grad in, grad out
MLP_GRADIENTS = 4  # B·T·i tensors a layer's backward holds at once: the gradients of the MLP's intermediates
INT64 = 8  # a label per token, kept by the cross-entropy
# A checkpoint's small files: trainer_state.json (grows a line a logged step), scheduler, RNG, training args.
CHECKPOINT_EXTRA = 1 << 20


@dataclass(frozen=True)
class Precision:
    """How the trainer computes: activation bytes under bf16 autocast (2) or in fp32 (4), and the
    bytes of a dropout mask element: CUDA keeps a bool (1), a CPU a copy in the input's dtype."""

    compute: int
    mask: int

    @property
    def autocast(self) -> bool:
        return self.compute < FP32


GPU = Precision(compute=2, mask=1)  # TrainingArguments.bf16 on a GPU with bf16
CPU = Precision(compute=4, mask=4)  # use_cpu: fp32 throughout (prepare_model loads fp32)


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes a training run holds, by what holds them (see the module docstring for each)."""

    weights: float  # the model as loaded, adapters included
    gradients: float  # fp32, of the trainable weights
    optimizer: float  # AdamW's two moments
    weight_copies: float  # bf16 casts of weights that the backward pass keeps
    activations: float  # what the decoder layers keep for backward, B·T tokens
    logits: float  # the loss's fp32 B·T·V tensors at the start of backward
    layer_backward: float  # the top layer's gradients and working tensors while it backpropagates

    def parts(self) -> dict[str, float]:
        """Every term by name (the job's ``memory`` event keeps them all, for the GPU bench)."""
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "weight copies": self.weight_copies, "activations": self.activations, "logits": self.logits,
                "layer backward": self.layer_backward}

    def peak_parts(self) -> dict[str, float]:
        """The terms alive together at the peak: at the optimizer step (weights, gradients, moments)
        or at the start of backward (weights, moments, weight copies, activations, and the logits'
        tensors or the top layer's backward, whichever is larger), whichever holds more."""
        step = {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer}
        last = {"logits": self.logits} if self.logits >= self.layer_backward else {"layer backward": self.layer_backward}
        backward = {"weights": self.weights, "optimizer": self.optimizer, "weight copies": self.weight_copies,
                    "activations": self.activations, **last}
        return max(step, backward, key=lambda moment: sum(moment.values()))

    @property
    def peak(self) -> float:
        return sum(self.peak_parts().values())


def describe(memory: TrainingMemory) -> str:
    """The terms of its peak as a line, largest first and zeros left out: "optimizer 9.2 GiB, weights 4.6 GiB, …"."""
    parts = sorted(((v, k) for k, v in memory.peak_parts().items() if v), reverse=True)
    return ", ".join(f"{name} {size_text(value)}" for value, name in parts)


def _in_widths(shape: ModelShape) -> int:
    """Σ of the input widths of one layer's linear weights (q, k, v, gate, up take the hidden
    state, o the attention output, down the MLP's intermediate)."""
    return sum(inp for _, inp in shape.linears) // shape.layers


def layer_activations(shape: ModelShape, method: Method, p: Precision, lora_r: int = 16,
                      lora_dropout: float = 0.05) -> float:
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
      linear keeps its dropout mask (mask·in), the adapter's input (c·in: autocast's bf16 cast, or
      the fp32 dropout output) and A's output (c·r); the frozen weights need no input;
    - QLoRA adds bitsandbytes' 4-bit matmul, which keeps its bf16 input (2·in) for every linear.
    """
    h, i, a, c = shape.hidden, shape.intermediate, shape.heads, p.compute
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shared = c * (2 * q + 2 * kv) + FP32 * a + 3 * c * i
    if method == "full":
        inputs = 5 * c * h + c * i if p.autocast else 2 * FP32 * h + FP32 * i
        return 2 * (8 * h + 4) + inputs + shared
    per_linear = len(shape.linears) // shape.layers
    mask = p.mask if lora_dropout > 0 else 0
    adapters = (mask + c) * _in_widths(shape) + per_linear * c * lora_r
    quantised = 2 * _in_widths(shape) if method == "qlora" else 0
    return 2 * (4 * h + 4) + adapters + quantised + shared


def head_activations(shape: ModelShape, method: Method, p: Precision) -> float:
    """Bytes per token kept after the last layer: the final RMSNorm (as in :func:`layer_activations`),
    the output layer's input when its weight trains (full: a bf16 cast, or the fp32 norm output),
    and the labels the cross-entropy keeps (the logits are :func:`training_memory`'s own term)."""
    h = shape.hidden
    if method == "full":
        return 8 * h + 4 + (p.compute if p.autocast else FP32) * h + INT64
    return 4 * h + 4 + INT64


def training_memory(shape: ModelShape, method: Method, batch: int, seq_len: int, p: Precision = GPU,
                    base_dtype_bytes: int = 2, lora_r: int = 16, lora_dropout: float = 0.05,
                    checkpointing: Optional[bool] = None) -> TrainingMemory:
    """Peak memory of one training process (one GPU) for micro-batches of ``batch`` × ``seq_len``
    tokens. ``base_dtype_bytes``: LoRA's frozen weights (the job's dtype on a GPU; fp32 on a CPU).
    ``checkpointing`` (gradient checkpointing) is on for QLoRA, as ``prepare_model_for_kbit_training``
    sets it, and off otherwise unless given."""
    tokens = batch * seq_len
    h, v, layers = shape.hidden, shape.vocab, shape.layers
    adapter = 0 if method == "full" else shape.lora_params(lora_r)
    trainable = shape.n_params if method == "full" else adapter
    if method == "full":
        weights = FP32 * shape.n_params
    elif method == "lora":
        weights = base_dtype_bytes * shape.n_params + FP32 * adapter
    else:
        weights = NF4_BYTES * shape.n_linear + FP32 * (shape.n_params - shape.n_linear) + FP32 * adapter
    checkpointing = method == "qlora" if checkpointing is None else checkpointing
    layer = layer_activations(shape, method, p, lora_r, lora_dropout)
    # With checkpointing a layer keeps only its input, the residual stream: fp32 but for LoRA's
    # frozen base (its dtype; QLoRA's embedding is upcast to fp32).
    residual = base_dtype_bytes if method == "lora" else FP32
    kept_per_layer = residual * h if checkpointing else layer
    # LoRA's frozen embedding gives the first layer an input without a gradient: its first norm and
    # the q, k, v dropouts keep nothing (checkpointing makes the input require one).
    mask = p.mask if lora_dropout > 0 else 0
    first_layer_saves = 0 if method == "full" or checkpointing else 4 * h + 4 + 3 * mask * h
    activations = tokens * (layers * kept_per_layer - first_layer_saves + head_activations(shape, method, p))
    if method == "full":  # autocast's bf16 copy of every linear weight, the output layer's included
        copies = 2 * (shape.n_linear + v * h) if p.autocast else 0
    elif method == "lora":  # the adapters' bf16 casts (recomputed, not kept, with checkpointing)
        copies = 2 * adapter if p.autocast and not checkpointing else 0
    else:  # the fp32 output layer's bf16 cast, kept for the input gradient
        copies = 2 * v * h
    # While the top layer backpropagates: its fp32 weight gradients, the output layer's (tied: the
    # embedding's, full training only), its MLP's gradient tensors, and with checkpointing the layer
    # recomputed. It replaces the logits' tensors (freed by then) at the peak when it is larger.
    layer_grads = FP32 * (shape.n_linear if method == "full" else adapter) / layers
    output_grad = FP32 * v * h if method == "full" else 0
    layer_backward = (layer_grads + output_grad + tokens * MLP_GRADIENTS * p.compute * shape.intermediate
                      + (tokens * layer if checkpointing else 0))
    return TrainingMemory(weights=weights, gradients=FP32 * trainable, optimizer=ADAMW_MOMENTS * trainable,
                          weight_copies=copies, activations=activations,
                          logits=LOGITS_COPIES * FP32 * tokens * v, layer_backward=layer_backward)


def checkpoint_bytes(saved_weights: float, trainable: int, save_optimizer: bool) -> float:
    """Disk one checkpoint takes: the weights ``save_model`` writes (full: the fp32 model; LoRA:
    the fp32 adapter), AdamW's two fp32 moments per trainable weight when the optimizer is saved
    (what an exact resume needs: 12 B/param for a full fine-tune), and the small files."""
    return saved_weights + (ADAMW_MOMENTS * trainable if save_optimizer else 0) + CHECKPOINT_EXTRA


def run_checkpoint_bytes(shape: ModelShape, method: Method, lora_r: int, save_optimizer: bool) -> tuple[float, float]:
    """(one checkpoint, the final weights) of a training run of ``shape``: the trainer saves fp32
    weights for full training (it loads them so) and fp32 adapters for LoRA/QLoRA."""
    trainable = shape.n_params if method == "full" else shape.lora_params(lora_r)
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
