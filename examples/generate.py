"""Generate text on two GPUs with tensor split and split overlap, streaming tokens as they come.

Shows `Llama(model, split_mode="tensor", split_overlap=True)` as a context manager,
`create_completion(stream=True)` and `split_overlap_stats()`: split overlap alternates the prompt's
ubatches (of at least 64 tokens) between two lanes, so the prompt must span two ubatches or more for
lane 1 to run. Generated tokens go one at a time, on lane 0.

    python examples/generate.py                                  # the cached synthetic model
    python examples/generate.py --model model.gguf --prompt "Once upon a time" --max-tokens 64

Without two GPUs it runs on two CPU virtual devices. A synthetic model has random weights, so its
text is gibberish; give --model a real GGUF file for words.
"""

from __future__ import annotations

import argparse

from _setup import add_model_args, model_path, tensor_split_devices  # examples/_setup.py
from pyllama_so import Llama

DEFAULT_PROMPT = " ".join([
    "Tensor parallelism splits every weight matrix of a transformer across the GPUs, so that each GPU",
    "computes a part of every layer and the parts are added together twice per layer. On GPUs without",
    "peer access those additions travel through host memory, and while they travel the GPUs would idle",
    "unless the next piece of the prompt is already being computed. Split overlap does exactly that: it",
    "hands consecutive pieces of the prompt to two lanes, so that one computes while the other reduces.",
    "Each lane has its own scheduler, streams and buffers, while both share the weights and the KV cache,",
    "and a lane waits only where the other lane last wrote the state it reads. The output is bitwise the",
    "same as without it; only the time changes. Here is a short story about two GPUs sharing one prompt:",
])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="default: a paragraph of several ubatches")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    ap.add_argument("--n-ubatch", type=int, default=64,
                    help="tokens per ubatch, i.e. per lane's turn; 64 is the smallest that takes a lane (default 64)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    args = ap.parse_args()

    model = model_path(args)
    split = tensor_split_devices()
    with Llama(model, split_mode="tensor", split_overlap=True, tensor_split=split, flash_attn=True,
               n_ubatch=args.n_ubatch) as llm:
        usage: dict[str, int] = {}
        for chunk in llm.create_completion(args.prompt, max_tokens=args.max_tokens, seed=args.seed, stream=True):
            print(chunk["choices"][0]["text"], end="", flush=True)
            usage = chunk.get("usage", usage)
        print()
        stats = llm.split_overlap_stats()

    print(f"\n{usage['prompt_tokens']} prompt tokens, {usage['completion_tokens']} generated")
    print(f"split overlap: {stats['reason']}")
    for lane in (0, 1):
        print(f"  lane {lane}: {stats['ubatches'][lane]} ubatches, {stats['graph_builds'][lane]} graph builds, "
              f"{stats['waits'][lane]} waits on the other lane")


if __name__ == "__main__":
    main()
