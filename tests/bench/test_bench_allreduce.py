"""python -m pyllama_so.bench.allreduce: arguments, the path table and what it does without two GPUs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import pytest

from helpers.cuda_devices import two_cuda_gpus
from pyllama_so.bench import allreduce as ar

two_gpus = two_cuda_gpus()


@pytest.mark.parametrize("text, want", [("512K", 512 << 10), ("2M", 2 << 20), ("2MiB", 2 << 20), ("1024", 1024),
                                        ("0.5M", 512 << 10)])
def test_parse_size(text: str, want: int) -> None:
    assert ar.parse_size(text) == want


@pytest.mark.parametrize("text", ["3", "0", "1K1", "abc", "-4"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        ar.parse_size(text)


def test_sweep_paths_set_only_the_chunk_size() -> None:
    name = "ce_c1024k"
    assert name in ar.SWEEP_PATHS
    params, child_env, counter = ar.PATHS[name]
    assert counter == "ce" and child_env is None
    assert params == dataclasses.replace(ar.PATHS["ce"].params, chunk_bytes=1 << 20)
    assert params.copy_engines is True and params.min_bytes == 1
    # the default copy-engine path leaves the chunk size automatic
    assert ar.PATHS["ce"].params.chunk_bytes is None
    # the NCCL and internal paths switch the copy engines off
    assert ar.PATHS["nccl"].params.copy_engines is False and ar.PATHS["internal"].params.copy_engines is False
    # the low-latency path: the copy engines on, but for no size, and every size up to the limit on it
    ll = ar.PATHS["ll"].params
    assert ll.copy_engines is True and ll.min_bytes > ar.LL_MAX_BYTES_LIMIT
    assert ll.ll_max_bytes == 4 << 20
    # every other path leaves the low-latency limit at its default
    assert all(setup.params.ll_max_bytes is None for name, setup in ar.PATHS.items() if name != "ll")


def test_upstream_paths_run_in_a_child_with_their_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL and the internal pipeline are chosen by upstream's GGML_CUDA_ALLREDUCE, read when a comm context is
    made: they run in a child process that has it; every other path runs here, on its settings alone."""
    assert ar.PATHS["nccl"].child_env == {"GGML_CUDA_ALLREDUCE": "nccl"}
    assert ar.PATHS["internal"].child_env == {"GGML_CUDA_ALLREDUCE": "internal"}
    assert all(setup.child_env is None for name, setup in ar.PATHS.items() if name not in ("nccl", "internal"))
    seen: list[tuple[list[str], dict[str, str]]] = []

    def fake_run(cmd: list[str], env: dict[str, str], **kw: object) -> object:
        seen.append((cmd, env))
        return argparse.Namespace(returncode=0, stdout='{"us": [1.0]}\n', stderr="")

    monkeypatch.delenv("GGML_CUDA_ALLREDUCE", raising=False)
    monkeypatch.setattr(ar.subprocess, "run", fake_run)
    args = argparse.Namespace(sizes=[1 << 20], warmup=0, iters=1, devices=[0, 1])
    assert ar.time_in_child("nccl", {"NCCL_P2P_DISABLE": "1"}, args) == {"us": [1.0]}
    cmd, env = seen[0]
    assert cmd[cmd.index("--worker") + 1] == "nccl"
    assert env["GGML_CUDA_ALLREDUCE"] == "nccl" and env["NCCL_P2P_DISABLE"] == "1"
    assert "GGML_CUDA_ALLREDUCE" not in os.environ  # the child's environment only


@pytest.mark.parametrize("args", [["--devices", "0,0"], ["--devices", "0"], ["--iters", "0"], ["--warmup", "-1"],
                                  ["--worker", "nope"], ["--paths", "ll,nope"], ["--paths", ""]])
def test_bad_arguments_exit_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        ar.main(args)
    assert e.value.code == 2


@pytest.mark.skipif(two_gpus, reason="two CUDA devices present: this is the no-GPU behaviour")
def test_without_two_gpus_says_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing measured is its own exit status (3, which scripts/gpu-check counts as a skip), not success."""
    out = tmp_path / "ar.json"
    assert ar.main(["--ce-sweep", "--json", str(out)]) == ar.EXIT_SKIPPED == 3
    assert capsys.readouterr().out.strip() == "skipped: needs a CUDA build and 2 CUDA devices"
    assert json.loads(out.read_text())["skipped"].startswith("skipped: needs a CUDA build")


def test_help_states_the_skip_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        ar.main(["--help"])
    assert e.value.code == 0
    assert "3 skipped: needs a CUDA build and 2 CUDA devices" in " ".join(capsys.readouterr().out.split())


def test_report_ratios_and_table_with_missing_queued_times(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ratios are ceiling time / time; a queued time the host could not measure (None) stays blank."""
    sizes = [1 << 20, 8 << 20]
    monkeypatch.setattr(ar, "cuda_devices", lambda: [{"name": "CUDA0"}, {"name": "CUDA1"}])
    monkeypatch.setattr(ar, "time_ceiling", lambda *a: {"us": [20.0, 160.0]})
    monkeypatch.setattr(ar, "time_path", lambda path, *a: {"us": [40.0, 200.0], "host_us": [30.0, 90.0],
                                                          "queued_us": [50.0, None], "paths_counted": {}})
    monkeypatch.setattr(ar, "time_in_child", lambda *a: {"error": "no child here"})
    args = argparse.Namespace(sizes=sizes, warmup=0, iters=1, devices=[0, 1], ce_sweep=False,
                              paths=list(ar.ORDER))
    report = ar.run(args)
    ce = report["results"]["ce"]
    assert ce["ratio_to_ceiling"] == [0.5, 0.8]
    assert ce["queued_ratio_to_ceiling"] == [0.4, None]
    assert ce["algbw_gbs"][1] == pytest.approx((8 << 20) / 200e-6 / 1e9)
    ar.print_table(report)
    out = capsys.readouterr().out
    assert "| 8 MiB | ce | 200.0 | 41.9 | 0.80 | 90.0 |  |  |" in out
    assert "| 1 MiB | ce | 40.0 | 26.2 | 0.50 | 30.0 | 50.0 | 0.40 |" in out
    assert "nccl_nop2p: error: no child here" in out


def test_sweep_times_the_ceiling_in_each_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """--ce-sweep: the ceiling again with the chunk size set to each size (and left to its default for the plain
    ceiling); those rows get ratios to the plain ceiling like the paths."""
    seen: list[int | None] = []

    def fake_bench(sizes: list[int], mode: str, *a: object, allreduce: object = None, **kw: object) -> list[float]:
        assert mode == "ceiling"
        chunk = None if allreduce is None else allreduce.chunk_bytes
        seen.append(chunk)
        return [100.0 if chunk is None else 100.0 + (4 << 20) / chunk]

    monkeypatch.delenv("GGML_CUDA_AR_CE_CHUNK_BYTES", raising=False)
    monkeypatch.setattr(ar.allreduce_rig, "allreduce_bench", fake_bench)
    monkeypatch.setattr(ar, "cuda_devices", lambda: [{"name": "CUDA0"}, {"name": "CUDA1"}])
    monkeypatch.setattr(ar, "time_path", lambda path, *a: {"error": "not timed here"})
    monkeypatch.setattr(ar, "time_in_child", lambda *a: {"error": "not timed here"})
    args = argparse.Namespace(sizes=[4 << 20], warmup=0, iters=1, devices=[0, 1], ce_sweep=True,
                              paths=list(ar.ORDER))
    results = ar.run(args)["results"]
    assert seen == [None] + [kib << 10 for kib in ar.CEILING_CHUNKS_KIB]
    assert "GGML_CUDA_AR_CE_CHUNK_BYTES" not in os.environ
    assert results["ceiling_c256k"]["ratio_to_ceiling"] == [pytest.approx(100.0 / 116.0)]
    assert results["ceiling_c2048k"]["ratio_to_ceiling"] == [pytest.approx(100.0 / 102.0)]


@pytest.mark.gpu
@pytest.mark.skipif(not two_gpus, reason="needs a CUDA build and 2 CUDA devices")
def test_gpu_rig_times_the_reductions_and_the_ceiling() -> None:
    """The AllReduce rig (libpyllama-so-allreduce-rig, outside the CUDA backend) times reductions through a fresh
    comm context, every one of them counted on the copy engines when they are forced, and the pinned-copy ceiling."""
    from pyllama_so import allreduce

    sizes, warmup, iters = [1 << 20, 4 << 20], 1, 4
    allreduce.reset_allreduce_stats()
    us, host_us, queued_us = ar.allreduce_rig.allreduce_bench(sizes, "comm", warmup, iters, (0, 1), host_time=True,
                                                              allreduce=ar.PATHS["ce"].params)
    stats = allreduce.allreduce_stats()
    assert len(us) == len(host_us) == len(queued_us) == len(sizes)
    assert all(t > 0 for t in us) and all(t is not None and t > 0 for t in host_us)
    per_size = max(1, warmup) + iters + min(iters, 8)  # warm-up, timed, then queued behind the delay kernel
    assert stats.paths["ce"].calls == per_size * len(sizes) == stats.total_calls
    ceiling = ar.allreduce_rig.allreduce_bench(sizes, "ceiling", warmup, iters, (0, 1))
    assert len(ceiling) == len(sizes) and all(t > 0 for t in ceiling)


@pytest.mark.gpu
@pytest.mark.skipif(not two_gpus, reason="needs a CUDA build and 2 CUDA devices")
def test_gpu_cli_measures_every_path(tmp_path: Path) -> None:
    """python -m pyllama_so.bench.allreduce end to end on a small size: every path timed, none fell back."""
    out = tmp_path / "ar.json"
    assert ar.main(["--sizes", "512K", "--warmup", "1", "--iters", "3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    for path in ("ceiling", "ce", "internal"):
        assert "error" not in results[path] and "warning" not in results[path], (path, results[path])
        assert len(results[path]["us"]) == 1 and results[path]["us"][0] > 0, (path, results[path])
    # a decode's sizes on the low-latency path and the internal pipeline
    assert ar.main(["--sizes", "8K,32K", "--warmup", "1", "--iters", "3", "--paths", "ll,internal",
                    "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"ceiling", "ll", "internal"}
    for path in ("ll", "internal"):
        assert "error" not in results[path] and "warning" not in results[path], (path, results[path])
        assert results[path]["paths_counted"] == {path: 2 * (1 + 3 + 3)}, (path, results[path])
