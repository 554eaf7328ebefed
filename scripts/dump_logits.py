"""Evaluate a fixed prompt and save its logits (.npy), for comparing builds and split modes.

    scripts/dump-logits -m model.gguf -ngl 0 -o cpu.npy
    scripts/dump-logits -m model.gguf -sm tensor -o tensor.npy --compare cpu.npy
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from pyllama_so import Llama
from pyllama_so.archs import nmse

PROMPT = "Tensor parallelism splits every weight matrix across the GPUs."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-ngl", type=int, default=-1)
    ap.add_argument("-sm", default="none")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--compare", help="reference .npy; prints the NMSE as JSON")
    args = ap.parse_args()
    with Llama(args.model, n_gpu_layers=args.ngl, split_mode=args.sm, n_ctx=512, flash_attn="auto") as llm:
        logits = llm.eval(llm.tokenize(PROMPT))
    assert np.isfinite(logits).all(), "non-finite logits"
    np.save(args.output, logits)
    if args.compare:
        ref = np.load(args.compare)
        print(json.dumps({"output": args.output, "reference": args.compare, "nmse": nmse(ref, logits),
                          "argmax_agree": float(np.mean(logits.argmax(1) == ref.argmax(1)))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
