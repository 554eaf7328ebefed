"""scripts/server-scenario (the server with -so 0 against -so 1: a prompt, its continuation from the cache,
two prompts together, a long prompt) on CPU virtual devices with the tiny model and tiny sizes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS

SCRIPT = SCRIPTS / "server-scenario"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=dict(os.environ, GGML_CPU_VIRTUAL_DEVICES="2"),
                          capture_output=True, text=True, timeout=timeout)


def test_split_overlap_serves_the_same_completions(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "scenario.json"
    # -ub 64: split overlap alternates lanes only for ubatches of 64 tokens or more
    res = run("-m", str(tiny_model), "--prompt", "200", "--continuation", "64", "--pair", "100", "--long", "300",
              "-b", "128", "-ub", "64", "-t", "2", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[:2] == ["| step | -so 0 prefill t/s | -so 1 prefill t/s | -so 1 / -so 0 |", "|---|---:|---:|---:|"]
    assert [line.split(" | ")[0] for line in lines[2:6]] == [
        "| 200-token prompt", "| continuation, 64 tokens", "| two 100-token prompts together", "| 300-token prompt"]
    assert "completions: identical" in res.stdout
    if shutil.which("nvidia-smi") is None:
        assert res.stdout.count("no VRAM data") == 2

    report = json.loads(out.read_text())
    so0, so1 = report["modes"]
    assert report["identical"] and not report["differ"]
    for step in ("prompt", "continuation", "pair", "long"):
        got = [[(o["text"], o["usage"]["completion_tokens"]) for o in m["steps"][step]["outputs"]] for m in (so0, so1)]
        assert got[0] == got[1], step
        assert all(m["steps"][step]["tps"] > 0 for m in (so0, so1))
    assert len(so0["steps"]["pair"]["outputs"]) == 2
    for mode in (so0, so1):
        assert mode["n_ctx_slot"] == 512  # 300 + 16 rounded up to 256, with -c 1024 for two slots
        first, = mode["steps"]["prompt"]["outputs"]
        assert first["timings"]["prompt_n"] == 200 and first["timings"]["cache_n"] == 0
        cont, = mode["steps"]["continuation"]["outputs"]  # evaluated from the slot's cache
        assert cont["usage"]["prompt_tokens"] == 264
        assert cont["usage"]["prompt_tokens_details"]["cached_tokens"] == cont["timings"]["cache_n"] >= 200
        assert cont["timings"]["prompt_n"] == 264 - cont["timings"]["cache_n"]
        assert mode["steps"]["long"]["outputs"][0]["timings"]["prompt_n"] == 300
    assert not so0["split_overlap"]["enabled"] and so1["split_overlap"]["enabled"]
    assert min(so1["split_overlap"]["ubatches"]) > 0  # both lanes ran


def test_a_server_that_does_not_start_is_exit_2(tmp_path: Path) -> None:
    res = run("-m", str(tmp_path / "missing.gguf"), "--prompt", "8", "--continuation", "8", "--pair", "8",
              "--long", "0")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "-so 0: the server did not start" in res.stderr and "model file not found" in res.stderr


@pytest.mark.parametrize("bad", [["--pair", "-5"], ["--prompt", "0"], ["--long", "many"], ["-np", "1"],
                                 ["-b", "64", "-ub", "128"]])
def test_bad_arguments_are_usage_errors(bad: list[str]) -> None:
    res = run("-m", "model.gguf", *bad, timeout=60)
    assert res.returncode == 2 and "usage:" in res.stderr, res.stderr
