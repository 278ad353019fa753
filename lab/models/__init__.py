"""Models: loading (hub id, folder, ``bundled``, ``scratch``), the bundled GGUF's conversion, tokenizers,
parameter counts without torch (weights), the loaded-model cache, scoring prompts, multi-process ranks."""
