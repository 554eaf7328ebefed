"""A step-by-step smoke run that says which step it is in (run with -X faulthandler to locate a crash).

    python -X faulthandler scripts/smoke [--sm none,layer,tensor] [--ngl -1]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def step(msg: str) -> None:
    print(f"[smoke {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sm", default="none", help="comma list of split modes to try")
    ap.add_argument("--ngl", type=int, default=-1)
    args = ap.parse_args()

    step("import")  # imports inside main: a crash while loading the extension is then a located step
    import pyllama_so
    from pyllama_so import Llama, synth
    from pyllama_so.archs import nmse

    step(f"devices: {[d['name'] for d in pyllama_so.devices()]}")
    path = synth.write_model(Path(tempfile.mkdtemp()) / "tiny.gguf", "tiny", "f16", quiet=True)
    step(f"model written: {path}")
    ref = None
    for ngl, sm in [(0, "none")] + [(args.ngl, s) for s in args.sm.split(",")]:
        step(f"load ngl={ngl} sm={sm}")
        with Llama(path, n_gpu_layers=ngl, split_mode=sm, n_ctx=128) as llm:
            step("tokenize")
            toks = llm.tokenize("hello world")
            step(f"eval {len(toks)} tokens")
            logits = llm.eval(toks)
            step("generate")
            gen = list(llm.generate(toks, max_tokens=4, temperature=0.0, stop_on_eog=False))
            step(f"close (generated {gen})")
        if ref is None:
            ref = logits
        else:
            step(f"nmse vs ngl=0: {nmse(ref, logits):.2e}")
    step("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
