"""scripts/server-load (streamed /v1/completions load: tok/s, TTFT, inter-token latency; the mixed scenario of
generating streams and long prompts) against our server with the tiny model, and against upstream's
llama-server when it was built (-DPYLLAMA_SO_UPSTREAM_SERVER=ON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import SCRIPTS
from pyllama_so.server.settings import FINGERPRINT
from server_load import (  # scripts/server_load.py (tests/conftest.py puts scripts/ on the path)
    Outcome,
    Prompts,
    find_llama_server,
    full_decode_rate,
    parse_args,
    percentile,
    request_body,
)

SCRIPT = SCRIPTS / "server-load"
# 3 slots of 512 tokens: the mixed scenario's two streams and a long prompt
SERVER_FLAGS = ["-c", "1536", "-np", "3", "-b", "256", "-ub", "64", "-t", "2"]
LOAD_FIELDS = {"server", "scenario", "concurrency", "requests", "ok", "errors", "error_samples", "prompt_tokens",
               "gen_tokens", "output_tokens", "duration_s", "output_tps", "ttft_ms", "itl_ms", "tpot_ms",
               "full_decode_tps", "full_decode_s", "full_decode_chunks"}
MIXED_FIELDS = {"server", "scenario", "concurrency", "long_prompts", "prompt_tps", "itl_ms_alone", "itl_ms_mixed",
                "stream_requests", "errors", "error_samples"}


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def check_load_run(r: dict[str, Any], concurrency: int, requests: int, prompt: int, gen: int) -> None:
    assert LOAD_FIELDS <= r.keys()
    assert (r["concurrency"], r["requests"], r["ok"], r["errors"]) == (concurrency, requests, requests, 0), r
    assert (r["prompt_tokens"], r["gen_tokens"]) == (prompt, gen)
    assert r["output_tokens"] == requests * gen  # ignore_eos: every request generated all its tokens
    assert r["output_tps"] > 0 and r["duration_s"] > 0
    assert r["ttft_ms"]["n"] == requests and 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p90"]
    # a gap between text chunks per token after the first, fewer where a chunk holds several (UTF-8 pieces)
    assert 0 < r["itl_ms"]["n"] <= requests * (gen - 1)
    assert 0 < r["itl_ms"]["p50"] <= r["itl_ms"]["p90"]
    assert r["sample_body"]["ignore_eos"] is True and r["sample_body"]["max_tokens"] == gen
    if concurrency == 1:  # one stream at a time: every request's decoding counts
        assert r["full_decode_tps"] > 0 and 0 < r["full_decode_s"] < r["duration_s"]
        assert 0 < r["full_decode_chunks"] <= requests * (gen - 1)


def test_load_and_mixed_against_our_server(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    res = run("--server", "ours", "-m", str(tiny_model), "--scenario", "load,mixed", "--concurrency", "1,2",
              "--requests", "3", "--prompt", "24", "--gen", "12", "--long", "300,200", "--alone", "4",
              "--json", str(out), "--", *SERVER_FLAGS)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == ("| server | C | requests | errors | output tok/s | decode tok/s, all C | TTFT p50 ms "
                        "| TTFT p90 ms | ITL p50 ms | ITL p90 ms | host ms/step | issue / stream / wait ms |")
    assert [line.split(" | ")[:4] for line in lines[2:4]] == [["| ours", "1", "3", "0"], ["| ours", "2", "3", "0"]]
    assert lines[5].startswith("| server | C | long prompts | prompt t/s |")
    assert [line.split(" | ")[:3] for line in lines[7:9]] == [["| ours", "1", "300,200"], ["| ours", "2", "300,200"]]

    report = json.loads(out.read_text())
    assert {"date", "commit", "hardware", "args", "servers", "runs"} <= report.keys()
    server, = report["servers"]
    assert server["name"] == "ours" and server["command"][1:3] == ["-m", "pyllama_so.server"]
    # the build from /props' build_info, as for llama-server
    assert server["info"] == {"n_vocab": 512, "n_slots": 3, "n_ctx_slot": 512, "build": FINGERPRINT}
    assert [(r["scenario"], r["concurrency"]) for r in report["runs"]] == [
        ("load", 1), ("mixed", 1), ("load", 2), ("mixed", 2)]
    for r in report["runs"]:
        # our engine's steps of the run, from /engine: at least one per generated token of a stream
        steps = r["engine_steps"]
        assert steps["steps"] >= 12 and steps["host_ms_mean"] > 0
        # a step's phases (the devices are the CPU here: llama_decode computes before it returns)
        assert steps["issue_ms_mean"] > 0 and steps["wait_ms_mean"] > 0 and steps["stream_ms_mean"] >= 0
        if r["scenario"] == "load":
            check_load_run(r, r["concurrency"], 3, 24, 12)
            continue
        assert MIXED_FIELDS <= r.keys() and r["errors"] == 0, r
        # each long prompt evaluated whole (no prefix of it in any slot), at the server's own count
        assert ([(p["tokens"], p["prompt_n"], p["ok"]) for p in r["long_prompts"]]
                == [(300, 300, True), (200, 200, True)])
        assert all(p["prompt_tps"] > 0 and p["latency_ms"] >= p["prompt_ms"] for p in r["long_prompts"])
        total_ms = sum(p["prompt_ms"] for p in r["long_prompts"])
        assert r["prompt_tps"] == pytest.approx(500 / total_ms * 1e3, rel=1e-3)
        assert r["itl_ms_alone"]["n"] > 0 and r["itl_ms_mixed"]["n"] > 0
        assert r["stream_requests"] >= r["concurrency"]


def test_a_mixed_scenario_the_slots_cannot_hold_fails_before_any_run(tiny_model: Path) -> None:
    """3 slots hold 2 streams and a long prompt, not 3: --concurrency 1,3 stops before it measures C=1."""
    res = run("--server", "ours", "-m", str(tiny_model), "--scenario", "load,mixed", "--concurrency", "1,3",
              "--requests", "2", "--prompt", "24", "--gen", "4", "--long", "200", "--", *SERVER_FLAGS)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "3 slots: 3 streams and a long prompt need 4" in res.stderr
    assert " done" not in res.stderr, res.stderr


def test_prompts_differ_from_the_first_token_unless_a_prefix_is_shared() -> None:
    p = Prompts(512, 0, seed=3)
    prompts = [p.make(16) for _ in range(100)]
    assert all(len(x) == 16 and all(0 < t < 512 for t in x) for x in prompts)
    assert len({x[0] for x in prompts}) == 100
    again = Prompts(512, 0, seed=3)
    assert [again.make(16) for _ in range(100)] == prompts  # every server gets the same prompts
    shared = Prompts(512, 5, seed=3)
    prompts = [shared.make(16) for _ in range(50)]
    assert len({tuple(x[:5]) for x in prompts}) == 1 and len({x[5] for x in prompts}) == 50


def test_the_decode_rate_counts_only_times_when_every_stream_generates() -> None:
    def outcome(chunks: list[float], tokens: int) -> Any:
        return Outcome(sent=0.0, prompt_tokens=4, chunks=chunks, output_tokens=tokens)

    # two streams generate together from 2.5 s (the second's first text) to 5 s (the first's last)
    a, b = outcome([0, 1, 2, 3, 4, 5], 6), outcome([2.5, 3, 3.5, 4, 7], 5)
    assert full_decode_rate([a, b], 2) == {"full_decode_tps": 2.4, "full_decode_s": 2.5, "full_decode_chunks": 6}
    # pieces of two tokens each count twice
    a2, b2 = outcome(a.chunks, 12), outcome(b.chunks, 10)
    assert full_decode_rate([a2, b2], 2)["full_decode_tps"] == 4.8
    # one stream at a time: each one's span, its first chunk excluded
    assert full_decode_rate([a], 1) == {"full_decode_tps": 1.0, "full_decode_s": 5.0, "full_decode_chunks": 5}
    # never three at once: no rate
    assert full_decode_rate([a, b], 3) == {"full_decode_tps": None, "full_decode_s": 0, "full_decode_chunks": 0}


def test_percentiles_and_the_request_body() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5 and percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 4.6
    args = parse_args(["-m", "x.gguf", "--seed", "7", "--field", "repeat_penalty=1.1", "--", "-np", "2"])
    assert args.server_flags == ["-np", "2"]
    body = request_body(args, [5, 6], 9, 3)
    assert body == {"prompt": [5, 6], "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "ignore_eos": True, "seed": 10,
                    "repeat_penalty": 1.1}
    greedy = request_body(parse_args(["-m", "x.gguf", "--greedy", "--no-ignore-eos"]), [5], 1, 0)
    assert greedy == {"prompt": [5], "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True},
                      "temperature": 0.0}


@pytest.mark.parametrize("bad", [["--scenario", "soak"], ["--server", "theirs"], ["--concurrency", "0"],
                                 ["--prompt", "8", "--shared-prefix", "8"], ["--field", "top_k"],
                                 ["--server", "upstream", "--server-bin", "/nonexistent/llama-server"], []])
def test_bad_arguments_are_usage_errors(bad: list[str]) -> None:
    res = run(*(bad if bad == [] else ["-m", "x.gguf", *bad]), timeout=60)
    assert res.returncode == 2 and "usage:" in res.stderr, res.stderr


def test_an_unreachable_url_is_exit_2(tmp_path: Path) -> None:
    res = run("--url", "http://127.0.0.1:9", "--timeout", "5", "--json", str(tmp_path / "r.json"), timeout=60)
    assert res.returncode == 2 and "server-load: url:" in res.stderr, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["runs"] == []


def llama_server() -> Path | None:
    given = os.environ.get("PYLLAMA_SO_LLAMA_SERVER")
    return Path(given) if given else find_llama_server()


def test_upstream_llama_server_side_by_side(tiny_model: Path, tmp_path: Path) -> None:
    """Both servers in one call, with the same model and flags; the same request counts from each."""
    binary = llama_server()
    if binary is None:
        pytest.skip("llama-server not built (-DPYLLAMA_SO_UPSTREAM_SERVER=ON; or PYLLAMA_SO_LLAMA_SERVER=PATH)")
    out = tmp_path / "both.json"
    res = run("--server", "ours,upstream", "--server-bin", str(binary), "-m", str(tiny_model), "--concurrency", "2",
              "--requests", "4", "--prompt", "24", "--gen", "12", "--json", str(out), "--", *SERVER_FLAGS)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert [s["name"] for s in report["servers"]] == ["ours", "upstream"]
    assert report["servers"][1]["command"][0] == str(binary)
    assert report["servers"][1]["info"]["n_vocab"] == 512 and report["servers"][1]["info"]["n_slots"] == 3
    assert [r["server"] for r in report["runs"]] == ["ours", "upstream"]
    for r in report["runs"]:
        check_load_run(r, 2, 4, 24, 12)
    assert [line.split(" | ")[0] for line in res.stdout.splitlines()[2:4]] == ["| ours", "| upstream"]
