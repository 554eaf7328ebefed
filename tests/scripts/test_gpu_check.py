"""scripts/gpu-check on the CPU: its stage registry, its flags and their GPU_CHECK_* defaults, the runner of its
commands, and dry runs (the commands a GPU machine would run, checked without running them)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from gpu_check import context
from gpu_check.benches import best_ce_variant, so_runs
from gpu_check.main import main
from gpu_check.options import env_words, parse_args
from gpu_check.registry import ORDER, STAGES, default_names, registered, stage
from gpu_check.runner import Cmd, Runner, tee, to
from gpu_check.traces import newest_record
from helpers.paths import REPO

SCRIPT = REPO / "scripts" / "gpu-check"
DEFAULT_STAGES = ["build", "probe", "smoke", "tests", "arbench", "tpbench", "sobench", "so2bench", "server",
                  "generation", "sanitize", "bench", "logits"]
NO_MULTICAST = "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"

Machine = Callable[[int, "Path | None"], None]


def parse(environ: Mapping[str, str], *argv: str) -> argparse.Namespace:
    return parse_args(list(argv), ORDER, default_names(), environ)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Machine:
    """The machine a check sees: its GPUs and the NCCL wheel, and no wheels carried (whatever this checkout's
    .whl holds)."""
    def set_machine(n_gpus: int, nccl: Path | None) -> None:
        monkeypatch.setattr(context, "carried_wheels", lambda repo: [])
        monkeypatch.setattr(context, "gpu_list", lambda run: [f"{i}, NVIDIA H200, 143771 MiB" for i in range(n_gpus)])
        monkeypatch.setattr(context, "nccl_wheel", lambda run, python: nccl)
    return set_machine


def dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str,
            environ: Mapping[str, str] | None = None) -> list[str]:
    """The commands of a dry run (its '+ ' lines) after its log; nothing written."""
    out, work = tmp_path / "out", tmp_path / "work"
    assert main(["--dry-run", "--out", str(out), "--work", str(work), *flags], environ or {}) == 0
    assert not out.exists() and not work.exists()
    return capsys.readouterr().out.splitlines()


def commands(lines: list[str], *parts: str) -> list[str]:
    return [line[2:] for line in lines if line.startswith("+ ") and all(p in line for p in parts)]


def test_every_stage_is_registered_once_in_its_place(capsys: pytest.CaptureFixture[str]) -> None:
    stages = registered()
    assert [s.name for s in stages] == list(ORDER) and set(STAGES) == set(ORDER)
    assert default_names() == DEFAULT_STAGES
    assert all(s.summary for s in stages)
    with pytest.raises(AssertionError, match="no place"):
        stage("nosuch")(lambda cx: None)
    with pytest.raises(AssertionError, match="twice"):
        stage("build")(lambda cx: None)
    assert main(["--list-stages"], {}) == 0
    listing = capsys.readouterr().out
    for s in stages:
        assert f"{'*' if s.default else ' '} {s.name}\n" in listing


def test_flags_default_to_their_variables() -> None:
    env = {"GPU_CHECK_STAGES": "build,tests,mixedload", "GPU_CHECK_MIXED_CONFIGS": "-so 0 -ub 2048;X=1 -so 1;",
           "GPU_CHECK_REPS": "3", "GPU_CHECK_SO_UB0": " ", "GPU_CHECK_AR_ARGS": "--sizes 2K,8K --paths ll",
           "GPU_CHECK_WARMUP_RUNS": "2", "GPU_CHECK_MODEL": "", "OUT": "/o"}
    opts = parse(env)
    assert opts.stages == ["build", "tests", "mixedload"]
    assert opts.mixed_configs == ["-so 0 -ub 2048", "X=1 -so 1"]  # a trailing ';' adds no configuration
    assert (opts.reps, opts.warmup_runs, opts.out) == (3, 2, Path("/o"))
    assert opts.so_ub0 == []  # set, if blank: no ubatches
    assert opts.model == "qwen3-8b"  # empty: the built-in default
    assert opts.ar_args == ["--sizes", "2K,8K", "--paths", "ll"]
    flags = parse(env, "--stages", "bench", "--reps", "7", "--ar-args=--ce-sweep", "--mixed-configs", "-so 1")
    assert (flags.stages, flags.reps, flags.ar_args, flags.mixed_configs) == (["bench"], 7, ["--ce-sweep"], ["-so 1"])
    bare = parse({})
    assert bare.stages == DEFAULT_STAGES and bare.warmup_runs is None and bare.so_ub1_cut == []
    assert bare.so_ub1 == ["128", "256", "512", "1024"] and bare.work == Path("/tmp/gpu-check")
    assert len(bare.tests) == 15
    assert bare.tests[10] == "CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2 multi_device/test_split_overlap.py -m gpu"
    for test_set in bare.tests:  # each names a test file of the tree (a path under tests/)
        assert (REPO / "tests" / env_words(test_set)[1][0]).is_file(), test_set


@pytest.mark.parametrize("env, argv", [({"GPU_CHECK_WARMUP_RUNS": "x"}, []), ({}, ["--warmup-runs", "-1"]),
                                       ({"GPU_CHECK_STAGES": "build,nosuch"}, []), ({"GPU_CHECK_REPS": "many"}, [])])
def test_bad_values_are_usage_errors(env: dict[str, str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(env, *argv)
    assert e.value.code == 2


def test_a_configuration_is_its_environment_then_its_arguments() -> None:
    assert env_words("CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2 test_split_overlap.py -m gpu") == (
        {"CUDA_VISIBLE_DEVICES": "0", "GGML_CUDA_DEVICES": "2"}, ["test_split_overlap.py", "-m", "gpu"])
    assert env_words("-sm tensor X=1") == ({}, ["-sm", "tensor", "X=1"])  # only leading words set variables
    assert env_words("") == ({}, [])


def test_sobench_runs_by_ubatch() -> None:
    opts = parse({"GPU_CHECK_SO_UB0": "512", "GPU_CHECK_SO_UB1": "640,768", "GPU_CHECK_SO_UB1_CUT": "768",
                  "GPU_CHECK_SO_UBL": "256"})
    assert so_runs(opts) == [("0", "512"), ("1", "640"), ("1", "768"), ("cut", "768"), ("layer", "256")]


def test_the_best_copy_engine_variant_of_a_sweep(tmp_path: Path) -> None:
    results = {"nccl": {"us": [1, 1, 1]}, "ce": {"us": [9, 50, 60]}, "ce_c512k": {"us": [1, 40, 65]},
               "ce_broken": {"error": "x"}}
    report = tmp_path / "allreduce.json"
    report.write_text(json.dumps({"sizes": [4 << 20, 8 << 20, 16 << 20], "results": results}))
    assert best_ce_variant(report) == "ce_c512k"  # 105 us against 110 at 8 and 16 MiB; nccl is not a candidate
    report.write_text(json.dumps({"sizes": [1024], "results": results}))
    assert best_ce_variant(report) == "ce"  # neither size measured
    report.write_text("{")
    assert best_ce_variant(report) == "ce"
    assert best_ce_variant(tmp_path / "none.json") == "ce"


def test_the_newest_cupti_record_struct() -> None:
    header = ("} CUpti_ActivityKernel8;\n} CUpti_ActivityKernel10;\n} CUpti_ActivityKernel9;\n"
              "} CUpti_ActivityMemcpy;\n} CUpti_ActivityMemcpyPtoP4;\n")
    assert newest_record(header, "Kernel") == "CUpti_ActivityKernel10"
    assert newest_record(header, "Memcpy") == "CUpti_ActivityMemcpy"
    assert newest_record(header, "Memset") == ""


def test_the_runner_redirects_tags_and_passes_the_environment(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    run = Runner(dry_run=False)
    code = ("import os, sys; print('{\"a\": 1}'); print('plain'); "
            "print(os.environ['NCCL_NVLS_ENABLE'], os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'], "
            "os.environ['NVSHMEM_DISABLE_NVLS'], os.environ['X']); print('oops', file=sys.stderr); sys.exit(3)")
    out, err = tmp_path / "out.jsonl", tmp_path / "err.log"
    out.write_text("before\n")
    rc = run.run(Cmd([sys.executable, "-c", code], env={"X": "y"}, out=to(out, append=True), err=to(err),
                     tag='"tool": "t", '))
    assert rc == 3  # the command's status, not that of what copied its output
    assert out.read_text() == 'before\n{"tool": "t", "a": 1}\nplain\n0 1 1 y\n'
    assert err.read_text() == "oops\n"
    assert capfd.readouterr().out == ""
    lines = "import sys; [print(i) for i in range(30)]; print('e', file=sys.stderr)"
    assert run.run(Cmd([sys.executable, "-c", lines], out=tee(out), err=None, tail=3)) == 0
    assert capfd.readouterr().out == "28\n29\ne\n" and out.read_text().splitlines()[-1] == "e"
    assert not run.failed
    assert run.run(Cmd([str(tmp_path / "nosuch")], err=to(err))) == 127 and "nosuch" in err.read_text()
    run.check("a step", 127)
    assert run.failed and "a step failed: rc=127" in capfd.readouterr().out
    # in the background (&): waited for, or stopped (the VRAM sampler)
    job = run.start(Cmd([sys.executable, "-c", "print('built')"], out=to(out), err=None))
    assert job.wait() == 0 and out.read_text() == "built\n"
    assert run.start(Cmd([str(tmp_path / "nosuch")])).wait() == 127
    sampler = run.start(Cmd([sys.executable, "-c", "import time; time.sleep(600)"]))
    sampler.stop()
    assert sampler.wait() == 128 + 15  # SIGTERM, as the shell counts it


def test_a_dry_run_of_the_default_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str], machine: Machine) -> None:
    machine(2, Path("/site/nvidia/nccl"))
    lines = dry_run(tmp_path, capsys)
    out, work = tmp_path / "out", tmp_path / "work"
    assert lines[0] == f"+ export {NO_MULTICAST} PYTHONUNBUFFERED=1"
    assert f"+ ln -sfn /site/nvidia/nccl/lib/libnccl.so.2 {work}/nccl/lib/libnccl.so.2" in lines
    assert commands(lines, f"export LD_LIBRARY_PATH={work}/nccl/lib:")
    [cuda] = commands(lines, f"--target {work}/cuda")
    assert cuda.startswith(f"(cd {REPO} && CMAKE_BUILD_PARALLEL_LEVEL=") and cuda.endswith(" &")
    assert (f"'-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DNCCL_ROOT={work}/nccl -DPYLLAMA_SO_UPSTREAM_TOOLS=ON "
            "-DPYLLAMA_SO_UPSTREAM_SERVER=OFF -DGGML_RPC=OFF'") in cuda
    assert "--config-settings=build-dir=build/cuda ." in cuda and f"> {work}/logs/build-cuda.log 2>&1" in cuda
    [cpu] = commands(lines, f"--target {work}/cpu")
    assert "CMAKE_BUILD_PARALLEL_LEVEL=8 CMAKE_ARGS=-DGGML_RPC=OFF" in cpu
    assert len(commands(lines, "probe-load")) == 4 and len(commands(lines, "scripts/smoke")) == 2
    pytest_runs = commands(lines, "-m pytest")
    assert len(pytest_runs) == 15 + 2  # the test sets, then memcheck's two
    assert all(f"PYTHONPATH={work}/cuda" in c for c in pytest_runs)
    assert commands(lines, "pyllama_so.bench.allreduce --ce-sweep", f"--json {out}/allreduce.json")
    assert not commands(lines, "GGML_CUDA_DEVICES=2 PYTHONPATH", "allreduce")  # two GPUs: no proxy
    tp = commands(lines, "-sm tensor -fa 1 -b 2048 -ub 512,1024,2048 -p 2048 -n 32 -r 5 -o jsonl")
    assert [c.split()[3:5] for c in tp] == [["NCCL_P2P_DISABLE=1", "GGML_CUDA_AR_CE=0"],
                                           ["NCCL_P2P_DISABLE=1", "GGML_CUDA_AR_CE=1"]]
    assert """sed 's/^{/{"tool": "nccl", /' >> """ + f"{out}/tpbench.jsonl" in tp[0]
    assert len(commands(lines, "GGML_CUDA_DEVICES=2 GGML_CUDA_AR_CE=1", "sobench.jsonl")) == 3 + 4
    assert len(commands(lines, "NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1", "so2bench.jsonl")) == 4
    assert commands(lines, "scripts/server-scenario", f"tee {out}/server-scenario.md")
    assert commands(lines, "CUDA_VISIBLE_DEVICES=0", "scripts/generation-bench", "--streams 1,8,32")
    assert len(commands(lines, "compute-sanitizer --tool memcheck")) == 2
    assert len(commands(lines, "llama-bench -m")) == 4
    assert len(commands(lines, "pyllama_so.bench -m", f">> {out}/bench.jsonl")) == 4
    assert len(commands(lines, "scripts/dump-logits")) == 4
    assert commands(lines)[-2:] == [f"python3 {REPO}/scripts/gpu-summary {out}",
                                    f"tar czf {out}/logs.tgz -C {work}/logs . 2> /dev/null"]
    for other in ("--scenario mixed", "precision-table", "decode.jsonl", "so-timeline", "gcc", "server-load"):
        assert not commands(lines, other), other


def test_a_dry_run_from_variables_on_one_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              machine: Machine) -> None:
    machine(1, None)
    env = {"GPU_CHECK_STAGES": "build,tests,mixedload",
           "GPU_CHECK_TESTS": "gpu/test_gpu.py;X=1 llama/test_llama.py -k cache",
           "GPU_CHECK_MIXED_CONFIGS": "-so 0 -ub 2048;GGML_CUDA_AR_HOST_WAIT=1 -so 1", "GPU_CHECK_WARMUP_RUNS": "2"}
    lines = dry_run(tmp_path, capsys, environ=env)
    out, work = tmp_path / "out", tmp_path / "work"
    [cuda] = commands(lines, "pip install")  # no CPU build: no stage of it
    assert "-DGGML_CUDA_NCCL=OFF -DPYLLAMA_SO_UPSTREAM_TOOLS=OFF" in cuda
    assert not commands(lines, "ln -sfn") and not commands(lines, "LD_LIBRARY_PATH")
    first, second = commands(lines, "-m pytest")
    assert f"-m pytest {REPO}/tests/gpu/test_gpu.py -q -p no:cacheprovider > {work}/logs/pytest-0.log 2>&1" in first
    assert f"X=1 PYTHONPATH={work}/cuda" in second and "tests/llama/test_llama.py -k cache -q" in second
    mixed = commands(lines, "scripts/server-load --server ours")
    assert len(mixed) == 2
    devices = "CUDA_VISIBLE_DEVICES=0 GGML_CUDA_DEVICES=2 NCCL_P2P_DISABLE=1 GGML_CUDA_AR_CE=1"
    assert f"{devices} PYTHONPATH" in mixed[0] and f"{devices} GGML_CUDA_AR_HOST_WAIT=1 PYTHONPATH" in mixed[1]
    assert (f"--scenario mixed --concurrency 4 --long 4096,8192,16000 --prompt 256 --gen 512 --timeout 300 "
            f"--json {out}/mixed-1.json -- -sm tensor -so 0 -ub 2048 -fa on -c 98304 -np 6") in mixed[0]
    assert f"--json {out}/mixed-2.json -- -sm tensor -so 1 -fa on" in mixed[1]
    assert not commands(lines, "server-scenario") and not commands(lines, "pyllama_so.bench")


def test_a_failed_stage_fails_the_check_and_the_logs_come_back(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                               machine: Machine) -> None:
    machine(0, None)
    out, work = tmp_path / "out", tmp_path / "work"
    flags = ["--out", str(out), "--work", str(work), "--python", sys.executable]
    assert main([*flags, "--stages", "precision"], {}) == 1  # no model named
    log = capfd.readouterr().out
    assert "precision skipped: --precision-models (GPU_CHECK_PRECISION_MODELS) names no model" in log
    assert "] summary" in log and (out / "logs.tgz").is_file()
    assert main([*flags, "--stages", "precision", "--budget-s", "0"], {}) == 0
    assert "skipping precision: out of time" in capfd.readouterr().out


def test_the_command_takes_its_variables(tmp_path: Path) -> None:
    assert os.access(SCRIPT, os.X_OK)
    env = {**os.environ, "GPU_CHECK_STAGES": "precision", "GPU_CHECK_PRECISION_MODELS": "/m/a.gguf /m/b.gguf",
           "OUT": str(tmp_path / "out"), "GPU_CHECK_WORK": str(tmp_path / "work")}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert f"--rows gpu -m /m/a.gguf -m /m/b.gguf --out {tmp_path}/out/precision" in res.stdout
    assert not (tmp_path / "out").exists()
