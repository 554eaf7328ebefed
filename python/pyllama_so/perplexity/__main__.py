"""`python -m pyllama_so.perplexity`: llama-perplexity for pyllama_so (see the package's docstring).

    python -m pyllama_so.perplexity -m model.gguf -c 512 --chunks 20
    python -m pyllama_so.perplexity -m model.gguf --kl-divergence-base base.npz
    GGML_CPU_VIRTUAL_DEVICES=2 python -m pyllama_so.perplexity -m model.gguf -sm tensor -so 1 \\
        --kl-divergence-base base.npz --kl-divergence

The model and batch flags are the bench's (one value each, with the same LLAMA_ARG_* variables). Progress
goes to stderr, the result to stdout (-o text, llama-perplexity's wording, or -o json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyllama_so import _llama, args as A
from pyllama_so.perplexity.base_file import BaseFile
from pyllama_so.perplexity.run import DEFAULT_TOP_K, TEXT, Settings, Summary, run


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.perplexity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    A.add_model_args(ap)
    ap.add_argument("-f", "--file", type=Path, metavar="TEXT",
                    help="the text (UTF-8); default: Alice's Adventures in Wonderland, bundled (public domain)")
    ap.add_argument("-c", "--ctx-size", type=A.positive_int, default=None, metavar="N",
                    help="tokens per chunk; the second half of each is scored (default 512; with --kl-divergence "
                         "the base's)")
    ap.add_argument("--chunks", type=A.non_negative_int, default=0, metavar="N",
                    help="at most N chunks (default 0: all)")
    ap.add_argument("--kl-divergence-base", type=Path, metavar="FILE",
                    help="save the distributions to FILE (.npz); with --kl-divergence, read them from it")
    ap.add_argument("--kl-divergence", action="store_true",
                    help="compare with --kl-divergence-base FILE (its tokens; -f is not read)")
    ap.add_argument("--kl-top-k", type=A.positive_int, default=DEFAULT_TOP_K, metavar="K",
                    help="tokens kept per position in the base file, the rest merged into one "
                         f"(default {DEFAULT_TOP_K})")
    ap.add_argument("-o", "--output", choices=("text", "json"), default="text")
    ap.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    ap.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    return ap


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_printer(enabled: bool) -> Callable[[int, int, float, float], None]:
    """Chunks done, seconds per chunk, time left and the perplexity so far: one redrawn line on a terminal,
    else a line every 10 s (and the last one)."""
    tty = sys.stderr.isatty()
    last = [0.0]

    def note(done: int, total: int, ppl: float, elapsed: float) -> None:
        if not enabled:
            return
        now = time.monotonic()
        if not tty and done < total and now - last[0] < 10.0 and done > 1:
            return
        last[0] = now
        per = elapsed / done
        text = (f"perplexity: chunk {done}/{total}, {per:.2f} s/chunk, {_duration(per * (total - done))} left, "
                f"PPL {ppl:.4f}")
        if tty:
            print("\r\033[K" + text, end="\n" if done == total else "", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    return note


def report(s: Summary) -> str:
    ppl, err = s.ppl
    lines = [f"perplexity: {s.model}: {s.n_chunk} chunks of {s.n_ctx} tokens, {s.n_scored} scored, "
             f"{s.seconds:.1f} s",
             f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}"]
    k = s.kld()
    if k is not None:
        lines += [
            "",
            f"====== Perplexity statistics (base: {k['base_model']}) ======",
            f"Mean PPL(Q)                   : {ppl:10.6f} ± {err:10.6f}",
            f"Mean PPL(base)                : {k['ppl_base']:10.6f} ± {k['ppl_base_stderr']:10.6f}",
            f"Mean ln(PPL(Q)/PPL(base))     : {k['ln_ppl_ratio']:10.6f} ± {k['ln_ppl_ratio_stderr']:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {k['ppl_ratio']:10.6f} ± {k['ppl_ratio_stderr']:10.6f}",
            "",
            f"====== KL divergence statistics (the base's top {k['top_k']} tokens and the rest, "
            f"{100 * k['base_rest_mass']:.2f} % of the mass on average) ======",
            f"Mean    KLD: {k['kld_mean']:10.6f} ± {k['kld_stderr']:10.6f}",
            f"Maximum KLD: {k['kld_max']:10.6f}",
            f"99.9%   KLD: {k['kld_p999']:10.6f}",
            f"99.0%   KLD: {k['kld_p99']:10.6f}",
            f"95.0%   KLD: {k['kld_p95']:10.6f}",
            f"Median  KLD: {k['kld_median']:10.6f}",
            f"Minimum KLD: {k['kld_min']:10.6f}",
            "",
            "====== Token probability statistics ======",
            f"Same top p: {100 * k['same_top']:6.3f} ± {100 * k['same_top_stderr']:5.3f} %",
            f"RMS Δp    : {100 * k['rms_dp']:6.3f} %",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 the run failed, 2 bad arguments, 130 interrupted."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("perplexity: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    ap = parser()
    ns = ap.parse_args(argv)
    if ns.kl_divergence and ns.kl_divergence_base is None:
        ap.error("--kl-divergence needs --kl-divergence-base FILE (made by a run without --kl-divergence)")
    if not ns.model:
        ap.error("-m/--model is required (or LLAMA_ARG_MODEL)")
    _llama.set_log_level("info" if ns.verbose else "error")
    try:
        base = BaseFile.load(ns.kl_divergence_base) if ns.kl_divergence else None
        n_ctx = ns.ctx_size or (base.n_ctx if base is not None else 512)
        settings = Settings(model=ns.model, n_ctx=n_ctx, n_chunks=ns.chunks, n_batch=ns.batch_size,
                            n_ubatch=ns.ubatch_size, n_gpu_layers=ns.n_gpu_layers, split_mode=ns.split_mode,
                            main_gpu=ns.main_gpu, tensor_split=tuple(ns.tensor_split or ()),
                            attn_split=tuple(ns.attn_split or ()), flash_attn=ns.flash_attn, type_k=ns.cache_type_k,
                            type_v=ns.cache_type_v, n_threads=ns.threads, split_overlap=ns.split_overlap,
                            rpc_servers=tuple(ns.rpc or ()), top_k=ns.kl_top_k)  # checks them (config)
    except (ValueError, OSError) as e:
        if isinstance(e, ValueError):
            A.exit_on_flag_error(ap, e)
        print(f"perplexity: error: {e}", file=sys.stderr)
        return 2
    try:
        text = None
        if base is None:
            path = ns.file or TEXT
            text = path.read_text(encoding="utf-8")
        summary = run(settings, text=text, base_in=base, base_out=None if ns.kl_divergence else ns.kl_divergence_base,
                      progress=progress_printer(not ns.no_progress))
    except (_llama.LlamaError, ValueError, OSError) as e:
        print(f"perplexity: error: {e}", file=sys.stderr)
        return 1
    if ns.output == "json":
        print(json.dumps(summary.to_dict()))
    else:
        print(report(summary))
        if ns.kl_divergence_base is not None and not ns.kl_divergence:
            print(f"saved the base to {ns.kl_divergence_base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
