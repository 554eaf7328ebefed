"""The two devices the examples split over (imported by them; not an example to run)."""

from __future__ import annotations

import pyllama_so


def tensor_split_devices() -> list[float] | None:
    """The tensor_split to use: None (every GPU) with two GPUs or more; otherwise two CPU virtual devices
    are made and get all the work (llama.cpp lists GPUs first, so a single GPU gets 0)."""
    gpus = sum(d["type"] in ("gpu", "igpu") for d in pyllama_so.devices())
    if gpus >= 2:
        return None
    pyllama_so.cpu_virtual_devices(2)
    print(f"{gpus} GPU(s) found: running on two CPU virtual devices instead")
    return [0.0] * gpus + [1.0, 1.0]
