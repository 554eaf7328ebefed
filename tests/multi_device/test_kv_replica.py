"""Tensor split of models with fewer KV heads than devices (MQA: one KV head for four query heads, the
Gemma 3 270M shape) on CPU virtual devices: where the split copies the KV head and splits the query heads
(llama/src/llama-kv-replica.cpp), where it keeps one device's attention per layer (a fused QKV, an attention
split with a 0), that every layout decodes single tokens equal to the CPU with and without split overlap,
and that a layout the split cannot lay out is a load error, not an abort."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.split_devices import cuda_device_pair, same_bits, virtual_devices
from pyllama_so import ModelLoadError, _llama, testing
from pyllama_so.archs import nmse

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

N_CTX = 256
HEAD_DIM = 64  # the MQA fixtures: n_embd 256, four query heads
_TOKENS = [int(t) for t in np.random.default_rng(5).integers(1, 127, 200)]

# (devices, attn_split): even over 2 and 3, unequal, and a 0 (one device's attention: nothing to copy)
LAYOUTS = ((2, None), (2, (1.0, 3.0)), (2, (1.0, 0.0)), (2, (0.0, 1.0)), (3, None), (3, (1.0, 0.0, 1.0)))


def _model(arch: str, devices: list[int], split_mode: str = "tensor", attn_split=None) -> _llama.Model:
    return testing.arch_model(arch, False, devices, split_mode, attn_split=attn_split, mqa=True)


def _sequence(ctx: _llama.Context) -> np.ndarray:
    """A prompt over several ubatches (64+64+2), single tokens (decode steps), then more prompt."""
    out = [ctx.decode(_TOKENS[:130], all_logits=True)]
    out += [ctx.decode([t], all_logits=True) for t in _TOKENS[130:134]]
    out.append(ctx.decode(_TOKENS[134:200], all_logits=True))
    return np.concatenate(out)


def _logits(arch: str, devices: list[int], split_mode: str = "tensor", attn_split=None,
            split_overlap: bool = False) -> tuple[np.ndarray, list[int], dict]:
    model = _model(arch, devices, split_mode, attn_split)
    try:
        ctx = _llama.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=64, split_overlap=split_overlap,
                             n_threads=1)
        try:
            return _sequence(ctx), testing.kv_cell_bytes(ctx), ctx.split_overlap_stats()
        finally:
            ctx.free()
    finally:
        model.free()


_CPU: dict[str, tuple[np.ndarray, int]] = {}


def _cpu(arch: str) -> tuple[np.ndarray, int]:
    """The CPU's logits of the sequence and the bytes of one KV cell (cached per architecture)."""
    if arch not in _CPU:
        logits, cells, _ = _logits(arch, [], "none")
        _CPU[arch] = (logits, cells[0])
    return _CPU[arch]


def _split(arch: str, n_devices: int, attn_split=None) -> dict[str, tuple[str, list[int]]]:
    """Where layer 0's attention weights go: {suffix: (axis, slice sizes)}."""
    model = _model(arch, virtual_devices(n_devices), attn_split=attn_split)
    try:
        names = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
        return {n: testing.weight_split(model, f"blk.0.{n}") for n in names}
    finally:
        model.free()


def test_mqa_variants() -> None:
    """The fixtures with an MQA variant: those of the default subset that have attention (qwen3's dense fixture
    is MQA already), the fused-QKV ones tested here; not the ones whose fused QKV ignores the KV head count."""
    archs = ("llama", "gemma3", "lfm2", "starcoder", "plamo3", "qwen3", "qwen")
    flags = {a: testing.arch_flags(a)["mqa"] for a in archs}
    assert flags == {"llama": True, "gemma3": True, "lfm2": True, "starcoder": True, "plamo3": True,
                     "qwen3": False, "qwen": False}


@pytest.mark.parametrize("n_devices", [2, 3])
def test_even_split_copies_the_kv_head_and_splits_the_query_heads(n_devices: int) -> None:
    split = _split("gemma3", n_devices)
    q_axis, q = split["attn_q.weight"]
    assert q_axis == "1" and sum(q) == 4 * HEAD_DIM
    assert all(n > 0 and n % HEAD_DIM == 0 for n in q), q  # whole query heads, every device some
    assert split["attn_output.weight"] == ("0", q)  # the output's input rows follow the query heads
    assert split["attn_k.weight"][0] == "mirrored" and split["attn_v.weight"][0] == "mirrored"
    if n_devices == 2:
        assert q == [2 * HEAD_DIM, 2 * HEAD_DIM]


def test_unequal_attention_split_is_rounded_to_query_heads() -> None:
    """-as 1/3 gives 1 and 3 of the 4 query heads; upstream's grouping by KV head would give one device all 4."""
    split = _split("gemma3", 2, (1.0, 3.0))
    assert split["attn_q.weight"] == ("1", [HEAD_DIM, 3 * HEAD_DIM])
    assert split["attn_k.weight"][0] == "mirrored"


@pytest.mark.parametrize("attn_split", [(1.0, 0.0), (0.0, 1.0)], ids=["as-1-0", "as-0-1"])
def test_one_device_with_attention_keeps_the_kv_head_alone(attn_split: tuple[float, float]) -> None:
    """With a 0 only one device shares the attention: no copy, the other device holds none of it."""
    split = _split("gemma3", 2, attn_split)
    full = [HEAD_DIM * 4 * int(p) for p in attn_split]
    assert split["attn_q.weight"] == ("1", full)
    assert split["attn_k.weight"] == ("1", [HEAD_DIM * int(p) for p in attn_split])


def test_gqa_and_fused_qkv_keep_upstreams_layout() -> None:
    """Models with a KV head per device (llama's dense fixture) split K as before; a fused QKV cannot copy its
    K/V part, so an MQA StarCoder keeps each layer's attention whole on one device, alternating."""
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    try:
        assert testing.weight_split(model, "blk.0.attn_k.weight") == ("1", [128, 128])
    finally:
        model.free()
    model = _model("starcoder", devices)
    try:
        rows = 4 * HEAD_DIM + 2 * HEAD_DIM
        assert [testing.weight_split(model, f"blk.{il}.attn_qkv.weight") for il in (0, 1)] == \
            [("1", [0, rows]), ("1", [rows, 0])]
    finally:
        model.free()


@pytest.mark.parametrize("n_devices, attn_split", LAYOUTS,
                         ids=lambda v: str(v) if isinstance(v, int) else ("even" if v is None else
                                                                           "as-" + "-".join(str(int(p)) for p in v)))
def test_kv_cache_per_device(n_devices: int, attn_split) -> None:
    """The KV cache follows the layout: a copy on every device that shares the attention, else all on one."""
    _, total = _cpu("gemma3")
    _, cells, _ = _logits("gemma3", virtual_devices(n_devices), attn_split=attn_split)
    shares = [1.0] * n_devices if attn_split is None else list(attn_split)
    if sum(p > 0 for p in shares) >= 2:
        assert cells == [total] * n_devices
    else:
        assert cells == [total * int(p > 0) for p in shares]


# gemma3: separate Q/K/V with QK norms and sliding window (the KV head copied); starcoder: a fused QKV
# (upstream's layout); plamo3: a fused QKV whose K view goes through a K norm (the decode step that aborted)
@pytest.mark.parametrize("n_devices, attn_split", LAYOUTS,
                         ids=lambda v: str(v) if isinstance(v, int) else ("even" if v is None else
                                                                           "as-" + "-".join(str(int(p)) for p in v)))
@pytest.mark.parametrize("arch", ["gemma3", "starcoder", "plamo3"])
def test_mqa_tensor_split_equals_cpu(arch: str, n_devices: int, attn_split) -> None:
    cpu, _ = _cpu(arch)
    devices = virtual_devices(n_devices)
    meta, _, _ = _logits(arch, devices, attn_split=attn_split)
    assert nmse(cpu, meta) < 1e-4, nmse(cpu, meta)
    lanes, _, stats = _logits(arch, devices, attn_split=attn_split, split_overlap=True)
    assert stats["enabled"] and all(stats["ubatches"]), stats
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"


@pytest.mark.parametrize("n_devices, attn_split", LAYOUTS,
                         ids=lambda v: str(v) if isinstance(v, int) else ("even" if v is None else
                                                                           "as-" + "-".join(str(int(p)) for p in v)))
@pytest.mark.parametrize("arch", ["gemma3", "plamo3"])
def test_mqa_token_by_token_equals_cpu(arch: str, n_devices: int, attn_split) -> None:
    """Every graph with one token (ubatches of 1): the Meta buffers cache split states by node, and a decode
    graph's node can match a prompt graph's node bytewise, so after a prompt a decode step may reuse the
    prompt's split states; with no prompt graph each one-token graph's split states are worked out."""
    tokens = _TOKENS[:24]

    def logits(devices: list[int], split_mode: str, split=None) -> np.ndarray:
        model = _model(arch, devices, split_mode, split)
        try:
            ctx = _llama.Context(model, n_ctx=64, n_batch=1, n_ubatch=1, n_threads=1)
            try:
                return np.concatenate([ctx.decode([t], all_logits=True) for t in tokens])
            finally:
                ctx.free()
        finally:
            model.free()

    cpu = logits([], "none")
    meta = logits(virtual_devices(n_devices), "tensor", attn_split)
    assert nmse(cpu, meta) < 1e-4, nmse(cpu, meta)


def test_unsplittable_layout_is_a_load_error() -> None:
    """Qwen's fused QKV is 3 x n_embd whatever the KV head count, so the MQA metadata contradicts the rows the
    split cuts it into: loading under tensor split fails naming the tensor and why (upstream's split function
    asserted, killing the process); on one device the model loads."""
    with pytest.raises(ModelLoadError, match=r"tensor split cannot lay out blk\.0\.attn_qkv\.weight: its 768 QKV rows "
                                             r"are not the 256 \+ 64 \+ 64 rows of 4 query and 1 KV heads"):
        _model("qwen", virtual_devices(2))
    _model("qwen", [], "none").free()


@pytest.mark.gpu
@pytest.mark.parametrize("attn_split", [None, (1.0, 3.0), (1.0, 0.0)], ids=["even", "as-1-3", "as-1-0"])
@pytest.mark.parametrize("arch", ["gemma3", "starcoder"])
def test_gpu_mqa_tensor_split_equals_cpu(arch: str, attn_split) -> None:
    """The same layouts on two CUDA devices (two GPUs, or GGML_CUDA_DEVICES=2 on one)."""
    cpu, _ = _cpu(arch)
    devices = cuda_device_pair()
    meta, _, _ = _logits(arch, devices, attn_split=attn_split)
    assert nmse(cpu, meta) < 1e-4, nmse(cpu, meta)
    lanes, _, stats = _logits(arch, devices, attn_split=attn_split, split_overlap=True)
    assert stats["enabled"] and all(stats["ubatches"]), stats
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"
