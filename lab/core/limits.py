"""Upper bounds on what a config may ask for, and declarations several config fields share.

Each bound sits far above any run a user means and far below what exhausts a machine: a
config with ``bins: 1000000000`` (7 GiB of arrays) or ``bootstrap: 1e12`` is refused at
submit, with the limit named, instead of failing an hour later or running for ever.
"""
from __future__ import annotations

from typing import Literal

MAX_ROWS = 10_000_000  # questions or training examples
MAX_BINS = 1000
MAX_BOOTSTRAP = 100_000
MAX_BATCH = 4096
MAX_EPOCHS = 1000
MAX_TOKENS = 1 << 20  # a sequence length
MAX_TOP_K = 1000
MAX_LORA_RANK = 4096
MAX_LORA_TARGETS = 32  # module names a LoRA lists (a Llama layer has 7 linear ones)
# A module name a LoRA may target (q_proj, query_key_value): one name, not a path or a regex, which peft
# would match against every module's full name.
MODULE_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,63}|all-linear"
# A temperature: past these the scaled rows are as good as one-hot or uniform (the sweeps widen no
# further), and 1/T stays finite (T = 1e-320 would make every probability NaN).
TEMPERATURE_RANGE = (1e-3, 1e3)

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
SEED = {"ge": 0, "le": 2**32 - 1}
SPLIT = {"role": "name", "pattern": r"[A-Za-z][\w-]*(:[A-Za-z][\w-]*)?", "max_len": 64}
SUBJECT = {"role": "name", "pattern": r"[\w .-]+", "max_len": 128}
DEVICE = {"role": "name", "pattern": r"auto|cpu|mps|cuda(:\d{1,3})?"}
