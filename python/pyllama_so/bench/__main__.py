"""`python -m pyllama_so.bench`: llama-bench for pyllama_so.

Same flags, statistics and output formats as upstream's llama-bench; comma lists run every
combination. Without -m, a small synthetic model is written once to the cache and benchmarked.

    python -m pyllama_so.bench -m model.gguf -sm tensor -ub 512,2048 -p 2048 -n 32 -so 0,1
"""

from __future__ import annotations

import argparse
import os
import sys

from pyllama_so import _llama, args as A
from pyllama_so.bench.printers import PRINTERS
from pyllama_so.bench.runner import DEFAULTS, BenchParams, run_benchmarks
from pyllama_so.synth import SHAPES, cached_model


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    A.add_model_args(ap, lists=True, synthetic_shapes=list(SHAPES))  # -m -b -ub -ngl -sm -mg -ts -as -fa ... -so --rpc
    ap.add_argument("-p", "--n-prompt", type=A.comma_list(A.non_negative_int), default=d.n_prompt)
    ap.add_argument("-n", "--n-gen", type=A.comma_list(A.non_negative_int), default=d.n_gen)
    ap.add_argument("-pg", type=A.pp_tg_pair, action="append", default=[], metavar="PP,TG",
                    help="prompt + generation test; repeat the flag for several")
    ap.add_argument("-d", "--n-depth", type=A.comma_list(A.non_negative_int), default=d.n_depth)
    ap.add_argument("-r", "--repetitions", type=A.positive_int, default=d.repetitions)
    ap.add_argument("-o", "--output", choices=list(PRINTERS), default="md")
    ap.add_argument("--no-warmup", action="store_true", help="no warm-up run (the same as --warmup-runs 0)")
    ap.add_argument("--warmup-runs", type=A.non_negative_int, default=None, metavar="N",
                    help=f"warm-up runs before the timed repetitions (default {d.warmup_runs}: llama-bench's one "
                         "prompt run and one generated token; each further run is an untimed repetition). "
                         "2 covers CUDA graph capture: ggml-cuda captures a graph on its second identical run, "
                         "so with one warm-up run the first timed repetition of a prompt test pays for it")
    ap.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    ap.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    return ap


def warmup_runs(ns: argparse.Namespace) -> int:
    """--warmup-runs, else 0 with --no-warmup, else the default; ValueError when the two flags disagree."""
    if ns.warmup_runs is None:
        return 0 if ns.no_warmup else DEFAULTS.warmup_runs
    if ns.no_warmup and ns.warmup_runs > 0:
        raise ValueError(f"--no-warmup conflicts with --warmup-runs {ns.warmup_runs} (--no-warmup is --warmup-runs 0)")
    return int(ns.warmup_runs)


def params_from_args(ns: argparse.Namespace) -> BenchParams:
    """The lists of the flags; without -m no model yet (the synthetic one is written once they are checked)."""
    models = list(ns.model or [])
    for m in models:
        if os.path.isdir(m):
            raise SystemExit(f"bench: {m} is a directory, not a model file")
        if not os.path.isfile(m):
            raise SystemExit(f"bench: model file not found: {m}")
    return BenchParams(
        models=models, n_prompt=ns.n_prompt, n_gen=ns.n_gen, pg=ns.pg, n_depth=ns.n_depth,
        n_batch=ns.batch_size, n_ubatch=ns.ubatch_size, n_gpu_layers=ns.n_gpu_layers, split_mode=ns.split_mode,
        main_gpu=ns.main_gpu, tensor_split=ns.tensor_split or [()], attn_split=ns.attn_split or [()],
        flash_attn=ns.flash_attn,
        type_k=ns.cache_type_k, type_v=ns.cache_type_v, n_threads=ns.threads, split_overlap=ns.split_overlap,
        repetitions=ns.repetitions, warmup_runs=warmup_runs(ns), rpc_servers=tuple(ns.rpc[0]) if ns.rpc else ())


def error(message: str) -> None:
    """One line on stderr, after clearing the progress line of a terminal."""
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    print(f"bench: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 done, 1 a run failed, 2 bad arguments, 130 interrupted (Ctrl-C)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        error("interrupted")
        return 130


def _main(argv: list[str] | None) -> int:
    ap = parser()
    ns = ap.parse_args(argv)
    _llama.set_log_level("info" if ns.verbose else "error")
    try:
        warmup_runs(ns)  # checked before a synthetic model may be written
    except ValueError as e:
        error(f"error: {e}")
        return 2
    params = params_from_args(ns)
    if next(params.tests(), None) is None:
        raise SystemExit("bench: nothing to run (all of -p, -n and -pg are empty or 0)")
    try:  # every combination by Llama's rules (pyllama_so.config), so that none fails after others have run
        plan = params.plan()
    except ValueError as e:
        A.exit_on_flag_error(ap, e)
        error(f"error: {e}")
        return 2
    if not params.models:  # written once the combinations are known to be valid
        params.models = [str(cached_model(ns.synthetic))]
        plan = params.plan()
    if not plan.runs:
        error(f"error: nothing to run: {'; '.join(plan.skipped)}")
        return 2
    for note in plan.skipped:
        error(f"note: {note}")
    printer = PRINTERS[ns.output](sys.stdout, params)
    printer.header()
    try:
        for result in run_benchmarks(params, progress=not ns.no_progress):
            printer.result(result)
    except (_llama.LlamaError, _llama.RPCConnectionError, ValueError) as e:
        error(f"error: {e}")
        return 1
    finally:
        printer.footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
