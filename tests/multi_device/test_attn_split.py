"""Attention split (attn_split, -as) on CPU virtual devices: Meta with the attention heads split apart from the
tensor split equals the CPU, split overlap stays bitwise the same, the KV cache per device follows the
attention split, bad values are clear errors, and the bench takes -as with a column of its own."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.split_devices import copy_engine_routing, cuda_device_pair, same_bits, virtual_devices
from pyllama_so import Llama, _llama, args, testing
from pyllama_so.archs import nmse
from pyllama_so.bench.__main__ import main as bench_main, parser as bench_parser

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

N_UBATCH = 64  # the smallest ubatch that takes a split-overlap lane of its own
N_CTX = 256
# plain attention (llama), SWA + QK norms (gemma3), hybrid linear attention with a gated Q (qwen3next, MoE
# only), recurrent shortconv + attention (lfm2)
ARCHS = ("llama", "gemma3", "qwen3next", "lfm2")
SPLITS = ((1.0, 3.0), (1.0, 0.0), (0.0, 1.0))

_TOKENS = [int(t) for t in np.random.default_rng(11).integers(1, 127, 200)]


def _moe(arch: str) -> bool:
    return testing.arch_flags(arch)["moe_mandatory"]  # qwen3next has no dense variant


def _sequence(ctx: _llama.Context) -> np.ndarray:
    """A prompt over several ubatches (64+64+2), single tokens, then more prompt."""
    out = [ctx.decode(_TOKENS[:130], all_logits=True)]
    out += [ctx.decode([t], all_logits=True) for t in _TOKENS[130:133]]
    out.append(ctx.decode(_TOKENS[133:200], all_logits=True))
    return np.concatenate(out)


def _run(arch: str, devices: list[int], split_mode: str, attn_split=None, split_overlap: bool = False
         ) -> tuple[np.ndarray, dict, list[int]]:
    model = testing.arch_model(arch, _moe(arch), devices, split_mode, attn_split=attn_split)
    ctx = _llama.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_UBATCH, split_overlap=split_overlap,
                         n_threads=1)
    try:
        return _sequence(ctx), ctx.split_overlap_stats(), testing.kv_cell_bytes(ctx)
    finally:
        ctx.free()
        model.free()


_CPU: dict[str, tuple[np.ndarray, int]] = {}


def _cpu(arch: str) -> np.ndarray:
    """The CPU's logits of the sequence (cached per architecture)."""
    if arch not in _CPU:
        logits, _, cells = _run(arch, [], "none")
        _CPU[arch] = (logits, cells[0])
    return _CPU[arch][0]


def _kv_total(arch: str) -> int:
    """Bytes of one KV cell of the whole model (the CPU's, unsplit)."""
    _cpu(arch)
    return _CPU[arch][1]


def _check_kv(cells: list[int], split: tuple[float, float], total: int) -> None:
    assert len(cells) == 2 and sum(cells) == total, (cells, total)  # every KV row on exactly one device
    if split == (1.0, 0.0):
        assert cells == [total, 0]
    elif split == (0.0, 1.0):
        assert cells == [0, total]
    else:
        assert cells[0] < cells[1], cells


# --- Meta with attn_split equals the CPU; split overlap stays bitwise the same ---------------------------

@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "as-" + "-".join(str(int(v)) for v in s))
@pytest.mark.parametrize("arch", ARCHS)
def test_attn_split_equals_cpu(arch: str, split: tuple[float, float]) -> None:
    devices = virtual_devices(2)
    cpu, total = _cpu(arch), _kv_total(arch)
    meta, off, cells = _run(arch, devices, "tensor", list(split))
    assert not off["enabled"]
    assert nmse(cpu, meta) < 1e-4, nmse(cpu, meta)
    _check_kv(cells, split, total)
    lanes, stats, cells_so = _run(arch, devices, "tensor", list(split), split_overlap=True)
    assert stats["enabled"] and stats["ubatches"][1] >= 1, stats
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"
    assert cells_so == cells


def test_default_follows_tensor_split() -> None:
    """Without attn_split the heads follow tensor_split (even here); with it, they do not."""
    devices = virtual_devices(2)
    even = _run("llama", devices, "tensor")[2]
    assert even[0] == even[1]
    by_attn = _run("llama", devices, "tensor", [1, 3])[2]
    assert by_attn != even and sum(by_attn) == sum(even)


# --- the KV cache bytes per device, through llama.cpp's memory breakdown --------------------------------

def _meta_context_bytes(arch: str, devices: list[int], attn_split) -> tuple[int, list[int]]:
    model = testing.arch_model(arch, _moe(arch), devices, "tensor", attn_split=attn_split)
    ctx = _llama.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_UBATCH, n_threads=1)
    try:
        per_buft = testing.context_bytes(ctx)
        cells = testing.kv_cell_bytes(ctx)
    finally:
        ctx.free()
        model.free()
    assert len(per_buft) == 1, per_buft  # the KV cache is in the Meta buffer type
    return next(iter(per_buft.values())), cells


@pytest.mark.parametrize("split", [None, (1.0, 3.0), (1.0, 0.0), (0.0, 1.0), (3.0, 1.0)])
def test_kv_bytes_per_device_follow_the_attention_split(split) -> None:
    devices = virtual_devices(2)
    context, cells = _meta_context_bytes("llama", devices, None if split is None else list(split))
    # A Meta buffer is as large as its largest device's buffer: the KV rows of that device for every cell,
    # plus at most the buffer alignment per tensor.
    n_tensors = 64  # K and V of each layer of the fixture, with room to spare
    expected = max(cells) * N_CTX
    assert expected <= context <= expected + 512 * n_tensors, (context, cells)
    total = sum(cells)
    if split is None:
        assert cells[0] == cells[1]
    elif split == (1.0, 0.0):
        assert cells == [total, 0] and context >= total * N_CTX
    elif split == (0.0, 1.0):
        assert cells == [0, total]
    else:
        small = min(cells)
        # rounded to whole KV heads: the small side is at most a quarter, and more than a quarter less one head
        assert small <= total / 4 and cells.index(small) == (0 if split[0] < split[1] else 1), cells


def test_a_fraction_of_a_head_is_rounded_not_an_error() -> None:
    """1/1000 leaves device 0 less than one KV head: each boundary is rounded down to whole heads (in a
    per-layer rotated order, so device 0 gets 0 heads in some layers and 1 in others); the output stays right."""
    devices = virtual_devices(2)
    meta, _, cells = _run("llama", devices, "tensor", [1, 1000])
    _, _, one_head_each = _run("llama", devices, "tensor", [1, 1])
    assert cells[0] < cells[1] and cells[0] <= one_head_each[0], (cells, one_head_each)
    assert nmse(_cpu("llama"), meta) < 1e-4


# --- argument errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [[-1, 1], [math.nan, 1], [math.inf, 1], [0, 0], [], [1, 1, 1]])
def test_check_attn_split_errors(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="attn_split"):
        _llama.check_attn_split(bad, n_devices=2)


def test_check_attn_split_type_error() -> None:
    with pytest.raises(TypeError, match="attn_split"):
        _llama.check_attn_split("1/3")


def test_llama_attn_split_needs_tensor_split_mode(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match='attn_split needs split_mode="tensor"'):
        Llama(tiny_model, split_mode="layer", attn_split=[1, 3])
    with pytest.raises(ValueError, match='attn_split needs split_mode="tensor"'):
        _llama.Model.load(tiny_model, split_mode="none", attn_split=[1, 3])


@pytest.mark.parametrize("bad", [[-1, 1], [math.nan, 1], [0, 0], [1] * 1000])
def test_llama_bad_attn_split(tiny_model: Path, bad: list[float]) -> None:
    with pytest.raises(ValueError, match="attn_split"):
        Llama(tiny_model, split_mode="tensor", attn_split=bad)


def test_arch_model_attn_split_longer_than_its_devices() -> None:
    devices = virtual_devices(2)
    with pytest.raises(ValueError, match="attn_split has 3 entries but there are 2 device"):
        testing.arch_model("llama", False, devices, "tensor", attn_split=[1, 1, 1])


def test_llama_with_attn_split_runs(tiny_model: Path) -> None:
    virtual_devices(2)
    with Llama(tiny_model, split_mode="tensor", attn_split=[1, 3], n_ctx=256, flash_attn=True) as llm:
        with_as = llm.eval(llm.tokenize("Hello world"))
    with Llama(tiny_model, split_mode="none", n_ctx=256, flash_attn=True) as llm:
        ref = llm.eval(llm.tokenize("Hello world"))
    assert nmse(ref, with_as) < 1e-4


# --- command line --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [("1/3", (1.0, 3.0)), ("1,3", (1.0, 3.0)), ("0/1", (0.0, 1.0)),
                                           ("2", (2.0,)), ("1/3,1", (1.0, 3.0, 1.0))])  # as llama.cpp's -ts
def test_args_attn_split(text: str, expected: tuple[float, ...]) -> None:
    assert args.attn_split(text) == expected


@pytest.mark.parametrize("text", ["", "a/b", "-1/1", "0/0", "nan,1", "1,/3,"])
def test_args_attn_split_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        args.attn_split(text)


@pytest.mark.parametrize("text,expected", [
    ("1/3", [(1.0, 3.0)]),
    ("1,3", [(1.0, 3.0)]),                          # one split, llama.cpp's comma form
    ("1/3,1/0", [(1.0, 3.0), (1.0, 0.0)]),          # alternatives, as -ts takes them
    ("1/3;1,1", [(1.0, 3.0), (1.0, 1.0)]),          # ';' separates alternatives of either form
    ("none;0/1", [(), (0.0, 1.0)]),                 # none (or -) follows the tensor split
    ("1/3;-", [(1.0, 3.0), ()]),
])
def test_bench_attn_split_alternatives(text: str, expected: list[tuple[float, ...]]) -> None:
    assert bench_parser().parse_args(["-as", text]).attn_split == expected


def test_bench_attn_split_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_ATTN_SPLIT", "1/3")
    assert bench_parser().parse_args([]).attn_split == [(1.0, 3.0)]
    assert bench_parser().parse_args(["-as", "0/1"]).attn_split == [(0.0, 1.0)]  # the flag wins
    monkeypatch.delenv("LLAMA_ARG_ATTN_SPLIT")
    assert bench_parser().parse_args([]).attn_split is None


@pytest.mark.parametrize("bad", [["-as", "-1/1"], ["-as", "0/0"], ["-as", "1/3;"], ["-as", "x"]])
def test_bench_bad_attn_split_exits_2(tiny_model: Path, bad: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bench_main(["-m", str(tiny_model), *bad])
    assert e.value.code == 2


def test_bench_attn_split_column(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    virtual_devices(2)
    rc = bench_main(["-m", str(tiny_model), "-sm", "tensor", "-fa", "1", "-p", "16", "-n", "0", "-r", "1",
                     "-as", "1/3;-", "-o", "md", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    header = next(line for line in out.splitlines() if line.startswith("| model"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "as" in cols, header
    rows = [line for line in out.splitlines() if "pp16" in line]
    values = sorted([c.strip() for c in r.strip("|").split("|")][cols.index("as")] for r in rows)
    assert values == ["-", "1.00/3.00"], out


def test_bench_attn_split_json_and_skip(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    virtual_devices(2)
    rc = bench_main(["-m", str(tiny_model), "-sm", "tensor,layer", "-fa", "1", "-p", "16", "-n", "0", "-r", "1",
                     "-as", "0/1", "-o", "json", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    results = json.loads(captured.out)
    assert [(r["split_mode"], r["attn_split"]) for r in results] == [("tensor", "0.00/1.00")]
    assert "skipping -as with -sm layer" in captured.err


# --- on a GPU: two CUDA devices, copy engines forced ------------------------------------------------------

@pytest.fixture
def forced_copy_engines() -> object:
    from pyllama_so import allreduce

    with copy_engine_routing(True):
        yield allreduce


@pytest.mark.gpu
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "as-" + "-".join(str(int(v)) for v in s))
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_attn_split_with_copy_engines(arch: str, split: tuple[float, float], forced_copy_engines) -> None:
    devices = cuda_device_pair()
    cpu, total = _cpu(arch), _kv_total(arch)
    meta, _, cells = _run(arch, devices, "tensor", list(split))
    assert nmse(cpu, meta) < 1e-4, nmse(cpu, meta)
    _check_kv(cells, split, total)
    lanes, stats, _ = _run(arch, devices, "tensor", list(split), split_overlap=True)
    assert stats["enabled"], stats
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"
    assert forced_copy_engines.allreduce_stats().paths["ce"].calls > 0  # the reductions took the copy engines
