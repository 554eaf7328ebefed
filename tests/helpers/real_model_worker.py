"""One device configuration of a real model, in a process of its own (tests/helpers/real_models.py starts it).

    python tests/helpers/real_model_worker.py JOB_JSON OUT.npz

Writes the logits and, as JSON in `info`, the split-overlap statistics and the results of the optional checks
(upstream test-llama-archs's causal-attention toggle, its save/load round trip, and a greedy continuation
decoded one token at a time, the path of generation).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from pyllama_so import _llama, archs, testing


def _logits(model: _llama.Model, job: dict) -> tuple[np.ndarray, _llama.Context]:
    ctx = _llama.Context(model, n_ctx=job["n_ctx"], n_batch=job["n_ctx"], n_ubatch=job["n_ubatch"], n_threads=2,
                         flash_attn=job["flash_attn"], split_overlap=job["split_overlap"])
    return ctx.decode(job["tokens"], all_logits=True, logits_from=job["logits_from"]), ctx


def _greedy(model: _llama.Model, ctx: _llama.Context, text: str, n: int) -> str:
    ctx.clear()
    logits = ctx.decode(model.tokenize(text))
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        logits = ctx.decode(out[-1:])
    return model.detokenize_bytes(out).decode("utf-8", "replace")


def main() -> int:
    job, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    _llama.set_log_level("error")
    devices = archs.resolve(job["devices"])
    model = testing.arch_model_load(job["model"], devices, job["split_mode"], attn_split=job["attn_split"])
    info: dict = {"toggle_ok": None, "roundtrip_equal": None, "generated": None}
    try:
        logits, ctx = _logits(model, job)
        try:
            info["split_overlap_stats"] = ctx.split_overlap_stats()
            if job["toggle"]:
                info["toggle_ok"] = bool(testing.arch_causal_toggle_ok(ctx, job["tokens"]))
            if job["generate_after"]:
                info["generated"] = _greedy(model, ctx, job["generate_after"], job["generate_tokens"])
        finally:
            ctx.free()
        if job["roundtrip"]:
            with tempfile.TemporaryDirectory(prefix="pyllama_so-roundtrip-") as tmp:
                path = str(Path(tmp) / "model.gguf")
                testing.arch_model_save(model, path)
                again = testing.arch_model_load(path, devices, job["split_mode"], attn_split=job["attn_split"])
                try:
                    logits2, ctx2 = _logits(again, job)
                    ctx2.free()
                finally:
                    again.free()
            info["roundtrip_equal"] = bool(np.array_equal(logits, logits2))
    finally:
        model.free()
    np.savez(out, logits=logits, info=np.array(json.dumps(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
