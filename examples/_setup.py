"""What every example runs on: a model (--model, else a cached synthetic one) and two devices. Imported by
the examples; not an example to run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyllama_so
from pyllama_so import synth


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", type=Path, help="GGUF model file (default: the cached synthetic model)")
    ap.add_argument("--synthetic", default="small", choices=list(synth.SHAPES),
                    help="shape of the synthetic model used without --model (default small)")


def model_path(args: argparse.Namespace) -> Path:
    """--model, or the cached F16 synthetic model of --synthetic's shape (written on first use)."""
    return args.model or synth.cached_model(args.synthetic, "f16")


def tensor_split_devices() -> list[float] | None:
    """The tensor_split to use: None (every GPU) with two GPUs or more; otherwise two CPU virtual devices
    are made and get all the work (llama.cpp lists GPUs first, so a single GPU gets 0)."""
    gpus = sum(d["type"] in ("gpu", "igpu") for d in pyllama_so.devices())
    if gpus >= 2:
        return None
    pyllama_so.cpu_virtual_devices(2)
    print(f"{gpus} GPU(s) found: running on two CPU virtual devices instead")
    return [0.0] * gpus + [1.0, 1.0]
