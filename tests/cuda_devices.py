"""How many CUDA devices this build sees: what the GPU tests are skipped on."""

from __future__ import annotations

import pyllama_so


def cuda_device_count() -> int:
    return sum(1 for d in pyllama_so.devices() if d["backend"] == "CUDA")
