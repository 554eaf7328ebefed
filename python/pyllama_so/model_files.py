"""Checks of the files a Llama loads, before llama.cpp reads them: the model GGUF and a LoRA adapter."""

from __future__ import annotations

import math
import os
from pathlib import Path

from pyllama_so._llama import ModelLoadError
from pyllama_so.config import ModelParams

_GGUF_MAGIC = b"GGUF"


def check_lora(lora_path: str | os.PathLike[str] | None, lora_scale: float, model_params: ModelParams) -> None:
    if isinstance(lora_scale, bool) or not isinstance(lora_scale, (int, float)) or not math.isfinite(lora_scale):
        raise ValueError(f"lora_scale must be a finite number, got {lora_scale!r}")
    if model_params.vocab_only and lora_path is not None:
        raise ValueError("lora_path needs the model's weights, which vocab_only=True does not load")
    if lora_path is not None and model_params.split_mode == "tensor":  # ggml's Meta backend cannot split it
        raise ValueError('lora_path is not supported with split_mode="tensor": llama.cpp\'s tensor split cannot '
                         "split a LoRA adapter's tensors (it aborts); use split_mode=\"layer\"")
    if lora_path is not None and not Path(os.fspath(lora_path)).is_file():
        raise FileNotFoundError(f"LoRA adapter not found: {os.fspath(lora_path)}")


def check_gguf_file(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"model path is a directory: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (magic {magic!r}): {path}")
