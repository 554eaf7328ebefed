"""Test harness: random-weight models and the per-architecture fixtures of upstream's test-llama-archs.

Shipped so that the suites (tests/, `python -m pyllama_so.archs`) run against an installed package;
not part of the inference API. The native fixtures live in libpyllama-so-testing, beside this module,
never in libllama or libggml. Importing this package also installs the test-only switches
(`test_switches()`, docs/multi-gpu.md) into the product: from then on, in this process, those variables
break product code on purpose; without this package they do nothing.
"""

from pyllama_so.testing._fixtures import (
    arch_causal_toggle_ok,
    arch_flags,
    arch_logits,
    arch_model,
    arch_model_load,
    arch_model_save,
    arch_names,
    compute_bytes,
    context_bytes,
    delay_lane,
    kv_cell_bytes,
    lane_race,
    random_model,
    test_switches,
    weight_split,
)

__all__ = [
    "arch_causal_toggle_ok",
    "arch_flags",
    "arch_logits",
    "arch_model",
    "arch_model_load",
    "arch_model_save",
    "arch_names",
    "compute_bytes",
    "context_bytes",
    "delay_lane",
    "kv_cell_bytes",
    "lane_race",
    "random_model",
    "test_switches",
    "weight_split",
]
