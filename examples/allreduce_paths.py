"""Which AllReduce path each reduction of a tensor-split prompt took, with the copy engines forced and not.

Under `split_mode="tensor"` the GPUs add their partial results twice per layer. The CUDA backend routes
each reduction to a path: `ce` (copy engines through pinned host memory), `nccl`, `internal` (upstream's
2-GPU pipeline), `ll` (small reductions with the copy engines on: data and flags in one store) or `fallback`
(see docs/multi-gpu.md). This example reads a context's own counters (`llm.allreduce_routing()`) before and
after a prompt, and again around single-token decodes (as in generation), once with automatic routing and
once with the copy engines forced (`Llama(..., allreduce=AllReduceParams(copy_engines=True))`: a setting of
that context alone).

    python examples/allreduce_paths.py
    python examples/allreduce_paths.py --model model.gguf --prompt-tokens 2048 --n-ubatch 512

Without two GPUs it runs on two CPU virtual devices; their reductions are not counted (the counters
belong to the CUDA backend), so every count is 0 there.
"""

from __future__ import annotations

import argparse
import math

from _setup import add_model_args, model_path, tensor_split_devices  # examples/_setup.py
from pyllama_so import Llama, allreduce
from pyllama_so.allreduce import AllReduceParams

SETTINGS: dict[str, bool | None] = {"auto": None, "forced": True}  # AllReduceParams(copy_engines=...)


def calls_since(llm: Llama, before: allreduce.AllReduceRouting) -> dict[str, int]:
    """The context's reductions per path since `before` was read."""
    now = llm.allreduce_routing()
    return {path: now.paths[path].calls - before.paths[path].calls for path in allreduce.PATHS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length in tokens (default 1024)")
    ap.add_argument("--decode-tokens", type=int, default=8, help="single tokens decoded after the prompt (default 8)")
    ap.add_argument("--n-ubatch", type=int, default=512, help="tokens per ubatch (default 512)")
    args = ap.parse_args()

    model = model_path(args)
    split = tensor_split_devices()
    if not allreduce.allreduce_available():
        print("this build has no CUDA backend: the counters stay at 0")

    n_ctx = 256 * math.ceil((args.prompt_tokens + args.decode_tokens) / 256)  # llama.cpp's contexts are 256s
    rows: list[tuple[str, str, dict[str, int]]] = []
    for setting, copy_engines in SETTINGS.items():
        with Llama(model, split_mode="tensor", tensor_split=split, flash_attn=True, n_ctx=n_ctx,
                   n_ubatch=args.n_ubatch, allreduce=AllReduceParams(copy_engines=copy_engines)) as llm:
            prompt = [i % llm.n_vocab() for i in range(args.prompt_tokens)]  # the tokens do not matter here
            before = llm.allreduce_routing()
            llm.eval(prompt)
            rows.append((setting, f"prompt ({args.prompt_tokens} tokens)", calls_since(llm, before)))
            before = llm.allreduce_routing()
            for token in range(args.decode_tokens):
                llm.eval([token])  # one token per decode, as in generation
            rows.append((setting, f"decode ({args.decode_tokens} x 1 token)", calls_since(llm, before)))

    print(f"{'copy engines':<13}{'phase':<26}" + "".join(f"{path:>10}" for path in allreduce.PATHS))
    for setting, phase, calls in rows:
        print(f"{setting:<13}{phase:<26}" + "".join(f"{calls[path]:>10}" for path in allreduce.PATHS))


if __name__ == "__main__":
    main()
