"""Benchmark instances and their timing, the same procedure as upstream's llama-bench.

Per instance: a fresh context of n_prompt + n_gen + n_depth tokens; a warm-up (one prompt run, one
generated token); then per repetition: clear the KV cache, fill it to the depth (untimed), and time
the prompt run and/or the generation run. t/s is the mean of the per-repetition rates.

warmup_runs (--warmup-runs) counts warm-up runs: 0 is none (--no-warmup), 1 the warm-up above
(llama-bench's), and each further one an untimed repetition: clear the KV cache, fill it to the
depth, one prompt run and one generated token. On GPUs 2 covers CUDA graph capture: ggml-cuda runs
a graph directly the first time, captures it on the second identical run and replays it from the
third, so after one warm-up run the first timed repetition of a prompt test pays for the captures.

Split overlap (-so 1) runs only under -sm tensor: other combinations with it are skipped, not failed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyllama_so import _llama, allreduce, config
from pyllama_so.config import ContextParams, ModelParams


@dataclass(frozen=True)
class Test:
    n_prompt: int
    n_gen: int
    n_depth: int

    @property
    def name(self) -> str:
        if self.n_prompt and not self.n_gen:
            s = f"pp{self.n_prompt}"
        elif self.n_gen and not self.n_prompt:
            s = f"tg{self.n_gen}"
        else:
            s = f"pp{self.n_prompt}+tg{self.n_gen}"
        return s + (f" @ d{self.n_depth}" if self.n_depth else "")


@dataclass
class BenchParams:
    """What the command line asked for; every list is one axis of the combinations."""

    models: list[str]
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    pg: list[tuple[int, int]] = field(default_factory=list)
    n_depth: list[int] = field(default_factory=lambda: [0])
    n_batch: list[int] = field(default_factory=lambda: [2048])
    n_ubatch: list[int] | None = None  # None: per combination, _llama.default_n_ubatch
    n_gpu_layers: list[int] = field(default_factory=lambda: [-1])
    split_mode: list[str] = field(default_factory=lambda: ["layer"])
    main_gpu: list[int] = field(default_factory=lambda: [0])
    tensor_split: list[tuple[float, ...]] = field(default_factory=lambda: [()])
    attn_split: list[tuple[float, ...]] = field(default_factory=lambda: [()])
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])
    type_k: list[str] = field(default_factory=lambda: ["f16"])
    type_v: list[str] = field(default_factory=lambda: ["f16"])
    n_threads: list[int] = field(default_factory=lambda: [-1])
    split_overlap: list[bool] = field(default_factory=lambda: [False])
    repetitions: int = 5
    warmup_runs: int = 1  # llama-bench's procedure; 0 is --no-warmup
    rpc_servers: tuple[str, ...] = ()  # one set for every run, as llama-bench's --rpc

    def plan(self) -> Plan:
        """Every combination of the lists as config.ModelParams and ContextParams, checked by Llama's rules:
        a ValueError (naming the combination's -b and -ub for a context's) before anything runs. A parameter
        of -sm tensor only (-as, -so 1) with another split mode is skipped, with a note: a comma list that
        mixes split modes still runs the rest."""
        skipped: set[str] = set()
        contexts = []
        ubatches: list[int | None] = [*self.n_ubatch] if self.n_ubatch else [None]
        for b, ub, t, fa, tk, tv, so in itertools.product(self.n_batch, ubatches, self.n_threads,
                                                          self.flash_attn, self.type_k, self.type_v,
                                                          self.split_overlap):
            try:  # n_ctx is each test's own (run_benchmarks)
                contexts.append(config.ContextParams(n_ctx=0, n_batch=b, n_ubatch=ub, n_threads=t, flash_attn=fa,
                                                     type_k=tk, type_v=tv, split_overlap=so))
            except config.ParamError:
                raise
            except ValueError as e:  # n_ubatch > n_batch: which pair of the lists
                raise ValueError(f"-b {b} -ub {ub}: {e}") from None
        loads = []  # (model parameters, the contexts that run with them)
        for ngl, sm, mg, ts, as_ in itertools.product(self.n_gpu_layers, self.split_mode, self.main_gpu,
                                                      self.tensor_split, self.attn_split):
            try:
                mp = config.ModelParams(n_gpu_layers=ngl, split_mode=sm, main_gpu=mg, tensor_split=ts or None,
                                        attn_split=as_ or None, rpc_servers=self.rpc_servers or None)
            except config.TensorSplitOnlyError as e:
                skipped.add(_skip_note(e))
                continue
            ok = []
            for cp in contexts:
                try:
                    config.check_combination(mp, cp)
                    ok.append(cp)
                except config.TensorSplitOnlyError as e:
                    skipped.add(_skip_note(e))
            if ok:
                loads.append((mp, ok))
        runs = [PlannedModel(m, mp, ok) for m in self.models for mp, ok in loads]
        return Plan(runs, sorted(skipped))

    def tests(self) -> Iterator[Test]:
        for d in self.n_depth:
            yield from (Test(p, 0, d) for p in self.n_prompt if p > 0)
            yield from (Test(0, n, d) for n in self.n_gen if n > 0)
            yield from (Test(p, n, d) for p, n in self.pg)

    def combinations(self) -> Iterator[tuple[str, ModelParams, ContextParams]]:
        """The model file, model and context parameters that run, in order (skipped ones left out)."""
        for run in self.plan().runs:
            for cp in run.contexts:
                yield run.path, run.model, cp

    def skipped(self) -> list[str]:
        """One note per reason a combination of the lists is skipped."""
        return self.plan().skipped

    def count(self) -> int:
        return sum(1 for _ in self.combinations()) * sum(1 for _ in self.tests())


_SKIPPED_FLAG = {"attn_split": "-as", "split_overlap": "-so 1"}


def _skip_note(e: config.TensorSplitOnlyError) -> str:
    return f"skipping {_SKIPPED_FLAG[e.param]} with -sm {e.split_mode}: {e}"


@dataclass(frozen=True)
class PlannedModel:
    """One model load of the bench: the file, its parameters, and the contexts that run on it."""

    path: str
    model: ModelParams
    contexts: list[ContextParams]


@dataclass(frozen=True)
class Plan:
    runs: list[PlannedModel]
    skipped: list[str]  # one note per reason


# Every axis at its default: the command line's defaults, and what the printers leave out.
DEFAULTS = BenchParams(models=[])


@dataclass
class TestResult:
    model_path: str
    model: ModelParams
    ctx: ContextParams  # n_ctx: the test's prompt, generation and depth
    test: Test
    model_type: str
    model_size: int
    model_n_params: int
    samples_ns: list[int]
    test_time: str
    warmup_runs: int
    allreduce_calls: dict[str, int] = field(default_factory=dict)  # per AllReduce path, CUDA builds
    split_overlap: dict[str, Any] = field(default_factory=dict)  # what the lanes did (split_overlap_fields)
    host_ms_per_ubatch: float | None = None  # host time in llama_decode per ubatch, timed runs only

    @property
    def samples_ts(self) -> list[float]:
        n = self.test.n_prompt + self.test.n_gen
        return [1e9 * n / t for t in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        ts = self.samples_ts
        return statistics.stdev(ts) if len(ts) > 1 else 0.0

    @property
    def avg_ns(self) -> int:
        return int(statistics.fmean(self.samples_ns))

    @property
    def stddev_ns(self) -> int:
        return int(statistics.stdev(self.samples_ns)) if len(self.samples_ns) > 1 else 0


# Machine facts, cached since the printers ask on every row. Devices registered later in the
# process (CPU virtual devices, which only the tests add) are not seen here.
@functools.cache
def backend_name(rpc: bool = False) -> str:
    """As llama-bench: the non-CPU backends with devices, then RPC when RPC servers are used, else CPU."""
    names = [b for b in _llama.backends() if b != "CPU"] + (["RPC"] if rpc else [])
    return ",".join(names) if names else "CPU"


@functools.cache
def cpu_info() -> str:
    for d in _llama.devices():
        if d["type"] == "cpu":
            return d["description"]
    return platform.processor()


@functools.cache
def gpu_info() -> str:
    return ", ".join(d["description"] for d in _llama.devices() if d["type"] in ("gpu", "igpu"))


def model_label(model: _llama.Model) -> str:
    """The model column: llama.cpp's description ("qwen3 8B F16"), except for our synthetic models,
    whose size class llama.cpp guesses from the layer count: their general.name and weight type."""
    desc = model.desc
    name = model.meta("general.name") or ""
    if not name.startswith("synthetic"):
        return desc
    parts = desc.split(" ", 2)  # architecture, size class, file type
    return f"{name} {parts[2]}" if len(parts) == 3 else name


def prompt_ubatches(ctx: _llama.Context, n_prompt: int) -> int:
    """Ubatches of a run_prompt: llama_decode calls of n_batch tokens, each cut into n_ubatch pieces."""
    full, rest = divmod(n_prompt, ctx.n_batch)
    return full * math.ceil(ctx.n_batch / ctx.n_ubatch) + math.ceil(rest / ctx.n_ubatch)


@dataclass
class _Runs:
    samples_ns: list[int] = field(default_factory=list)
    host_ns: int = 0  # in llama_decode, timed runs
    host_ubatches: int = 0  # timed runs
    ubatches: int = 0  # every run of the context: warm-up and depth too


def _run_test(ctx: _llama.Context, test: Test, reps: int, warmup_runs: int, note: Callable[[str], None]) -> _Runs:
    runs = _Runs()

    def prompt(n: int, timed: bool) -> None:
        host = ctx.run_prompt(n)
        ub = prompt_ubatches(ctx, n)
        runs.ubatches += ub
        if timed:
            runs.host_ns += host
            runs.host_ubatches += ub

    def gen(n: int, timed: bool) -> None:
        host = ctx.run_gen(n)
        runs.ubatches += n
        if timed:
            runs.host_ns += host
            runs.host_ubatches += n

    for run in range(warmup_runs):
        note("warm-up" if warmup_runs == 1 else f"warm-up {run + 1}/{warmup_runs}")
        if run > 0:  # the first is llama-bench's warm-up; the others are untimed repetitions
            ctx.clear()
            if test.n_depth:
                prompt(test.n_depth, False)
        if test.n_prompt:
            prompt(test.n_prompt, False)
        if test.n_gen:
            gen(1, False)
    for rep in range(reps):
        ctx.clear()
        if test.n_depth:
            note(f"depth {rep + 1}/{reps}")
            prompt(test.n_depth, False)
        note(f"rep {rep + 1}/{reps}")
        t0 = time.perf_counter_ns()
        if test.n_prompt:
            prompt(test.n_prompt, True)
        if test.n_gen:
            gen(test.n_gen, True)
        runs.samples_ns.append(time.perf_counter_ns() - t0)
    return runs


def split_overlap_fields(ctx: _llama.Context, requested: bool, ubatches: int) -> dict[str, Any]:
    """The lanes' counts over the context's life (warm-up included), [lane 0, lane 1]. Without lanes
    everything ran on lane 0, and its graph builds are llama.cpp's (ubatches whose graph was not reused):
    the lanes count the same thing, the graphs their Meta backend built."""
    st = ctx.split_overlap_stats()
    if st["enabled"]:
        ubs, builds = st["ubatches"], st["graph_builds"]
    else:
        ubs, builds = [ubatches, 0], [ubatches - ctx.graphs_reused, 0]
    return {"requested": requested, "enabled": st["enabled"], "reason": st["reason"], "ubatches": ubs,
            "graph_builds": builds, "waits": st["waits"]}


def _progress(total: int, enabled: bool) -> Callable[[int, Test, str], None]:
    """Progress on stderr: one updated line on a terminal, one line per test in a log."""
    tty = sys.stderr.isatty()

    def note(index: int, test: Test, stage: str) -> None:
        if not enabled:
            return
        line = f"bench: {index}/{total} {test.name}: {stage}"
        if tty:
            print(f"\r{line}\033[K" if stage else "\r\033[K", end="", file=sys.stderr, flush=True)
        elif stage.startswith("rep 1/"):
            print(line, file=sys.stderr, flush=True)

    return note


def run_benchmarks(params: BenchParams, progress: bool = True) -> Iterator[TestResult]:
    """Run every combination that is not skipped (params.skipped() says which are); yield each result
    as soon as it is measured."""
    plan = params.plan()
    tests = list(params.tests())
    note = _progress(sum(len(run.contexts) for run in plan.runs) * len(tests), progress)
    index = 0
    for run in plan.runs:
        mp = run.model
        model = config.load_model(run.path, mp)
        try:
            label = model_label(model)
            for cp in run.contexts:
                for test in tests:
                    index += 1
                    test_cp = dataclasses.replace(cp, n_ctx=test.n_prompt + test.n_gen + test.n_depth)
                    ctx = config.create_context(model, test_cp)
                    try:
                        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                        allreduce.reset_allreduce_stats()  # the counts include warm-up and depth-filling runs
                        runs = _run_test(ctx, test, params.repetitions, params.warmup_runs,
                                         functools.partial(note, index, test))
                        stats = allreduce.allreduce_stats()
                        lanes = split_overlap_fields(ctx, cp.split_overlap, runs.ubatches)
                    finally:
                        ctx.free()
                    note(index, test, "")  # clears the terminal line
                    calls = {k: v.calls for k, v in stats.paths.items() if v.calls}
                    host = runs.host_ns / runs.host_ubatches / 1e6 if runs.host_ubatches else None
                    yield TestResult(run.path, mp, test_cp, test, label, model.size, model.n_params, runs.samples_ns,
                                     stamp, params.warmup_runs, calls, lanes, host)
        finally:
            model.free()
