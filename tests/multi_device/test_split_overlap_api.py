"""Split overlap from Python: Llama(split_overlap=True), its stats and warnings, and the bench's -so.

The lanes themselves (every architecture, race fixtures, the reasons they stay off) are tested in
test_split_overlap.py; this module checks what the Python front does with them, on the tiny model
over two CPU virtual devices.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from pyllama_so import Llama, archs
from pyllama_so.bench.__main__ import main as bench

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

N_UBATCH = 64  # the smallest ubatch that takes a lane (LLAMA_SPLIT_OVERLAP_MIN_TOKENS)

Bench = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def split() -> list[float]:
    """A tensor split over CPUV0 and CPUV1 only. The virtual devices are made as test_archs makes them
    (three), so that the order of the two modules does not matter; llama.cpp splits over every device
    that is not the CPU, GPUs first, so the others get 0."""
    archs.ensure_virtual_devices()
    return [float(d["name"] in ("CPUV0", "CPUV1")) for d in pyllama_so.devices() if d["type"] in ("gpu", "igpu")]


def tensor_llama(model: Path, split: list[float], **kw: object) -> Llama:
    # tensor split needs flash attention; one llama_decode call takes the whole prompt
    return Llama(model, split_mode="tensor", tensor_split=split, flash_attn=True, n_ctx=512, n_batch=512,
                 n_ubatch=N_UBATCH, n_threads=2, **kw)  # type: ignore[arg-type]


def test_logits_bitwise_identical_to_plain_tensor_split(tiny_model: Path, split: list[float]) -> None:
    """A prompt of four full ubatches and a short one, then single tokens: every logit equals plain
    tensor split's bit for bit, and the full ubatches alternated between the lanes."""
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 512, 4 * N_UBATCH + 19).tolist()
    steps = rng.integers(0, 512, 3).tolist()

    def run(split_overlap: bool) -> tuple[np.ndarray, dict[str, object]]:
        with tensor_llama(tiny_model, split, split_overlap=split_overlap) as llm:
            rows = [llm.eval(prompt)] + [llm.eval([t]) for t in steps]
            return np.concatenate(rows), llm.split_overlap_stats()

    plain, off = run(False)
    lanes, on = run(True)
    assert off["enabled"] is False and off["reason"] == "not requested"
    assert on["enabled"] is True and on["reason"] == "on", on
    # lane 0: full ubatches 1 and 3, the 19 tokens, the 3 single tokens; lane 1: full ubatches 2 and 4
    assert on["ubatches"] == [6, 2], on
    assert all(w > 0 for w in on["waits"]), on  # each lane waited for the other's KV writes
    assert lanes.shape == plain.shape == (len(prompt) + len(steps), 512)
    assert np.isfinite(plain).all()
    assert np.array_equal(lanes, plain), f"{int((lanes != plain).any(axis=1).sum())} tokens' logits differ"


def test_lanes_off_is_one_warning_with_the_reason(tiny_model: Path, split: list[float]) -> None:
    """Not every layer on the split devices: llama.cpp keeps the lanes off, and Llama says why."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tensor_llama(tiny_model, split, split_overlap=True, n_gpu_layers=1) as llm:
            stats = llm.split_overlap_stats()
    said = [w for w in caught if issubclass(w.category, UserWarning)]
    assert [str(w.message) for w in said] == [
        "split_overlap stays off: not every layer is on the split devices (n_gpu_layers)"]
    assert said[0].filename == __file__  # points at the caller
    assert stats["enabled"] is False and stats["ubatches"] == [0, 0]


def test_no_warning_when_the_lanes_run(tiny_model: Path, split: list[float]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tensor_llama(tiny_model, split, split_overlap=True) as llm:
            assert llm.split_overlap_stats()["enabled"]


@pytest.fixture
def run_bench(capsys: pytest.CaptureFixture[str], split: list[float]) -> Bench:
    """The bench in this process, over CPUV0 and CPUV1, ubatches of 64 and 2 repetitions: (status, stdout, stderr)."""
    ts = "/".join(f"{v:g}" for v in split)

    def run(*args: str) -> tuple[int, str, str]:
        rc = bench(["--no-progress", "-fa", "1", "-t", "2", "-ub", str(N_UBATCH), "-r", "2", "-ts", ts, *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def test_bench_skips_split_overlap_without_tensor_split(tiny_model: Path, run_bench: Bench) -> None:
    """-sm layer,tensor -so 0,1: three combinations run, the fourth (layer with lanes) is one note."""
    rc, out, err = run_bench("-m", str(tiny_model), "-sm", "layer,tensor", "-so", "0,1", "-p", "128",
                             "-n", "0", "-o", "jsonl")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["split_mode"], r["split_overlap"]["requested"]) for r in rows] == [
        ("layer", False), ("tensor", False), ("tensor", True)]
    assert err.splitlines() == ["bench: note: skipping -so 1 with -sm layer: split_overlap needs split_mode=\"tensor\" "
                                "(got split_mode='layer'): the two lanes overlap the AllReduces of tensor split"]


def test_bench_json_records_lanes_and_host_time(tiny_model: Path, run_bench: Bench) -> None:
    rc, out, err = run_bench("-m", str(tiny_model), "-sm", "tensor", "-so", "0,1", "-p", "128", "-n", "0",
                             "-o", "json")
    assert rc == 0, err
    plain, lanes = json.loads(out)
    # warm-up and two repetitions of two 64-token ubatches
    assert plain["split_overlap"]["requested"] is False and plain["split_overlap"]["enabled"] is False
    assert plain["split_overlap"]["reason"] == "not requested"
    assert plain["split_overlap"]["ubatches"] == [6, 0] and plain["split_overlap"]["waits"] == [0, 0]
    builds = plain["split_overlap"]["graph_builds"]  # llama.cpp's count: ubatches whose graph was not reused
    assert 1 <= builds[0] <= 6 and builds[1] == 0, builds
    so = lanes["split_overlap"]
    assert so["requested"] is True and so["enabled"] is True and so["reason"] == "on", so
    assert so["ubatches"] == [3, 3], so
    assert all(b >= 1 for b in so["graph_builds"]) and all(w > 0 for w in so["waits"]), so
    for r in (plain, lanes):
        assert isinstance(r["host_ms_per_ubatch"], float) and r["host_ms_per_ubatch"] > 0, r


def test_bench_markdown_has_the_so_column(tiny_model: Path, run_bench: Bench) -> None:
    rc, out, _ = run_bench("-m", str(tiny_model), "-sm", "tensor", "-so", "0,1", "-p", "64", "-n", "0")
    assert rc == 0
    table = [[c.strip() for c in line.strip("|").split("|")] for line in out.strip().splitlines()]
    so = table[0].index("so")
    assert [row[so] for row in table[2:]] == ["0", "1"]


def test_bench_split_overlap_from_the_environment(tiny_model: Path, run_bench: Bench,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """LLAMA_ARG_SPLIT_OVERLAP=1 makes -so 1 the default; -so on the command line still wins."""
    monkeypatch.setenv("LLAMA_ARG_SPLIT_OVERLAP", "1")
    for flags, on in (([], True), (["-so", "0"], False)):
        rc, out, err = run_bench("-m", str(tiny_model), "-sm", "tensor", "-p", "128", "-n", "0",
                                 "-o", "jsonl", *flags)
        assert rc == 0, err
        so = json.loads(out)["split_overlap"]
        assert so["requested"] is on and so["enabled"] is on, so


def test_default_lane_ubatch_is_half_the_batch(tiny_model: Path, split: list[float]) -> None:
    """Without n_ubatch, split overlap cuts each batch in two (one ubatch per lane); without lanes it is 512."""
    base = dict(split_mode="tensor", tensor_split=split, flash_attn=True, n_ctx=512, n_threads=2)
    with Llama(tiny_model, n_batch=256, split_overlap=True, **base) as llm:  # type: ignore[arg-type]
        assert llm.context.n_ubatch == 128
        llm.eval(list(range(1, 257)))
        assert llm.split_overlap_stats()["ubatches"] == [1, 1]
    with Llama(tiny_model, n_batch=1024, **base) as llm:  # type: ignore[arg-type]
        assert llm.context.n_ubatch == 512
    with Llama(tiny_model, n_batch=256, n_ubatch=64, split_overlap=True, **base) as llm:  # type: ignore[arg-type]
        assert llm.context.n_ubatch == 64  # a given n_ubatch wins


def test_bench_default_ubatch_per_row(tiny_model: Path, split: list[float], capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench without -ub: 512 (capped at -b) for -so 0 rows, half of -b for -so 1 rows; -ub and
    LLAMA_ARG_UBATCH win."""
    ts = "/".join(f"{v:g}" for v in split)
    common = ["--no-progress", "-fa", "1", "-t", "2", "-r", "1", "-ts", ts, "-m", str(tiny_model), "-sm", "tensor",
              "-p", "256", "-n", "0", "-o", "jsonl"]

    def ubatches(*flags: str) -> list[tuple[bool, int]]:
        assert bench([*common, *flags]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        return [(r["split_overlap"]["requested"], r["n_ubatch"]) for r in rows]

    assert ubatches("-b", "256", "-so", "0,1") == [(False, 256), (True, 128)]
    assert ubatches("-b", "2048", "-so", "0,1") == [(False, 512), (True, 1024)]
    assert ubatches("-b", "256", "-ub", "64", "-so", "0,1") == [(False, 64), (True, 64)]
    monkeypatch.setenv("LLAMA_ARG_UBATCH", "64")
    assert ubatches("-b", "256", "-so", "1") == [(True, 64)]


def test_default_n_ubatch_rule() -> None:
    from pyllama_so import _llama
    assert _llama.default_n_ubatch(2048, False) == 512 and _llama.default_n_ubatch(256, False) == 256
    assert _llama.default_n_ubatch(2048, True) == 1024 and _llama.default_n_ubatch(100, True) == 64
    assert _llama.default_n_ubatch(32, True) == 32  # never above n_batch


def test_backend_sampling_stays_on_the_cpu_under_tensor_split(tiny_model: Path, split: list[float]) -> None:
    """llama.cpp keeps backend samplers off under split_mode="tensor" (and so off the lanes): the chain
    stays on the CPU and the greedy and seeded tokens equal those without backend sampling."""
    prompt = np.random.default_rng(3).integers(0, 512, 2 * N_UBATCH + 5).tolist()
    with tensor_llama(tiny_model, split, split_overlap=True) as plain, \
            tensor_llama(tiny_model, split, split_overlap=True, backend_sampling=True) as backend:
        for kw in (dict(temperature=0), dict(temperature=1.0, seed=8)):
            want = list(plain.generate(prompt, max_tokens=8, stop_on_eog=False, **kw))
            assert list(backend.generate(prompt, max_tokens=8, stop_on_eog=False, **kw)) == want
        sampler = backend.sampler(temperature=0)
        assert not backend.context.set_backend_sampler(0, sampler)
        assert not sampler.on_backend
        assert backend.split_overlap_stats()["ubatches"][1] > 0  # the lanes ran
