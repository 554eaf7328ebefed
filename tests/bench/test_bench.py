"""The bench: llama-bench's statistics and formats, combinations, and clear errors."""

from __future__ import annotations

import csv
import io
import json
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_so import _llama, synth
from pyllama_so.bench.__main__ import main, parser


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main([*args, "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_fields_and_statistics(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "32", "-n", "4", "-r", "3", "-o", "json", "-t", "2")
    assert rc == 0
    results = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"]) for r in results] == [(32, 0), (0, 4)]
    for r in results:
        assert len(r["samples_ts"]) == len(r["samples_ns"]) == 3
        assert all(t > 0 for t in r["samples_ts"])
        n = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([1e9 * n / ns for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]))
        assert r["model_filename"] == str(tiny_model)
        assert r["model_n_params"] > 0 and r["model_size"] > 0


def test_comma_lists_make_all_combinations(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "16,32", "-n", "0", "-ub", "8,16", "-b", "32",
                     "-pg", "16,2", "-r", "1", "-o", "jsonl", "-t", "2")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    got = {(r["n_ubatch"], r["n_prompt"], r["n_gen"]) for r in rows}
    assert got == {(ub, p, g) for ub in (8, 16) for p, g in ((16, 0), (32, 0), (16, 2))}


def test_markdown_like_llama_bench(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "16", "-n", "2", "-r", "2", "-ub", "8", "-t", "2")
    assert rc == 0
    lines = out.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["model", "size", "params", "backend"]
    assert "n_ubatch" in header and header[-2:] == ["test", "t/s"]
    assert [c.strip() for c in lines[2].strip("|").split("|")][-2] == "pp16"
    assert "±" in lines[2] and len(lines) == 4


def test_csv_and_depth(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-d", "16", "-r", "1", "-o", "csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))  # quoted fields may hold commas (gpu_info)
    assert len(rows) == 1
    values = rows[0]
    assert values["n_depth"] == "16" and float(values["avg_ts"]) > 0


def test_progress_goes_to_stderr(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"]) == 0
    out = capsys.readouterr()
    assert "bench: 1/1 pp8" in out.err
    assert json.loads(out.out)["n_prompt"] == 8


def test_split_overlap_without_tensor_split_is_nothing_to_run(tiny_model: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every combination skipped (-so 1 with the default -sm layer): an error before any model loads."""
    rc, out, err = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-so", "1")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "bench: error: nothing to run: skipping -so 1 with -sm layer: split_overlap needs split_mode=\"tensor\" "
        "(got split_mode='layer'): the two lanes overlap the AllReduces of tensor split"]


@pytest.mark.parametrize("value, expected", [(None, [False]), ("1", [True]), ("on", [True]), ("0,1", [False, True])])
def test_split_overlap_default_from_environment(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                expected: list[bool]) -> None:
    if value is None:
        monkeypatch.delenv("LLAMA_ARG_SPLIT_OVERLAP", raising=False)
    else:
        monkeypatch.setenv("LLAMA_ARG_SPLIT_OVERLAP", value)
    assert parser().parse_args([]).split_overlap == expected
    assert parser().parse_args(["-so", "0"]).split_overlap == [False]  # the flag wins over the variable


def test_json_without_split_overlap_records_lane_0(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-so 0: every ubatch on lane 0, graph builds from llama.cpp's graph-reuse counter, and host time."""
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "32", "-n", "3", "-ub", "16", "-r", "2", "-o", "jsonl",
                     "-t", "2")
    assert rc == 0
    pp, tg = (json.loads(line) for line in out.splitlines())
    # pp32: warm-up + 2 repetitions of 2 ubatches; tg3: warm-up of 1 token + 2 repetitions of 3
    for r, ubatches in ((pp, 6), (tg, 7)):
        so = r["split_overlap"]
        assert so["requested"] is False and so["enabled"] is False and so["reason"] == "not requested", so
        assert so["ubatches"] == [ubatches, 0] and so["waits"] == [0, 0], so
        assert 1 <= so["graph_builds"][0] <= ubatches and so["graph_builds"][1] == 0, so
        assert isinstance(r["host_ms_per_ubatch"], float) and r["host_ms_per_ubatch"] > 0


def test_csv_writes_objects_as_json(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-o", "csv")
    assert rc == 0
    row = next(csv.DictReader(io.StringIO(out)))
    assert json.loads(row["split_overlap"])["reason"] == "not requested"
    assert json.loads(row["allreduce_calls"]) == {}


@pytest.mark.parametrize("bad", [["-sm", "diagonal"], ["-p", "-3"], ["-fa", "sometimes"], ["-o", "xml"],
                                 ["-ts", "1/x"], ["-r", "0"]])
def test_bad_flags_exit_2(tiny_model: Path, bad: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_model), *bad])
    assert e.value.code == 2


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not found"):
        main(["-m", str(tmp_path / "missing.gguf")])


def test_env_defaults(tiny_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_MODEL", str(tiny_model))
    monkeypatch.setenv("LLAMA_ARG_UBATCH", "8")
    rc, out, _ = run(capsys, "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl")
    assert rc == 0
    row = json.loads(out)
    assert row["n_ubatch"] == 8 and row["model_filename"] == str(tiny_model)


def test_default_synthetic_model_is_cached(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path))
    written = []
    for _ in range(2):
        rc, out, _ = run(capsys, "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl")
        assert rc == 0
        files = list((tmp_path / "models").iterdir())
        assert [f.name for f in files] == [f"tiny-f16-v{synth.CACHE_VERSION}.gguf"]
        st = files[0].stat()
        written.append((st.st_ino, st.st_mtime_ns))
    assert written[0] == written[1]  # the second run reused the file instead of writing it again


def bench_process(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyllama_so.bench", *args], capture_output=True, text=True,
                          timeout=120, **kw)  # type: ignore[call-overload]


def test_model_directory_says_directory(tmp_path: Path) -> None:
    res = bench_process("-m", str(tmp_path))
    assert res.returncode == 1
    assert res.stderr.splitlines() == [f"bench: {tmp_path} is a directory, not a model file"]


def test_ctrl_c_is_one_line_and_status_130(tiny_model: Path) -> None:
    # SIGINT as the default in the child: a shell without job control starts background jobs with it ignored
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_so.bench", "-m", str(tiny_model), "-p", "64", "-n", "0",
                             "-r", "1000000", "--no-warmup", "-t", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("bench: 1/1 pp64: rep 1/"), first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert err.splitlines() == ["bench: interrupted"]
    assert out == ""  # no result was complete


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_repetitions_state_one_rule(tiny_model: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_model), "-r", value])
    assert e.value.code == 2
    assert "argument -r/--repetitions: expected an integer >= 1, got" in capsys.readouterr().err


def test_model_column_names_the_synthetic_shape(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp guesses a size class from the layer count ("qwen3 8B F16" for the 36-layer overhead
    shape): a synthetic model shows its general.name and weight type instead."""
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl")
    assert rc == 0
    assert json.loads(out)["model_type"] == "synthetic qwen3 tiny F16"
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1")
    assert rc == 0
    assert out.splitlines()[2].startswith("| synthetic qwen3 tiny F16 | ")


def test_model_column_of_other_models_is_llama_cpp_s(tiny_model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    meta = synth.metadata

    def renamed(*args: object) -> dict[str, object]:
        return {**meta(*args), "general.name": "Qwen3 8B"}  # type: ignore[arg-type]

    monkeypatch.setattr(synth, "metadata", renamed)
    path = synth.write_model(tmp_path / "named.gguf", "tiny", "q8_0", quiet=True)
    rc, out, _ = run(capsys, "-m", str(path), "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl")
    assert rc == 0
    assert json.loads(out)["model_type"] == "qwen3 ?B Q8_0"


@pytest.mark.parametrize("flags", [["-b", "8", "-ub", "16"], ["-b", "32,8", "-ub", "16"]])
def test_batch_combinations_checked_before_running(tiny_model: Path, flags: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """As Llama: n_ubatch > n_batch is an error, reported before any combination runs."""
    rc, out, err = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl", *flags)
    assert rc == 2
    assert out == ""
    assert err.splitlines() == ["bench: error: -b 8 -ub 16: n_ubatch (16) must not exceed n_batch (8)"]


def test_tensor_split_longer_than_devices(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = max(1, _llama.gpu_device_count()) + 1
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_model), "-ts", "/".join(["1"] * n)])
    assert e.value.code == 2
    assert f"tensor_split has {n} entries" in capsys.readouterr().err


@pytest.fixture
def context_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The bench's contexts record their runs: ("prompt", n_tokens), ("gen", n_tokens), ("clear", 0)."""
    calls: list[tuple[str, int]] = []

    class Recording(_llama.Context):  # type: ignore[misc]
        def run_prompt(self, n_prompt: int) -> int:
            calls.append(("prompt", n_prompt))
            return int(super().run_prompt(n_prompt))

        def run_gen(self, n_gen: int) -> int:
            calls.append(("gen", n_gen))
            return int(super().run_gen(n_gen))

        def clear(self, data: bool = False) -> None:
            calls.append(("clear", 0))
            super().clear(data)

    monkeypatch.setattr(_llama, "Context", Recording)
    return calls


@pytest.mark.parametrize("flags, n", [([], 1), (["--no-warmup"], 0), (["--warmup-runs", "0"], 0),
                                      (["--no-warmup", "--warmup-runs", "0"], 0), (["--warmup-runs", "1"], 1),
                                      (["--warmup-runs", "2"], 2), (["--warmup-runs", "3"], 3)])
def test_warmup_runs_as_asked(tiny_model: Path, capsys: pytest.CaptureFixture[str],
                              context_calls: list[tuple[str, int]], flags: list[str], n: int) -> None:
    """The first warm-up run is llama-bench's (the prompt, one generated token, on the fresh context);
    each further one is an untimed repetition (clear, fill to the depth, the prompt, one token)."""
    rc, out, _ = run(capsys, "-m", str(tiny_model), "-p", "8", "-n", "2", "-d", "4", "-r", "2", "-o", "jsonl",
                     "-t", "2", *flags)
    assert rc == 0
    pp, tg = (json.loads(line) for line in out.splitlines())

    def expected(run: tuple[str, int], timed: tuple[str, int]) -> list[tuple[str, int]]:
        warmup = [run] + [("clear", 0), ("prompt", 4), run] * (n - 1) if n else []
        return warmup + [("clear", 0), ("prompt", 4), timed] * 2

    want_pp, want_tg = expected(("prompt", 8), ("prompt", 8)), expected(("gen", 1), ("gen", 2))
    assert context_calls == want_pp + want_tg
    for r, calls in ((pp, want_pp), (tg, want_tg)):
        assert r["warmup_runs"] == n
        assert len(r["samples_ns"]) == 2  # warm-up runs are not timed
        # every ubatch of the context, warm-up included: one per prompt run (-ub 512), one per generated token
        ubatches = sum(1 if kind == "prompt" else count for kind, count in calls if kind != "clear")
        assert r["split_overlap"]["ubatches"] == [ubatches, 0]


def test_warmup_runs_recorded_in_json_csv_not_markdown(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["-m", str(tiny_model), "-p", "8", "-n", "0", "-r", "1", "-t", "2", "--warmup-runs", "2"]
    rc, out, _ = run(capsys, *common, "-o", "json")
    assert rc == 0 and [r["warmup_runs"] for r in json.loads(out)] == [2]
    rc, out, _ = run(capsys, *common, "-o", "jsonl")
    assert rc == 0 and json.loads(out)["warmup_runs"] == 2
    rc, out, _ = run(capsys, *common, "-o", "csv")
    assert rc == 0 and next(csv.DictReader(io.StringIO(out)))["warmup_runs"] == "2"
    rc, out, _ = run(capsys, *common)  # markdown: llama-bench's columns, nothing added
    assert rc == 0 and "warmup" not in out and len(out.splitlines()) == 3


@pytest.mark.parametrize("value", ["-1", "x", "1.5", ""])
def test_warmup_runs_bad_value_is_one_error(tiny_model: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-m", str(tiny_model), f"--warmup-runs={value}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "error" in line] == [err[-1]]  # argparse's usage, then one error line
    assert err[-1].startswith("python -m pyllama_so.bench: error: argument --warmup-runs: "
                              "expected an integer >= 0, got")


def test_no_warmup_with_warmup_runs_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Reported before anything runs, even before the default synthetic model is written."""
    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path))
    monkeypatch.delenv("LLAMA_ARG_MODEL", raising=False)
    rc, out, err = run(capsys, "--synthetic", "tiny", "--no-warmup", "--warmup-runs", "2")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "bench: error: --no-warmup conflicts with --warmup-runs 2 (--no-warmup is --warmup-runs 0)"]
    assert not (tmp_path / "models").exists()
