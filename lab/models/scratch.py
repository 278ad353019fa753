"""A small transformer created from a config, for tasks a CPU can learn from scratch in minutes.

No competent small model can be installed offline, so the controlled task
(:mod:`lab.data.synthetic`) is learned by a model that starts from random weights: a Llama
architecture a few layers deep. Its tokenizer is a byte-level BPE trained on the task's own prompts
(every template of the lab rendered on its questions), with the bundled model's special tokens and
chat template, so every template, scorer and trainer applies unchanged; with ~1,000 tokens instead
of the bundled 49,152, the output layer no longer dominates a step (it did, 50 to 1). Both are saved
with ``save_pretrained``: an ordinary model directory that ``model: PATH`` loads like any other,
fine-tunes, distils into and evaluates. The model name ``scratch`` is the default one, created on
first use (:func:`default_model`) from the bundled controlled task's training prompts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from lab.data.record import MCQRecord

LIKE = "bundled"  # the model whose special tokens and chat template the tokenizer copies (lab.models.bundled)


@dataclass(frozen=True)
class ScratchConfig:
    """The architecture and vocabulary; the defaults (≈ 0.5 M parameters) learn the controlled
    task's rule in a few hundred steps on two CPU cores."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 384
    max_positions: int = 512
    vocab_size: int = 1024
    seed: int = 0


def task_corpus(records: Iterable[MCQRecord], tokenizer) -> Iterator[str]:
    """Every template's rendering of every record, prompt and each option's completion: the texts
    the model will see, so their words and the option letters become single tokens."""
    from lab.data.templates import TEMPLATES, get_template

    for record in records:
        for name in TEMPLATES.names():
            prompt = get_template(name).render(record, tokenizer)
            yield prompt.text + " ".join(prompt.target(i) for i in range(len(prompt.options)))


def train_tokenizer(corpus: Iterable[str], vocab_size: int, base):
    """A byte-level BPE trained on ``corpus``, with the ``base`` tokenizer's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(base.all_special_tokens))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=base.bos_token, eos_token=base.eos_token,
                                   pad_token=base.pad_token, unk_token=base.unk_token,
                                   chat_template=base.chat_template)


def create(out: Path, records: Iterable[MCQRecord], cfg: ScratchConfig = ScratchConfig()) -> Path:
    """Write a randomly initialised model (seeded) and its tokenizer, trained on ``records``' prompts, into ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lab.models.bundled import bundled_model_dir
    from lab.models.tokenizers import load_tokenizer

    base = load_tokenizer(str(bundled_model_dir()), LIKE)  # renders the prompts, then lends its special tokens
    tok = train_tokenizer(task_corpus(records, base), cfg.vocab_size, base)
    torch.manual_seed(cfg.seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                         num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                         intermediate_size=cfg.intermediate, max_position_embeddings=cfg.max_positions,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    out = Path(out)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def sized(name: str) -> ScratchConfig:
    """The architecture of a named scratch model (:data:`lab.models.weights.SCRATCH_SIZES`)."""
    from lab.models.weights import SCRATCH_SIZES

    hidden, layers, heads, intermediate = SCRATCH_SIZES[name]
    return ScratchConfig(hidden=hidden, layers=layers, heads=heads, intermediate=intermediate)


def default_model(name: str = "scratch") -> Path:
    """The scratch model called ``name`` (``scratch``, ``scratch-l`` …), created once (seeded: every
    machine makes the same one) in the cache. It is written beside its place and renamed into it, so
    a concurrent first use never sees half a model."""
    from lab.core.files import make_folder_once
    from lab.data import load
    from lab.models.weights import SCRATCH, scratch_target

    def make(folder: Path) -> None:
        create(folder, load("synthetic", "train", ["bundled"]).records, sized(name))

    return make_folder_once(scratch_target() if name == SCRATCH else scratch_target(name), make)


def main(argv: list[str] | None = None) -> None:
    """``python -m lab.models.scratch --out DIR [--dataset synthetic] [--hidden 128] [--layers 2] …``."""
    import argparse

    from lab.data import load

    parser = argparse.ArgumentParser(description="Create a small random-weight model for a task (lab.models.scratch).")
    parser.add_argument("--out", type=Path, required=True, help="the model directory to write")
    parser.add_argument("--dataset", default="synthetic", help="whose training prompts the tokenizer learns")
    parser.add_argument("--data-files", nargs="+", default=["bundled"])
    for name, value in vars(ScratchConfig()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args(argv)
    records = load(args.dataset, "train", args.data_files).records
    cfg = ScratchConfig(**{name: getattr(args, name) for name in vars(ScratchConfig())})
    print(create(args.out, records, cfg))


if __name__ == "__main__":
    main()
