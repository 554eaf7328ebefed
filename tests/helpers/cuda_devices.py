"""How many CUDA devices this build sees: what the GPU tests are skipped on."""

from __future__ import annotations

from pyllama_so.bench.allreduce import cuda_devices, two_cuda_gpus

__all__ = ["cuda_device_count", "two_cuda_gpus"]


def cuda_device_count() -> int:
    return len(cuda_devices())
