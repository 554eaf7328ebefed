"""The stages that build and check correctness: build, probe, smoke, tests, sanitize, logits, precision."""
from __future__ import annotations

import os
import re
import shutil
import time

from .context import Context
from .options import env_words
from .registry import stage
from .runner import NULL, Abort, Cmd, env_text, tee, to

MEMCHECK_CE = "(test_ce_bitwise and (1001 or 2097153 or 6303801) and not chunk) or (alternating and 2097153)"
MEMCHECK_SO = "test_gpu_lanes_give_the_bits_of_one_lane and llama"


def _grep(cx: Context, log: str, pattern: str) -> list[str]:
    path = cx.logs / log
    text = path.read_text(errors="replace") if path.exists() else ""
    return [line for line in text.splitlines() if re.search(pattern, line)]


def _pip_build(cx: Context, variant: str, cmake_args: str, jobs: int) -> Cmd:
    return Cmd([cx.py, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", "--upgrade",
                "--target", str(cx.work / variant), f"--config-settings=build-dir=build/{variant}", "."],
               env={"CMAKE_BUILD_PARALLEL_LEVEL": str(jobs), "CMAKE_ARGS": cmake_args}, cwd=cx.repo,
               out=to(cx.logs / f"build-{variant}.log"), err=None)


@stage("build")
def build(cx: Context) -> None:
    """The CUDA build (sm_90, NCCL from the nvidia-nccl wheel when there is one) into WORK/cuda and, when stage
    probe, smoke or logits runs, the CPU build into WORK/cpu, both at once. Upstream's llama-bench is built too
    when stage bench runs, llama-server when stage upserver runs; neither build compiles the RPC backend (no
    stage uses it; tests/multi_device/test_rpc.py runs in CI). A failed CUDA build ends the check."""
    run = cx.run
    run.log("building CUDA and CPU variants")
    tools = "ON" if "bench" in cx.selected else "OFF"
    server = "ON" if "upserver" in cx.selected else "OFF"
    cuda_args = (f"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 {cx.nccl_arg} -DPYLLAMA_SO_UPSTREAM_TOOLS={tools} "
                 f"-DPYLLAMA_SO_UPSTREAM_SERVER={server} -DGGML_RPC=OFF")
    t0 = time.monotonic()
    cuda = run.start(_pip_build(cx, "cuda", cuda_args, jobs=len(os.sched_getaffinity(0))))
    cpu = (run.start(_pip_build(cx, "cpu", "-DGGML_RPC=OFF", jobs=8))
           if cx.selected & {"probe", "smoke", "logits"} else None)
    cuda_rc = cuda.wait()
    cpu_rc = cpu.wait() if cpu else "skipped"
    run.log(f"builds done in {time.monotonic() - t0:.0f} s: cuda rc={cuda_rc} cpu rc={cpu_rc}")
    if cuda_rc != 0:
        run.show_tail(cx.logs / "build-cuda.log", 40)
        raise Abort("the CUDA build failed")
    if cpu:
        run.check("CPU build", int(cpu_rc))
    run.run(cx.py_cuda("-m", "pyllama_so", "info", out=tee(cx.logs / "info-cuda.txt")))


@stage("probe")
def probe(cx: Context) -> None:
    """Regression check for a crash at model load (two copies of libstdc++ bound to each other, see
    docs/multi-gpu.md): each build loads a model with scripts/probe-load, with and without device queries
    first."""
    run = cx.run
    run.log("probe: model load on both builds")
    libs = cx.logs / "libs.txt"
    for lib in ("libllama.so", "libggml.so"):
        run.write(libs, f"== {lib}\n", append=True)
        run.run(Cmd(["ldd", str(cx.work / "cpu" / "pyllama_so" / lib)], out=to(libs, append=True), err=None))
    tiny = cx.work / "models" / "tiny-f16.gguf"
    run.run(cx.py_cpu("-m", "pyllama_so.synth", "tiny", "-o", str(tiny), out=NULL, err=NULL))
    for build in ("cpu", "cuda"):
        for what in ("none", "devices"):
            rc = run.run(Cmd(["timeout", "120", cx.py, "-X", "faulthandler", cx.script("probe-load"), str(tiny), what],
                             env={"PYTHONPATH": str(cx.work / build)}, cwd=cx.work,
                             out=to(cx.logs / f"probe-{build}-{what}.log"), err=None))
            run.check(f"probe {build} after {what}", rc)
            print(f"probe {build} after {what}: rc={rc}", flush=True)


@stage("smoke")
def smoke(cx: Context) -> None:
    """scripts/smoke (a step-by-step run that names the step a crash is in) on the CPU build, then on the CUDA
    build under -sm none, layer and tensor; the last lines of each."""
    run = cx.run
    run.log("smoke: CPU build, then CUDA build")
    rc = run.run(cx.py_cpu("-X", "faulthandler", cx.script("smoke"), "--ngl", "0", err=None, tail=12))
    run.check("smoke (CPU build)", rc)
    rc = run.run(cx.py_cuda("-X", "faulthandler", cx.script("smoke"), "--sm", "none,layer,tensor", err=None, tail=20))
    run.check("smoke (CUDA build)", rc)


@stage("tests")
def tests(cx: Context) -> None:
    """pytest on the CUDA build, one run per test set of --tests, each with its own log (a crash in one file
    does not hide the others)."""
    run = cx.run
    run.log("pytest on the CUDA build, file by file (a crash in one file does not hide the others)")
    for i, test_set in enumerate(cx.opts.tests):
        env, args = env_words(test_set)
        if not args:
            run.fail(f"no test file in test set '{test_set}'")
            continue
        log = f"pytest-{i}.log"  # one per run: a crash before pytest's summary must not show another run's
        rc = run.run(Cmd(["timeout", "300", cx.py, "-X", "faulthandler", "-m", "pytest",
                          str(cx.repo / "tests" / args[0]), *args[1:], "-q", "-p", "no:cacheprovider"],
                         env={**env, "PYTHONPATH": cx.cuda_path},
                         cwd=cx.work, out=to(cx.logs / log), err=None))
        run.check(f"pytest {test_set}", rc)
        counts = _grep(cx, log, r"[0-9]+ (passed|failed)")
        print(f"pytest {' '.join(filter(None, [env_text(env), *args]))}: rc={rc} {counts[-1] if counts else ''}",
              flush=True)


def _memcheck(cx: Context, what: str, log: str, first: bool, env: dict[str, str], test: str,
              *pytest_args: str) -> None:
    """A pytest run under compute-sanitizer memcheck; its line of OUT/memcheck.txt (the first writes it afresh)."""
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    rc = cx.run.run(Cmd(["timeout", "300", sanitizer, "--tool", "memcheck", "--report-api-errors", "no",
                         "--error-exitcode", "3", cx.py, "-m", "pytest", str(cx.repo / "tests" / test), "-q", "-p",
                         "no:cacheprovider", *pytest_args], env={**env, "PYTHONPATH": str(cx.work / "cuda")},
                        cwd=cx.work, out=to(cx.logs / log), err=None))
    cx.run.check(what, rc)
    found = " ".join(_grep(cx, log, r"ERROR SUMMARY|passed|failed"))
    cx.run.note(f"{what}: rc={rc} {found}", cx.out / "memcheck.txt", append=not first)


@stage("sanitize")
def sanitize(cx: Context) -> None:
    """compute-sanitizer memcheck over copy-engine reductions (one chunk, several rounds, sizes alternating)
    and over a short -so 1 prompt on two CUDA devices of one GPU: OUT/memcheck.txt."""
    cx.run.log("compute-sanitizer memcheck: copy-engine reductions "
               f"({shutil.which('compute-sanitizer') or '/usr/local/cuda/bin/compute-sanitizer'})")
    _memcheck(cx, "memcheck", "memcheck.log", True, {}, "multi_device/test_allreduce_ce.py", "-k", MEMCHECK_CE)
    cx.run.log("compute-sanitizer memcheck: a short -so 1 prompt on two CUDA devices of one GPU")
    _memcheck(cx, "memcheck split overlap", "memcheck-so.log", False,
              {"CUDA_VISIBLE_DEVICES": "0", "GGML_CUDA_DEVICES": "2"},
              "multi_device/test_split_overlap.py", "-m", "gpu", "-k", MEMCHECK_SO)


@stage("logits")
def logits(cx: Context) -> None:
    """A fixed prompt's logits (scripts/dump-logits) from the CPU build against the CUDA build's under -sm none,
    layer and tensor, on the F16 model of --model: OUT/logits.jsonl (NMSE, argmax agreement)."""
    run = cx.run
    run.log("logits: CPU build vs CUDA build")
    jsonl = cx.out / "logits.jsonl"
    run.truncate(jsonl)
    run.remove(*sorted(cx.work.glob("*.npy")))  # never compare against an earlier run's logits
    model = str(cx.model())
    reference = str(cx.work / "cpu.npy")
    fault = {"PYTHONFAULTHANDLER": "1"}
    rc = run.run(cx.py_cpu(cx.script("dump-logits"), "-m", model, "-ngl", "0", "-o", reference, env=fault))
    run.check("dump-logits (CPU build)", rc)
    for sm in ("none", "layer", "tensor"):
        rc = run.run(cx.py_cuda(cx.script("dump-logits"), "-m", model, "-sm", sm, "-o", str(cx.work / f"cuda-{sm}.npy"),
                                "--compare", reference, env=fault, out=tee(jsonl, append=True)))
        run.check(f"dump-logits -sm {sm}", rc)


@stage("precision", default=False)
def precision(cx: Context) -> None:
    """scripts/precision-table (KL divergence of split configurations against a reference) on the GGUF files
    of --precision-models, once per row set of --precision-rows, on two CUDA devices of GPU 0: OUT/precision/
    and OUT/precision.md."""
    run, opts = cx.run, cx.opts
    if not opts.precision_models:
        run.fail("precision skipped: --precision-models (GPU_CHECK_PRECISION_MODELS) names no model")
        return
    run.log(f"precision (two CUDA devices of GPU 0): {' '.join(opts.precision_models)}")
    table = cx.out / "precision.md"
    run.truncate(table)
    models = [w for m in opts.precision_models for w in ("-m", m)]
    for rows in opts.precision_rows:
        rc = run.run(cx.py_cuda(cx.script("precision-table"), "--rows", rows, *models, "--out",
                                str(cx.out / "precision"), *opts.precision_args, env={"CUDA_VISIBLE_DEVICES": "0"},
                                out=tee(table, append=True), err=to(cx.logs / "precision.err", append=True)))
        run.check(f"precision table ({rows})", rc)
    run.show_tail(cx.logs / "precision.err", 3)
