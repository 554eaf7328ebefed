"""Split overlap on CPU virtual devices: two lanes give bitwise the output of one, the ordering between
the lanes follows the state tensors (shown by race fixtures that fail when it is broken on purpose), and
each case where the lanes stay off says why.

The default run covers SO_DEFAULT_ARCHS; `-m slow` runs every other architecture with tensor split.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from helpers.split_devices import copy_engine_routing, cuda_device_pair, same_bits, virtual_devices
from pyllama_so import _llama, testing

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

N_UBATCH = 64  # LLAMA_SPLIT_OVERLAP_MIN_TOKENS: the smallest ubatch that takes a lane of its own
# recurrent conv state (lfm2), SWA (gemma3), hybrid linear attention (qwen3next), attention sinks (gpt-oss)
SO_DEFAULT_ARCHS = ("llama", "qwen3", "gemma3", "lfm2", "qwen3next", "gpt-oss")
# Upstream's Meta backend aborts on a single-token decode after a prompt with qwen3's tiny fixture, with
# and without split overlap (GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0) in
# ggml-backend-meta.cpp): its sequences leave out the single tokens.
NO_SINGLE_TOKENS = {"qwen3"}

_TOKENS = [int(t) for t in np.random.default_rng(7).integers(1, 127, 256)]






def _sequence(ctx: _llama.Context, singles: bool) -> np.ndarray:
    """A prompt in pieces of different sizes (64+64+2, then 64+2), single tokens, then another prompt."""
    out = [ctx.decode(_TOKENS[:130], all_logits=True), ctx.decode(_TOKENS[130:196], all_logits=True)]
    if singles:
        out += [ctx.decode([t], all_logits=True) for t in _TOKENS[196:200]]
    ctx.clear(True)
    out.append(ctx.decode(_TOKENS[:130], all_logits=True))
    return np.concatenate(out)


def _run(arch: str, moe: bool, devices: list[int] | None, split_mode: str, split_overlap: bool,
         delays_us: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, dict]:
    model = testing.arch_model(arch, moe, devices or [], split_mode)
    ctx = _llama.Context(model, n_ctx=256, n_batch=256, n_ubatch=N_UBATCH, split_overlap=split_overlap, n_threads=1)
    try:
        for lane, delay in enumerate(delays_us):
            if delay:
                assert testing.delay_lane(ctx, lane, delay) == len(devices or [])
        return _sequence(ctx, arch not in NO_SINGLE_TOKENS), ctx.split_overlap_stats()
    finally:
        ctx.free()
        model.free()


def _cases() -> list:
    out = []
    for arch in testing.arch_names():
        f = testing.arch_flags(arch)
        if not (f["supported"] and f["sm_tensor"]) or f["encode"]:
            continue  # encoders run on lane 0 only
        variants = [True] if f["moe_mandatory"] else ([False, True] if f["moe"] else [False])
        for moe in variants:
            for n_dev in (2, 3):
                marks = [] if arch in SO_DEFAULT_ARCHS else [pytest.mark.slow]
                out.append(pytest.param(arch, moe, n_dev, marks=marks,
                                        id=f"{arch}-{'moe' if moe else 'dense'}-{n_dev}dev"))
    return out


@pytest.mark.parametrize("arch,moe,n_dev", _cases())
def test_lanes_give_the_bits_of_one_lane(arch: str, moe: bool, n_dev: int) -> None:
    devices = virtual_devices(n_dev)
    meta, off = _run(arch, moe, devices, "tensor", False)
    lanes, stats = _run(arch, moe, devices, "tensor", True, delays_us=(300, 0))
    assert not off["enabled"] and stats["enabled"], stats
    assert stats["ubatches"][1] >= 2 and stats["graph_builds"][1] >= 1, stats  # both lanes really ran
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"
    cpu, _ = _run(arch, moe, None, "none", False)
    nmse = float(np.mean((lanes - cpu) ** 2) / np.mean(cpu ** 2))
    assert nmse < 1e-4, nmse


def test_alternation_carries_over_and_small_ubatches_stay_on_lane_0() -> None:
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    ctx = _llama.Context(model, n_ctx=256, n_batch=N_UBATCH, n_ubatch=N_UBATCH, split_overlap=True, n_threads=1)
    try:
        lanes = []
        for k in range(4):  # one 64-token ubatch per decode call: they must still alternate
            before = ctx.split_overlap_stats()["ubatches"]
            ctx.decode(_TOKENS[64 * k:64 * (k + 1)])
            after = ctx.split_overlap_stats()["ubatches"]
            lanes.append([b - a for a, b in zip(before, after, strict=True)].index(1))
        assert lanes == [0, 1, 0, 1]
        ctx.clear(True)
        before = ctx.split_overlap_stats()
        ctx.decode(_TOKENS[:63])  # under 64 tokens: lane 0, and the next lane stays the same
        for t in _TOKENS[63:67]:
            ctx.decode([t])
        after = ctx.split_overlap_stats()
        assert after["ubatches"][0] - before["ubatches"][0] == 5
        assert after["ubatches"][1] == before["ubatches"][1]
        assert after["next_lane"] == before["next_lane"] == 0
    finally:
        ctx.free()
        model.free()


def test_the_ubatches_of_one_call_alternate_whatever_their_sizes() -> None:
    """Within a decode call every ubatch takes the other lane than the one before it (a small one too: it
    would wait on the host for the previous one of its lane); a call's first ubatch takes next_lane when it
    is large, lane 0 when it is small; next_lane then follows the call's last ubatch."""
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    ctx = _llama.Context(model, n_ctx=1024, n_batch=256, n_ubatch=N_UBATCH, split_overlap=True, n_threads=1)
    calls = [  # tokens of one call -> its ubatches per lane, next_lane after it
        (66, [1, 1], 0),   # 64 + 2: lanes 0, 1
        (130, [2, 1], 1),  # 64 + 64 + 2: lanes 0, 1, 0
        (64, [0, 1], 0),   # one large ubatch on next_lane
        (1, [1, 0], 0),    # decoding: lane 0, next_lane unchanged
        (2, [1, 0], 0),
        (64, [1, 0], 1),
        (1, [1, 0], 1),
        (66, [1, 1], 1),   # lanes 1, 0
    ]
    try:
        got = []
        for n, _, _ in calls:
            before = ctx.split_overlap_stats()["ubatches"]
            ctx.decode(_TOKENS[:n])
            after = ctx.split_overlap_stats()
            got.append((n, [b - a for a, b in zip(before, after["ubatches"], strict=True)], after["next_lane"]))
    finally:
        ctx.free()
        model.free()
    assert got == calls


def _lane_ubatches(ctx: _llama.Context, decode: Callable[[_llama.Context], np.ndarray]) -> tuple[list[int], np.ndarray]:
    before = ctx.split_overlap_stats()["ubatches"]
    logits = decode(ctx)
    after = ctx.split_overlap_stats()["ubatches"]
    return [b - a for a, b in zip(before, after, strict=True)], logits


def test_a_call_of_one_sequence_is_cut_into_equal_ubatches_for_both_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 tokens at n_ubatch 96 would be 96, 96 and 64 (two ubatches on one lane, one on the other): with
    the lanes they are four of 64, two a lane, bitwise the output of no lanes at n_ubatch 64. Several
    sequences in a call keep llama.cpp's cut (by sequence sets, where a smaller size adds ubatches)."""
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    try:
        out = {}
        for so, n_ubatch in ((True, 96), (False, 64), (False, 96)):
            ctx = _llama.Context(model, n_ctx=512, n_batch=256, n_ubatch=n_ubatch, n_seq_max=2, split_overlap=so,
                                 n_threads=1)
            try:
                lanes, one = _lane_ubatches(ctx, lambda c: c.decode(_TOKENS[:256], all_logits=True))
                # two sequences of 100 tokens: split_equal at 96 gives 48 + 48 twice and 4 + 4
                ctx.clear(True)
                two, _ = _lane_ubatches(ctx, lambda c: c.decode_batch(
                    [(0, _TOKENS[:100], True), (1, _TOKENS[100:200], True)]))
                out[so, n_ubatch] = one
                if so:
                    assert lanes == [2, 2] and sorted(two) == [1, 2], (lanes, two)
            finally:
                ctx.free()
        assert same_bits(out[True, 96], out[False, 64])
        assert np.allclose(out[True, 96], out[False, 96], atol=1e-3)  # another cut, same model
        monkeypatch.setenv("LLAMA_SPLIT_OVERLAP_EQUAL_UBATCHES", "0")  # llama.cpp's cut: 96, 96 and 64
        ctx = _llama.Context(model, n_ctx=512, n_batch=256, n_ubatch=96, split_overlap=True, n_threads=1)
        try:
            assert _lane_ubatches(ctx, lambda c: c.decode(_TOKENS[:256]))[0] == [2, 1]
        finally:
            ctx.free()
    finally:
        model.free()


def test_each_lane_reserves_a_full_ubatch_of_compute_buffers() -> None:
    devices = virtual_devices(2)
    sizes = {}
    for so in (False, True):
        model = testing.arch_model("llama", False, devices, "tensor")
        ctx = _llama.Context(model, n_ctx=256, n_batch=256, n_ubatch=N_UBATCH, split_overlap=so, n_threads=1)
        sizes[so] = testing.compute_bytes(ctx)
        ctx.free()
        model.free()
    assert sizes[False] > 0 and sizes[True] == 2 * sizes[False]  # the memory breakdown counts both lanes


# --- race fixtures: the waits must follow the state, not the subgraph index -----------------------------

# Lane 1 is delayed twice as long as lane 0 per graph: without the right wait, its state write at the start
# of a graph lands between lane 0's write and lane 0's read many subgraphs later.
RACE_DELAYS_US = (2000, 4000)


@pytest.mark.parametrize("n_dev", [2, 3])
def test_state_read_many_subgraphs_later_is_ordered(n_dev: int) -> None:
    """Gemma-style: state written in the first subgraph is read in the last (testing/lane-race-fixture.cpp)."""
    devices = virtual_devices(n_dev)
    one_lane = testing.lane_race(devices, lanes=False)
    assert np.isfinite(one_lane).all() and np.abs(one_lane).max() > 0
    for delays in ((0, 0), RACE_DELAYS_US, (4000, 0)):
        assert same_bits(one_lane, testing.lane_race(devices, lanes=True, delays_us=delays)), delays


_MUTANT = textwrap.dedent("""
    import sys
    import numpy as np
    from pyllama_so import _llama, testing
    sys.path[:0] = {paths!r}  # this module's folder, and tests/ for the helpers it imports
    import test_split_overlap as t
    what = sys.argv[1]
    if what == "race":
        devices = t.virtual_devices(2)
        ref = testing.lane_race(devices, lanes=False)
        got = testing.lane_race(devices, lanes=True, delays_us=t.RACE_DELAYS_US)
    else:
        devices = t.virtual_devices(2)
        ref, _ = t._run(what, False, devices, "tensor", False)
        got, _ = t._run(what, False, devices, "tensor", True, delays_us=(3000, 0))
    print("SAME" if t.same_bits(ref, got) else "DIFFERENT")
""")


def _run_mutant(what: str, mode: str | None, threads: bool = True) -> str:
    env = dict(os.environ)
    env.pop("GGML_META_LANES_TEST", None)
    env["GGML_META_LANES_THREADS"] = "1" if threads else "0"
    if mode:
        env["GGML_META_LANES_TEST"] = mode
    here = os.path.dirname(os.path.abspath(__file__))
    code = _MUTANT.format(paths=[here, os.path.dirname(here)])
    res = subprocess.run([sys.executable, "-c", code, what], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if mode:
        assert f"GGML_META_LANES_TEST={mode}" in res.stderr  # the switch was read, and said so
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("mode", ["nowait", "same_index"])
@pytest.mark.parametrize("fixture", ["race", "lfm2"])
def test_broken_ordering_is_caught(fixture: str, mode: str) -> None:
    """The test-only switches that remove the cross-lane waits, or keep only those of the same subgraph
    index, make both race fixtures fail: the Gemma-style one (state read many subgraphs after it is
    written) and LFM2's short-conv state (read one or two subgraphs before it is written)."""
    assert _run_mutant(fixture, mode) == "DIFFERENT"


@pytest.mark.parametrize("threads", [True, False], ids=["issue-threads", "calling-thread"])
@pytest.mark.parametrize("fixture", ["race", "lfm2"])
def test_race_fixtures_pass_with_the_waits(fixture: str, threads: bool) -> None:
    """The same fixtures and delays, with the waits in place: the delays alone do not change the output,
    whether each lane issues on its own thread (the default) or both on the caller's
    (GGML_META_LANES_THREADS=0)."""
    assert _run_mutant(fixture, None, threads) == "SAME"


# --- when the lanes stay off ------------------------------------------------------------------------------

def _stats(devices: list[int], split_mode: str = "tensor", decode: bool = True, **kwargs: object) -> dict:
    model = testing.arch_model("llama", False, devices, split_mode)
    ctx = _llama.Context(model, n_ctx=256, n_batch=256, n_ubatch=N_UBATCH, split_overlap=True, n_threads=1, **kwargs)
    try:
        if decode:
            ctx.decode(_TOKENS[:130])  # still runs, on one lane
        return ctx.split_overlap_stats()
    finally:
        ctx.free()
        model.free()


def test_lanes_stay_off_without_tensor_split() -> None:
    stats = _stats(virtual_devices(2), split_mode="layer")
    assert not stats["enabled"] and stats["reason"] == "split_mode is not tensor"
    assert stats["ubatches"] == [0, 0]


def test_lanes_stay_off_with_the_kv_cache_on_the_host() -> None:
    # no decode: upstream's tensor split over CPU virtual devices dies of a floating point exception in
    # the first decode with offload_kqv=False, with or without split overlap
    stats = _stats(virtual_devices(2), decode=False, offload_kqv=False)
    assert not stats["enabled"] and "KV cache" in stats["reason"]


def test_lanes_stay_off_with_layers_on_the_host(tiny_model) -> None:
    devices = virtual_devices(2)
    del devices  # the model loads on every GPU-type device, the virtual ones included
    model = _llama.Model.load(tiny_model, n_gpu_layers=1, split_mode="tensor")
    ctx = _llama.Context(model, n_ctx=256, n_ubatch=N_UBATCH, split_overlap=True, n_threads=1)
    try:
        stats = ctx.split_overlap_stats()
    finally:
        ctx.free()
        model.free()
    assert not stats["enabled"] and "n_gpu_layers" in stats["reason"]


def test_lanes_are_not_counted_when_not_requested() -> None:
    devices = virtual_devices(2)
    model = testing.arch_model("llama", False, devices, "tensor")
    ctx = _llama.Context(model, n_ctx=256, n_ubatch=N_UBATCH, n_threads=1)
    try:
        ctx.decode(_TOKENS[:130])
        stats = ctx.split_overlap_stats()
    finally:
        ctx.free()
        model.free()
    assert stats["reason"] == "not requested" and stats["ubatches"] == [0, 0]


def test_lanes_stay_off_on_devices_without_events() -> None:
    code = textwrap.dedent("""
        from pyllama_so import _llama, testing
        _llama.cpu_virtual_devices(2)
        idx = [d["index"] for d in _llama.devices() if d["backend"] == "CPUV"]
        model = testing.arch_model("llama", False, idx, "tensor")
        ctx = _llama.Context(model, n_ctx=256, n_ubatch=64, split_overlap=True, n_threads=1)
        ctx.decode([i % 120 + 1 for i in range(130)])
        print(ctx.split_overlap_stats()["reason"])
    """)
    env = dict(os.environ, GGML_CPU_VIRTUAL_NO_EVENTS="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "a device has no events"
    assert res.stderr.count("split overlap stays off: a device has no events") == 1  # one warning,
    assert res.stderr.count("no events") == 1  # and nothing else says it again


_SWITCH_WITHOUT_HARNESS = textwrap.dedent("""
    import sys
    from pyllama_so import _llama
    if sys.argv[2] == "harness":
        import pyllama_so.testing  # installs the test-only switches
    _llama.cpu_virtual_devices(2)
    model = _llama.Model.load(sys.argv[1], n_gpu_layers=-1, split_mode="tensor")
    ctx = _llama.Context(model, n_ctx=256, n_ubatch=64, split_overlap=True, n_threads=1)
    print(ctx.split_overlap_stats()["reason"], "pyllama_so.testing" in sys.modules)
""")


@pytest.mark.parametrize("harness", [False, True], ids=["product-alone", "with-harness"])
def test_test_switches_act_only_through_the_harness(tiny_model, harness: bool) -> None:
    """The product never reads the test-only switches: a process that does not import pyllama_so.testing links
    the lanes although GGML_CPU_VIRTUAL_NO_EVENTS=1 is set; importing the harness makes the same variable
    keep them off."""
    env = dict(os.environ, GGML_CPU_VIRTUAL_NO_EVENTS="1")
    res = subprocess.run([sys.executable, "-c", _SWITCH_WITHOUT_HARNESS, str(tiny_model),
                          "harness" if harness else "alone"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    want = "a device has no events True" if harness else "on False"
    assert res.stdout.strip().splitlines()[-1] == want
    assert ("TEST ONLY: GGML_CPU_VIRTUAL_NO_EVENTS=1" in res.stderr) == harness


# --- on a GPU: two CUDA devices (two GPUs, or GGML_CUDA_DEVICES=2 on one) --------------------------------

@pytest.fixture
def copy_engines(request: pytest.FixtureRequest) -> object:
    """The AllReduce routing of the contexts made in the test: copy engines for every reduction, or upstream's."""
    with copy_engine_routing(request.param):
        yield request.param


@pytest.mark.gpu
@pytest.mark.parametrize("copy_engines", [False, True], indirect=True, ids=["upstream-allreduce", "copy-engines"])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "lfm2", "qwen3next"])
def test_gpu_lanes_give_the_bits_of_one_lane(arch: str, copy_engines: bool) -> None:
    from pyllama_so import allreduce

    devices = cuda_device_pair()
    moe = testing.arch_flags(arch)["moe_mandatory"]  # qwen3next has no dense variant
    meta, _ = _run(arch, moe, devices, "tensor", False)
    lanes, stats = _run(arch, moe, devices, "tensor", True)
    assert stats["enabled"] and stats["ubatches"][1] >= 2, stats
    assert same_bits(meta, lanes), f"max |diff| {np.abs(meta - lanes).max()}"
    if copy_engines:
        assert allreduce.allreduce_stats().paths["ce"].calls > 0  # the lanes' reductions took the copy engines


@pytest.mark.gpu
@pytest.mark.parametrize("copy_engines", [False, True], indirect=True, ids=["upstream-allreduce", "copy-engines"])
def test_gpu_state_read_many_subgraphs_later_is_ordered(copy_engines: bool) -> None:
    devices = cuda_device_pair()
    one_lane = testing.lane_race(devices, lanes=False, n_ubatches=32)
    assert same_bits(one_lane, testing.lane_race(devices, lanes=True, n_ubatches=32))


_TWO_SEQUENCES = textwrap.dedent("""
    import sys
    import numpy as np
    from pyllama_so import _llama

    # a server's pattern: requests alternate between two sequences, each dropping the sequence's cache,
    # prefilling in pieces of two lane ubatches and decoding single tokens
    model = _llama.Model.load(sys.argv[1], n_gpu_layers=-1, split_mode="tensor")
    ctx = _llama.Context(model, n_ctx=1024, n_batch=128, n_ubatch=64, n_seq_max=2, flash_attn="on",
                         split_overlap=sys.argv[2] == "1", n_threads=2, n_threads_batch=2)
    rng = np.random.default_rng(1)
    out = []
    for _ in range(int(sys.argv[3])):
        for seq, n in ((0, 200), (1, 100)):
            ctx.truncate(0, seq)
            todo = [int(t) for t in rng.integers(1, 512, n)]
            while todo:
                piece, todo = todo[:128], todo[128:]
                logits = ctx.decode_batch([(seq, piece, not todo)])
            for _ in range(8):
                logits = ctx.decode_batch([(seq, [int(np.argmax(logits[-1]))], True)])
            out.append(logits[-1].copy())
    np.save(sys.argv[4], np.stack(out))
    print(ctx.split_overlap_stats()["ubatches"])
""")


def test_two_sequences_alternating_requests(tiny_model: Path, tmp_path: Path) -> None:
    """Many requests alternating between two sequences with both lanes' issue threads busy: the lanes
    build and issue graphs on shared buffers at the same time (a race there corrupted memory within a
    few requests), and the logits stay bitwise those of plain tensor split."""
    env = dict(os.environ, GGML_CPU_VIRTUAL_DEVICES="2")
    env.pop("GGML_META_LANES_THREADS", None)
    logits = {}
    for so in ("0", "1"):
        path = tmp_path / f"so{so}.npy"
        res = subprocess.run([sys.executable, "-c", _TWO_SEQUENCES, str(tiny_model), so, "150", str(path)],
                             env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        logits[so] = np.load(path)
        if so == "1":
            lanes = [int(x) for x in res.stdout.strip().splitlines()[-1].strip("[]").split(",")]
            assert min(lanes) >= 150, lanes  # both lanes took prompt ubatches
    assert same_bits(logits["0"], logits["1"])
