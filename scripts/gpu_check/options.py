"""The flags of scripts/gpu-check. Each has a GPU_CHECK_* environment variable as its default (unset or
empty: the built-in default), so that `GPU_CHECK_STAGES=build,tests scripts/gpu-check` keeps working."""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __doc__ as OVERVIEW

REPO = Path(__file__).resolve().parents[2]

_ENV_WORD = re.compile(r"[A-Z_][A-Z0-9_]*=")


def words(text: str) -> list[str]:
    """Words split on whitespace, without quoting or globbing (a -k expression must not hold spaces)."""
    return text.split()


def comma_words(text: str) -> list[str]:
    """A list such as 512,1024 (commas or spaces between the items)."""
    return text.replace(",", " ").split()


def configs(text: str) -> list[str]:
    """';'-separated configurations (flag sets after optional VAR=value words); blank ones are dropped."""
    return [c for c in text.split(";") if c.strip()]


def env_words(config: str) -> tuple[dict[str, str], list[str]]:
    """A configuration's leading VAR=value words (its environment) and the words after them (its arguments)."""
    env: dict[str, str] = {}
    args: list[str] = []
    for w in words(config):
        if not args and _ENV_WORD.match(w):
            name, value = w.split("=", 1)
            env[name] = value
        else:
            args.append(w)
    return env, args


def count(text: str) -> int:
    n = int(text) if text.strip().isdigit() else -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return n


@dataclass(frozen=True)
class Option:
    flag: str
    env: str  # the environment variable that gives the default
    default: str  # as the variable would hold it; "" with no default
    help: str
    type: Callable[[str], Any] = str


TESTS = ("gpu/test_gpu.py;multi_device/test_allreduce_ce.py -k not(routing_by_size);"
         "multi_device/test_allreduce_ce.py -k routing -s;multi_device/test_archs.py -m gpu;llama/test_llama.py;"
         "llama/test_errors.py;bench/test_bench.py;bench/test_bench_allreduce.py;"
         "repo/test_build.py -k (no_test_switch)or(rig_is_its_own);multi_device/test_split_overlap.py;"
         "CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2 multi_device/test_split_overlap.py -m gpu;"
         "multi_device/test_attn_split.py -m gpu;llama/test_examples.py;server/test_server.py -m gpu;"
         "llama/test_sampling.py")

OPTIONS = (
    Option("--out", "OUT", str(REPO / "gpu-out"), "the folder of the results (JSON, tables, logs.tgz)", Path),
    Option("--work", "GPU_CHECK_WORK", "/tmp/gpu-check", "scratch folder: builds, models, logs", Path),
    Option("--python", "PYTHON", "python3", "the Python that builds and runs everything"),
    Option("--budget-s", "GPU_CHECK_BUDGET_S", "540",
           "stages that would start later than this many seconds after the start are skipped, so the logs "
           "still come back", int),
    Option("--model", "GPU_CHECK_MODEL", "qwen3-8b", "synthetic shape (F16) of stages tpbench, bench, logits"),
    Option("--reps", "GPU_CHECK_REPS", "5", "repetitions of every bench run", int),
    Option("--warmup-runs", "GPU_CHECK_WARMUP_RUNS", "",
           "--warmup-runs of every pyllama_so.bench run (tpbench, sobench, so2bench, decode, bench); unset: the "
           "bench's default, 1 as llama-bench. 2 covers CUDA graph capture, which otherwise the first timed "
           "repetition of a prompt test pays for", count),
    Option("--tests", "GPU_CHECK_TESTS", TESTS,
           "stage tests: ';'-separated pytest runs, one per file (its path under tests/), each after optional "
           "VAR=value words (its environment); split on spaces, so a -k expression has none, e.g. "
           "-k not(routing_by_size)", configs),
    Option("--ar-args", "GPU_CHECK_AR_ARGS", "--ce-sweep",
           "stage arbench: flags of pyllama_so.bench.allreduce, e.g. \"--sizes 2K,8K,32K,128K --paths ll,internal\" "
           "for a decode's reductions", words),
    Option("--tp-runs", "GPU_CHECK_TP_RUNS", "nccl ce",
           "stage tpbench: runs in order; nccl, ce (copy engines forced), ce_c<K>k (fixed K KiB chunks), ce_best "
           "(the copy-engine variant of stage arbench's sweep with the least time at 8 and 16 MiB)", words),
    Option("--tp-ubatch", "GPU_CHECK_TP_UBATCH", "512,1024,2048", "stage tpbench: its -ub list"),
    Option("--so-model", "GPU_CHECK_SO_MODEL", "qwen3-8b",
           "synthetic shape (Q8_0) of the split-overlap, server, generation and trace stages"),
    Option("--so-ub0", "GPU_CHECK_SO_UB0", "512,1024,2048", "stage sobench: ubatches of -so 0", comma_words),
    Option("--so-ub1", "GPU_CHECK_SO_UB1", "128,256,512,1024", "stage sobench: ubatches of -so 1", comma_words),
    Option("--so-ub1-cut", "GPU_CHECK_SO_UB1_CUT", "",
           "stage sobench: ubatches of --so-ub1 that also run -so 1 with llama.cpp's cut of a batch "
           "(LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES=0, tool so1-cut)", comma_words),
    Option("--so-ubl", "GPU_CHECK_SO_UBL", "", "stage sobench: ubatches of -sm layer on the same two devices",
           comma_words),
    Option("--so2-configs", "GPU_CHECK_SO2_CONFIGS",
           "-sm layer -ub 512;-sm tensor -so 0 -ub 2048;-sm tensor -so 1 -ub 512;-sm tensor -so 1 -ub 1024",
           "stage so2bench: ';'-separated bench flag sets", configs),
    Option("--decode-configs", "GPU_CHECK_DECODE_CONFIGS",
           "-sm none;-sm tensor;GGML_CUDA_AR_LL_MAX_BYTES=0 -sm tensor;"
           "GGML_CUDA_AR_LL_MAX_BYTES=0 GGML_CUDA_AR_HOST_WAIT=1 -sm tensor",
           "stage decode: ';'-separated bench flag sets after optional VAR=value words", configs),
    Option("--decode-models", "GPU_CHECK_DECODE_MODELS", "overhead qwen3-8b",
           "stage decode: synthetic shapes (Q8_0)", words),
    Option("--decode-rounds", "GPU_CHECK_DECODE_ROUNDS", "2", "stage decode: rounds, the configurations interleaved",
           int),
    Option("--decode-tokens", "GPU_CHECK_DECODE_TOKENS", "128", "stage decode: tokens generated (-n)", int),
    Option("--server-args", "GPU_CHECK_SERVER_ARGS", "", "stage server: more flags of scripts/server-scenario",
           words),
    Option("--gen-reps", "GPU_CHECK_GEN_REPS", "3", "stage generation: repetitions", int),
    Option("--gen-streams", "GPU_CHECK_GEN_STREAMS", "1,8,32", "stage generation: its --streams"),
    Option("--gen-args", "GPU_CHECK_GEN_ARGS", "", "stage generation: more flags of scripts/generation-bench", words),
    Option("--bench-configs", "GPU_CHECK_BENCH_CONFIGS", "-sm none;-sm tensor",
           "stage bench: ';'-separated llama-bench flag sets", configs),
    Option("--load-args", "GPU_CHECK_LOAD_ARGS", "--concurrency 1,8 --requests 16 --prompt 512 --gen 128",
           "stage serverload: the load (flags of scripts/server-load)", words),
    Option("--load-server-args", "GPU_CHECK_LOAD_SERVER_ARGS", "-sm none -ngl 99 -fa on -c 16384 -np 8",
           "stages serverload and servertrace: both servers' flags", words),
    Option("--load-ours-variants", "GPU_CHECK_LOAD_OURS_VARIANTS", "",
           "stage serverload: ';'-separated flag sets of our server, each run after the pair, ours only "
           "(OUT/server-load-vN.json)", configs),
    Option("--mixed-configs", "GPU_CHECK_MIXED_CONFIGS", "-so 0;-so 1",
           "stage mixedload: one server per ';'-separated configuration (server flags after optional VAR=value "
           "words), e.g. \"-so 0 -ub 2048 --prefill-chunk 2048;-so 1 -ub 1024 --prefill-chunk 2048\"", configs),
    Option("--mixed-args", "GPU_CHECK_MIXED_ARGS", "--concurrency 4 --long 4096,8192,16000 --prompt 256 --gen 512",
           "stage mixedload: the mixed scenario's flags", words),
    Option("--mixed-server-args", "GPU_CHECK_MIXED_SERVER_ARGS", "-fa on -c 98304 -np 6",
           "stage mixedload: every server's other flags", words),
    Option("--precision-models", "GPU_CHECK_PRECISION_MODELS", "",
           "stage precision: GGUF paths (the real models are larger than what a call carries: assemble them "
           "before)", words),
    Option("--precision-rows", "GPU_CHECK_PRECISION_ROWS", "gpu",
           "stage precision: row sets of scripts/precision-table (gpu-one: against one CUDA device)", words),
    Option("--precision-args", "GPU_CHECK_PRECISION_ARGS", "",
           "stage precision: more flags of scripts/precision-table (e.g. --chunks 8)", words),
    Option("--profile-configs", "GPU_CHECK_PROFILE_CONFIGS", "-so 0 -ub 2048;-so 1 -ub 1024;-so 1 -ub 512",
           "stage profile: ';'-separated bench flags after pp2048's, which they override (e.g. \"-p 0 -n 64\" for "
           "decode), after optional VAR=value words", configs),
    Option("--profile-window-ms", "GPU_CHECK_PROFILE_WINDOW_MS", "120", "stage profile: the window drawn"),
    Option("--steptrace-modes", "GPU_CHECK_STEPTRACE_MODES", "raw,greedy,sampled",
           "stage steptrace: scripts/generation-bench --modes, one traced process each", comma_words),
    Option("--steptrace-streams", "GPU_CHECK_STEPTRACE_STREAMS", "32", "stage steptrace: sequences", int),
    Option("--steptrace-tokens", "GPU_CHECK_STEPTRACE_TOKENS", "48", "stage steptrace: decode steps", int),
    Option("--servertrace-streams", "GPU_CHECK_SERVERTRACE_STREAMS", "8",
           "stage servertrace: streams (of 2 x that many requests, 512 + 128 tokens)", int),
    Option("--servertrace-window-ms", "GPU_CHECK_SERVERTRACE_WINDOW_MS", "300", "stage servertrace: the window"),
    Option("--servertrace-end-ms", "GPU_CHECK_SERVERTRACE_END_MS", "-400",
           "stage servertrace: where the window ends (negative: before the last kernel)"),
)


def parser(default_stages: Sequence[str], environ: Mapping[str, str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpu-check", description=OVERVIEW,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", default=environ.get("GPU_CHECK_STAGES") or ",".join(default_stages),
                    type=comma_words, help="comma-separated stages to run (env GPU_CHECK_STAGES; default: "
                    f"{','.join(default_stages)}); see --list-stages")
    ap.add_argument("--list-stages", action="store_true", help="print the stages and what each does, then exit")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands every stage would run, run none and write nothing (it still asks "
                    "the machine read-only questions: its GPUs, the NCCL wheel, CUPTI)")
    for o in OPTIONS:
        # a string default goes through the option's type, as a value given on the command line would
        default = environ.get(o.env) or o.default
        shown = f"default: {o.default}" if o.default else "no default"
        ap.add_argument(o.flag, type=o.type, default=None if default == "" and o.type is count else default,
                        help=f"{o.help} (env {o.env}; {shown})")
    return ap


def parse_args(argv: Sequence[str] | None, stages: Sequence[str], default_stages: Sequence[str],
               environ: Mapping[str, str]) -> argparse.Namespace:
    """The flags, each defaulting to its GPU_CHECK_* variable of `environ` (unset or empty: the built-in
    default); --stages must name known stages."""
    ap = parser(default_stages, environ)
    opts = ap.parse_args(argv)
    unknown = [s for s in opts.stages if s not in stages]
    if unknown:
        ap.error(f"unknown stage(s) {','.join(unknown)}; the stages: {','.join(stages)}")
    return opts
