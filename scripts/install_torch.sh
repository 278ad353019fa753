#!/usr/bin/env bash
# Install PyTorch into the given interpreter's environment without dragging in CUDA wheels
# on a machine that has no NVIDIA GPU (an unpinned `pip install torch` pulls several GB).
set -euo pipefail
py="$1"
version="${TORCH_VERSION:-2.13.0}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # A GPU: the CUDA build, and bitsandbytes for QLoRA's 4-bit weights (CUDA only, so only here).
  "$py" -c "import torch, bitsandbytes" 2>/dev/null || "$py" -m pip install -qq "torch==$version" bitsandbytes
  exit 0
fi
if "$py" -c "import torch" 2>/dev/null; then
  exit 0
fi
if ! "$py" -m pip install -qq "torch==$version+cpu" 2>/dev/null; then
  # No local CPU wheel: PyTorch's own CPU-only index.
  "$py" -m pip install -qq "torch==$version+cpu" --index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
fi
