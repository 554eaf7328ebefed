"""Copy-engine and low-latency AllReduce (ggml/src/ggml-cuda/allreduce-ce.cu, allreduce-ll.cu): exactness,
routing, knobs, races.

GPU tests run reductions on host data through a fresh CUDA comm context on devices 0 and 1
(pyllama_so.bench.allreduce_rig.allreduce_run) and compare with an exact numpy emulation: each side rounded
F32 -> BF16 (nearest even), added in F32 as part0 + part1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
import pyllama_so.testing
from helpers.cuda_devices import two_cuda_gpus
from pyllama_so import Llama, allreduce
from pyllama_so.bench import allreduce_rig

CHUNK_ELEMS = 1024 * 1024 // 2  # the smallest automatic chunk (1 MiB of BF16)
SLOT_ELEMS = 4 * 1024 * 1024 // 2  # one slot (the per-round buffer) in BF16 elements
MIN_BYTES_DEFAULT = 512 * 1024

KNOBS = (allreduce.ENV_ALLREDUCE, allreduce.ENV_CE, allreduce.ENV_CE_MIN_BYTES, allreduce.ENV_CE_CHUNK_BYTES,
         "GGML_CUDA_AR_CE_FAIL_ALLOC", "GGML_CUDA_AR_HOST_WAIT", allreduce.ENV_LL_MAX_BYTES,
         "GGML_CUDA_AR_BF16_THRESHOLD")
LL_MAX_BYTES_DEFAULT = 64 * 1024


needs_two_gpus = pytest.mark.skipif(not two_cuda_gpus(), reason="needs a CUDA build and 2 CUDA devices")


@pytest.fixture
def knobs(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The knobs unset (monkeypatch restores them afterwards) and the counters at 0."""
    for k in KNOBS:
        monkeypatch.delenv(k, raising=False)
    allreduce.reset_allreduce_stats()
    yield monkeypatch


# ---------------------------------------------------------------------------------------------
# numpy emulation

def bf16_round(x: np.ndarray) -> np.ndarray:
    """F32 -> BF16 (round to nearest even, NaN stays NaN) -> F32, exactly."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    quiet_nan = ((u >> 16) | 0x40) & 0xFFFF
    h = np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded).astype(np.uint32)
    return (h << 16).view(np.float32)


def emulate(a0: np.ndarray, a1: np.ndarray, inactive: int = 0, bf16: bool = True) -> np.ndarray:
    """Each part rounded to BF16 (bf16=False: F32 on the wire, as with GGML_CUDA_AR_BF16_THRESHOLD=0), summed in F32."""
    wire = bf16_round if bf16 else (lambda x: np.asarray(x, dtype=np.float32))
    p0 = np.zeros_like(a0) if inactive & 1 else wire(a0)
    p1 = np.zeros_like(a1) if inactive & 2 else wire(a1)
    with np.errstate(over="ignore", invalid="ignore"):
        return (p0 + p1).astype(np.float32)


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), f"{what}: NaN positions differ"
    gb = got.view(np.uint32)[~gn]
    wb = want.view(np.uint32)[~wn]
    bad = np.flatnonzero(gb != wb)
    assert bad.size == 0, (f"{what}: {bad.size} elements differ, first at {bad[0]}: "
                           f"got {got[~gn][bad[0]]!r} want {want[~wn][bad[0]]!r}")


def assert_same_on_both(r0: np.ndarray, r1: np.ndarray) -> None:
    assert np.array_equal(r0.view(np.uint32), r1.view(np.uint32)), "the two GPUs disagree bitwise"


def special_data(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-40, -1e-40, 1.4e-45, 1.1754942e-38,
                         3.3e38, -3.39e38, 1.00390625, 1.01171875], dtype=np.float32)
    if n:
        idx = rng.choice(n, size=min(n, 4 * specials.size), replace=n < 4 * specials.size)
        x[idx] = np.resize(specials, idx.size)
    # raw bit patterns: denormals, NaN payloads, halfway cases
    if n > 64:
        bits = rng.integers(0, 2**32, size=32, dtype=np.uint64).astype(np.uint32)
        x[rng.choice(n, 32, replace=False)] = bits.view(np.float32)
    return x


def force_ce(knobs: pytest.MonkeyPatch) -> None:
    """Every reduction through the copy engines, by the variables every comm context takes as its defaults (the
    knobs fixture restores them)."""
    knobs.setenv("GGML_CUDA_AR_CE", "1")
    knobs.setenv("GGML_CUDA_AR_CE_MIN_BYTES", "1")


def use_ll(knobs: pytest.MonkeyPatch, bf16: bool = True) -> None:
    """Copy engines on (the H200s have peer access), so reductions up to the default size take the low-latency path;
    bf16=False: F32 on the wire (upstream's GGML_CUDA_AR_BF16_THRESHOLD=0, which the path follows)."""
    knobs.setenv("GGML_CUDA_AR_CE", "1")
    if not bf16:
        knobs.setenv("GGML_CUDA_AR_BF16_THRESHOLD", "0")


# ---------------------------------------------------------------------------------------------
# CPU: API shape and validation

def test_stats_api_shape() -> None:
    st = allreduce.allreduce_stats()
    assert set(st.paths) == {"ce", "nccl", "internal", "fallback", "ll"}
    assert st.available == allreduce.allreduce_available()
    if not st.available:
        assert st.total_calls == 0 and st.ce_rounds == 0 and st.ce_buffer_allocs == 0
        assert all(p.bytes == 0 for p in st.paths.values())
        allreduce.reset_allreduce_stats()  # a no-op without CUDA
        assert allreduce.allreduce_stats() == st
    assert st.to_dict()["paths"]["ce"] == {"calls": st.paths["ce"].calls, "bytes": st.paths["ce"].bytes}


def test_run_without_cuda_raises() -> None:
    if allreduce_rig.available():
        pytest.skip("CUDA build")
    with pytest.raises(pyllama_so.LlamaError):
        allreduce_rig.allreduce_run(np.zeros(4, np.float32), np.zeros(4, np.float32))


@pytest.mark.parametrize("kwargs, exc", [
    ({"copy_engines": 1}, TypeError),
    ({"copy_engines": "yes"}, TypeError),
    ({"min_bytes": 0}, ValueError),
    ({"min_bytes": -5}, ValueError),
    ({"min_bytes": 1.5}, TypeError),
    ({"min_bytes": True}, TypeError),
    ({"chunk_bytes": 3 << 18}, ValueError),
    ({"chunk_bytes": 32 << 10}, ValueError),
    ({"chunk_bytes": 8 << 20}, ValueError),
    ({"chunk_bytes": 1.0}, TypeError),
])
def test_allreduce_params_validate(knobs: pytest.MonkeyPatch, kwargs: dict, exc: type) -> None:
    with pytest.raises(exc):
        allreduce.AllReduceParams(**kwargs)
    assert not any(k in os.environ for k in KNOBS)


def test_emulation_reference_values() -> None:
    cases = {  # f32 bits -> bf16 bits
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # halfway, even: down
        0x3F818000: 0x3F82,  # halfway, odd: up
        0x80000000: 0x8000,  # -0
        0x7F800000: 0x7F80,  # inf
        0x7F7F8000: 0x7F80,  # rounds up to inf
        0x000116C2: 0x0001,  # denormal, kept
        0x00018000: 0x0002,  # denormal halfway, odd: up
        0x7FC00001: 0x7FC0,  # quiet NaN
        0x7F800001: 0x7FC0,  # signalling NaN: quieted, not turned into inf
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    got = bf16_round(x).view(np.uint32) >> 16
    assert [hex(v) for v in got] == [hex(v) for v in cases.values()]


# ---------------------------------------------------------------------------------------------
# GPU

SIZES = [1, 2, 3, 1001, CHUNK_ELEMS - 1, CHUNK_ELEMS + 7, SLOT_ELEMS, SLOT_ELEMS + 1, 3 * SLOT_ELEMS + 12345]


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("n", SIZES)
def test_ce_bitwise(knobs: pytest.MonkeyPatch, n: int) -> None:
    force_ce(knobs)
    a0, a1 = special_data(n, 1), special_data(n, 2)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1)
    assert_same_on_both(r0, r1)
    assert_bitwise(r0, emulate(a0, a1), f"n={n}")
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == 1 and st.paths["ce"].bytes == 4 * n
    assert st.ce_rounds == -(-n // SLOT_ELEMS)


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("chunk", [64 << 10, 1 << 20, 4 << 20])
@pytest.mark.parametrize("n", [3, CHUNK_ELEMS + 7, 3 * SLOT_ELEMS + 12345])
def test_ce_bitwise_fixed_chunk_sizes(knobs: pytest.MonkeyPatch, n: int, chunk: int) -> None:
    """Fixed chunk sizes: one chunk per round (4 MiB) up to 64 per round (64 KiB)."""
    force_ce(knobs)
    knobs.setenv("GGML_CUDA_AR_CE_CHUNK_BYTES", str(chunk))
    a0, a1 = special_data(n, 8), special_data(n, 9)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=1)
    assert_same_on_both(r0, r1)
    assert_bitwise(r0, emulate(a0, a1), f"n={n} chunk={chunk}")


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("inactive", [1, 2, 3])
@pytest.mark.parametrize("path, n", [("ce", 5), ("ce", CHUNK_ELEMS + 3), ("ce", 2 * SLOT_ELEMS + 1), ("ll", 5),
                                     ("ll", 4096)])
def test_inactive_shard_contributes_zeros(knobs: pytest.MonkeyPatch, path: str, inactive: int, n: int) -> None:
    """The copy engines (every size forced there) and the low-latency path (small sizes)."""
    if path == "ce":
        force_ce(knobs)
    else:
        use_ll(knobs)
    a0, a1 = special_data(n, 3), special_data(n, 4)
    # an inactive shard's data is garbage; it must not be read
    if inactive & 1:
        a0[:] = np.nan
    if inactive & 2:
        a1[:] = np.nan
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, inactive=inactive)
    assert_same_on_both(r0, r1)
    assert_bitwise(r0, emulate(a0, a1, inactive), f"inactive={inactive}")
    assert allreduce.allreduce_stats().paths[path].calls == 1


@pytest.mark.gpu
@needs_two_gpus
def test_empty_reduction(knobs: pytest.MonkeyPatch) -> None:
    force_ce(knobs)
    r0, r1 = allreduce_rig.allreduce_run(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert r0.size == 0 and r1.size == 0
    assert allreduce.allreduce_stats().total_calls == 0  # nothing to move, on any path


@pytest.mark.gpu
@needs_two_gpus
def test_routing_by_size(knobs: pytest.MonkeyPatch) -> None:
    knobs.setenv("GGML_CUDA_AR_CE", "1")  # the H200s have peer access: force the copy engines on
    small = MIN_BYTES_DEFAULT // 4 - 1
    large = MIN_BYTES_DEFAULT // 4
    for n in (small, large):
        a0, a1 = special_data(n, 5), special_data(n, 6)
        r0, r1 = allreduce_rig.allreduce_run(np.nan_to_num(a0, posinf=0, neginf=0),
                                             np.nan_to_num(a1, posinf=0, neginf=0))
        assert_same_on_both(r0, r1)
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == 1 and st.paths["ce"].bytes == 4 * large
    # below the threshold: the internal pipeline (NCCL where the internal pipeline could not start)
    assert st.paths["internal"].calls + st.paths["nccl"].calls == 1
    assert st.paths["fallback"].calls == 0

    allreduce.reset_allreduce_stats()
    knobs.setenv("GGML_CUDA_AR_CE_MIN_BYTES", str(4 * 1000))
    allreduce_rig.allreduce_run(np.ones(999, np.float32), np.ones(999, np.float32))
    allreduce_rig.allreduce_run(np.ones(1000, np.float32), np.ones(1000, np.float32))
    assert allreduce.allreduce_stats().paths["ce"].calls == 1


@pytest.mark.gpu
@needs_two_gpus
def test_knob_off_sends_large_to_base_path(knobs: pytest.MonkeyPatch) -> None:
    knobs.setenv("GGML_CUDA_AR_CE", "0")
    n = 4 * SLOT_ELEMS
    a0, a1 = np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1)
    np.testing.assert_array_equal(r0, 3.0)
    np.testing.assert_array_equal(r1, 3.0)
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == 0 and st.ce_buffer_allocs == 0
    assert st.paths["nccl"].calls + st.paths["internal"].calls == 1


@pytest.mark.gpu
@needs_two_gpus
def test_knob_force_with_params(knobs: pytest.MonkeyPatch) -> None:
    """The settings of the comm context itself, with no variable set."""
    allreduce_rig.allreduce_run(np.ones(10, np.float32), np.ones(10, np.float32),
                                allreduce=allreduce.AllReduceParams(copy_engines=True, min_bytes=1))
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == 1 and st.ce_buffer_allocs == 1
    assert not any(k in os.environ for k in KNOBS)


@pytest.mark.gpu
@needs_two_gpus
def test_allocation_failure_falls_back(knobs: pytest.MonkeyPatch) -> None:
    knobs.setenv("GGML_CUDA_AR_CE", "1")
    knobs.setenv("GGML_CUDA_AR_CE_FAIL_ALLOC", "1")
    n = SLOT_ELEMS + 17
    rng = np.random.default_rng(7)
    a0, a1 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=1)
    assert_same_on_both(r0, r1)
    np.testing.assert_allclose(r0, a0 + a1, rtol=2e-2, atol=5e-2)  # NCCL/internal: BF16 on the wire
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == 0
    assert st.ce_alloc_failures == 1 and st.ce_buffer_allocs == 0
    assert st.paths["nccl"].calls + st.paths["internal"].calls == 1
    assert st.paths["fallback"].calls == 0


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("n, n_iter", [(CHUNK_ELEMS + 5, 96), (SLOT_ELEMS - 3, 24), (2 * SLOT_ELEMS + 777, 12),
                                       (4097, 256)])
def test_race_hunt_back_to_back(knobs: pytest.MonkeyPatch, n: int, n_iter: int) -> None:
    """Many reductions without host syncs; each must equal its own emulation bitwise."""
    force_ce(knobs)
    rng = np.random.default_rng(n ^ n_iter)
    a0 = rng.standard_normal(n * n_iter).astype(np.float32)
    a1 = rng.standard_normal(n * n_iter).astype(np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=n_iter)
    assert_same_on_both(r0, r1)
    want = emulate(a0, a1)
    for k in range(n_iter):
        sl = slice(k * n, (k + 1) * n)
        assert_bitwise(r0[sl], want[sl], f"reduction {k}")
    st = allreduce.allreduce_stats()
    assert st.paths["ce"].calls == n_iter and st.ce_buffer_allocs == 1


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("n, n_alt, n_iter", [(3 * SLOT_ELEMS + 5, 7, 40), (2 * SLOT_ELEMS, SLOT_ELEMS + 1, 30),
                                              (SLOT_ELEMS + 9, CHUNK_ELEMS, 60)])
def test_race_hunt_alternating_sizes(knobs: pytest.MonkeyPatch, n: int, n_alt: int, n_iter: int) -> None:
    """Back-to-back reductions of two sizes with different numbers of rounds, as a model's prompt
    and output reductions come: the slots in use shift from one reduction to the next."""
    force_ce(knobs)
    rng = np.random.default_rng(n_alt)
    a0 = rng.standard_normal(n * n_iter).astype(np.float32)
    a1 = rng.standard_normal(n * n_iter).astype(np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=n_iter, n_alt=n_alt)
    want = emulate(a0, a1)
    for k in range(n_iter):
        m = n_alt if k % 2 else n
        sl = slice(k * n, k * n + m)
        assert_same_on_both(r0[sl], r1[sl])
        assert_bitwise(r0[sl], want[sl], f"reduction {k} ({m} elements)")
        rest = slice(k * n + m, (k + 1) * n)
        assert np.array_equal(r0[rest], a0[rest]) and np.array_equal(r1[rest], a1[rest])
    assert allreduce.allreduce_stats().paths["ce"].calls == n_iter


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("host_wait", ["0", "1"])
@pytest.mark.parametrize("n, n_alt, n_iter", [(4096, 0, 512), (4096, 1000, 256), (MIN_BYTES_DEFAULT // 4 - 4, 0, 24)])
def test_race_hunt_internal_pipeline(knobs: pytest.MonkeyPatch, host_wait: str, n: int, n_alt: int,
                                     n_iter: int) -> None:
    """A decode token's reductions: small ones back to back on the internal pipeline (below the copy engines'
    threshold), which reuses its two staging slots without waiting on the host (GGML_CUDA_AR_HOST_WAIT=1: with
    upstream's wait). Each must equal its own emulation (BF16 on the wire, summed in F32) bitwise."""
    knobs.setenv("GGML_CUDA_AR_CE", "1")  # small reductions then go to the internal pipeline, also with peer access
    knobs.setenv("GGML_CUDA_AR_LL_MAX_BYTES", "0")  # ... and not to the low-latency path
    knobs.setenv("GGML_CUDA_AR_HOST_WAIT", host_wait)
    rng = np.random.default_rng(n + n_alt + int(host_wait))
    a0 = rng.standard_normal(n * n_iter).astype(np.float32)
    a1 = rng.standard_normal(n * n_iter).astype(np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=n_iter, n_alt=n_alt)
    want = emulate(a0, a1)
    for k in range(n_iter):
        m = n_alt if n_alt and k % 2 else n
        sl = slice(k * n, k * n + m)
        assert_same_on_both(r0[sl], r1[sl])
        assert_bitwise(r0[sl], want[sl], f"reduction {k} ({m} elements)")
    st = allreduce.allreduce_stats()
    assert st.paths["internal"].calls == n_iter and st.paths["ce"].calls == 0


# ---------------------------------------------------------------------------------------------
# GPU: the low-latency path (small reductions where the copy engines are on)

LL_SIZES = [1, 2, 3, 4, 5, 7, 1001, 4096, 4097, 5120, LL_MAX_BYTES_DEFAULT // 4 - 1, LL_MAX_BYTES_DEFAULT // 4]


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("bf16", [True, False])
@pytest.mark.parametrize("n", LL_SIZES)
def test_ll_bitwise(knobs: pytest.MonkeyPatch, n: int, bf16: bool) -> None:
    """Every size up to the default limit, odd tails (4 BF16 or 2 F32 elements per 16-byte line), special values."""
    use_ll(knobs, bf16)
    a0, a1 = special_data(n, 11), special_data(n, 12)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1)
    assert_same_on_both(r0, r1)
    assert_bitwise(r0, emulate(a0, a1, bf16=bf16), f"n={n}")
    st = allreduce.allreduce_stats()
    assert st.paths["ll"].calls == 1 and st.paths["ll"].bytes == 4 * n and st.total_calls == 1


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("bf16", [True, False])
@pytest.mark.parametrize("n, n_alt, n_iter", [(4096, 0, 1024), (4096, 1001, 512), (LL_MAX_BYTES_DEFAULT // 4, 3, 64)])
def test_race_hunt_ll(knobs: pytest.MonkeyPatch, n: int, n_alt: int, n_iter: int, bf16: bool) -> None:
    """A decode's reductions back to back without host syncs: the two slots are rewritten every other reduction,
    with no host wait; each reduction must equal its own emulation bitwise."""
    use_ll(knobs, bf16)
    rng = np.random.default_rng(n + n_alt + bf16)
    a0 = rng.standard_normal(n * n_iter).astype(np.float32)
    a1 = rng.standard_normal(n * n_iter).astype(np.float32)
    r0, r1 = allreduce_rig.allreduce_run(a0, a1, n_iter=n_iter, n_alt=n_alt)
    want = emulate(a0, a1, bf16=bf16)
    for k in range(n_iter):
        m = n_alt if n_alt and k % 2 else n
        sl = slice(k * n, k * n + m)
        assert_same_on_both(r0[sl], r1[sl])
        assert_bitwise(r0[sl], want[sl], f"reduction {k} ({m} elements)")
    assert allreduce.allreduce_stats().paths["ll"].calls == n_iter


@pytest.mark.gpu
@needs_two_gpus
def test_ll_routing_by_size_and_knob(knobs: pytest.MonkeyPatch) -> None:
    """GGML_CUDA_AR_LL_MAX_BYTES is the largest F32 tensor it takes; 0 (AllReduceParams(ll_max_bytes=0)) or the
    copy engines off: none."""
    use_ll(knobs)
    knobs.setenv("GGML_CUDA_AR_LL_MAX_BYTES", str(4 * 1002))
    for n in (1000, 1004):  # multiples of 16 bytes: the internal pipeline takes no other (no NCCL on one GPU as two)
        allreduce_rig.allreduce_run(np.ones(n, np.float32), np.ones(n, np.float32))
    st = allreduce.allreduce_stats()
    assert st.paths["ll"].calls == 1 and st.paths["ll"].bytes == 4000
    assert st.paths["internal"].calls + st.paths["nccl"].calls == 1

    for knob_args in ({"copy_engines": True, "ll_max_bytes": 0}, {"copy_engines": False}):
        allreduce.reset_allreduce_stats()
        r0, _ = allreduce_rig.allreduce_run(np.ones(64, np.float32), np.full(64, 2.0, np.float32),
                                            allreduce=allreduce.AllReduceParams(**knob_args))
        np.testing.assert_array_equal(r0, 3.0)
        st = allreduce.allreduce_stats()
        assert st.paths["ll"].calls == 0 and st.paths["internal"].calls + st.paths["nccl"].calls == 1, knob_args


@pytest.mark.parametrize("kwargs", [{"ll_max_bytes": -1}, {"ll_max_bytes": (4 << 20) + 1}, {"ll_max_bytes": 1.0}])
def test_allreduce_params_validate_ll_max_bytes(knobs: pytest.MonkeyPatch, kwargs: dict) -> None:
    with pytest.raises(TypeError if isinstance(kwargs["ll_max_bytes"], float) else ValueError):
        allreduce.AllReduceParams(**kwargs)
    assert allreduce.AllReduceParams(ll_max_bytes=0).environment()["GGML_CUDA_AR_LL_MAX_BYTES"] == "0"


@pytest.mark.parametrize("kwargs", [{"n_alt": -1}, {"n_alt": 5}, {"n_iter": 0}, {"n_iter": 3}])
def test_run_rejects_bad_arguments_in_every_build(kwargs: dict) -> None:
    """Checked before the CUDA lookup: a ValueError with or without the CUDA backend."""
    with pytest.raises(ValueError):
        allreduce_rig.allreduce_run(np.zeros(4, np.float32), np.zeros(4, np.float32), **kwargs)


@pytest.mark.gpu
@needs_two_gpus
def test_greedy_tokens_equal_on_every_path(knobs: pytest.MonkeyPatch, tiny_model: Path) -> None:
    """End to end: greedy generation under -sm tensor gives the same tokens with every reduction on
    the copy engines, with NCCL only (the internal pipeline in a build without NCCL), and with the
    defaults (the counters prove which path ran)."""
    runs = {}
    for name, knob_args in {"ce": {"copy_engines": True, "min_bytes": 1}, "nccl": {"copy_engines": False},
                            "default": {}}.items():
        allreduce.reset_allreduce_stats()
        with Llama(tiny_model, split_mode="tensor", n_ctx=256, flash_attn=True,
                   allreduce=allreduce.AllReduceParams(**knob_args)) as llm:
            runs[name] = list(llm.generate(llm.tokenize("abc"), max_tokens=24, temperature=0.0, stop_on_eog=False))
            routing = llm.allreduce_routing()
        st = allreduce.allreduce_stats()
        assert routing.paths == st.paths  # the one context of the process counted every reduction
        if name == "ce":
            assert st.paths["ce"].calls > 0 and st.paths["nccl"].calls == 0
        elif name == "nccl":  # NCCL, or the internal pipeline where NCCL is not built or not there (one GPU as two)
            assert st.paths["ce"].calls == 0 and st.paths["nccl"].calls + st.paths["internal"].calls > 0
    assert runs["ce"] == runs["nccl"] == runs["default"]


@pytest.mark.gpu
@needs_two_gpus
def test_decode_logits_of_the_low_latency_path_equal_the_copy_engines(knobs: pytest.MonkeyPatch,
                                                                      tiny_model: Path) -> None:
    """Both paths round each part to BF16 and add in F32 without flushing denormals, so a model's logits under
    -sm tensor are bitwise the same whether a decode's reductions take the low-latency path (the default) or the
    copy engines (min_bytes=1). The tiny model's reductions are all small: every one takes the path of its run."""
    runs = {}
    for name, knob_args in {"ll": {"copy_engines": True}, "ce": {"copy_engines": True, "min_bytes": 1}}.items():
        allreduce.reset_allreduce_stats()
        with Llama(tiny_model, split_mode="tensor", n_ctx=256, n_batch=64, flash_attn=True,
                   allreduce=allreduce.AllReduceParams(**knob_args)) as llm:
            tokens = llm.tokenize("the quick brown fox")
            rows = [llm.eval(tokens)[-1]]
            for _ in range(16):
                rows.append(llm.eval([int(np.argmax(rows[-1]))])[-1])
            runs[name] = np.stack(rows)
        st = allreduce.allreduce_stats()
        assert st.paths[name].calls > 0 and st.paths[name].calls == st.total_calls, st
    assert np.array_equal(runs["ll"].view(np.uint32), runs["ce"].view(np.uint32))


@pytest.mark.gpu
@needs_two_gpus
def test_two_contexts_each_route_by_their_own_settings(knobs: pytest.MonkeyPatch, tiny_model: Path) -> None:
    """Two contexts over the same two devices at once, one with every reduction forced onto the copy engines and
    one with the copy engines off, decoding in turn: each context's own counters show its own path, and the
    process-wide counters are their sum."""
    forced = allreduce.AllReduceParams(copy_engines=True, min_bytes=1)
    off = allreduce.AllReduceParams(copy_engines=False)
    with Llama(tiny_model, split_mode="tensor", n_ctx=256, flash_attn=True, allreduce=forced) as ce, \
            Llama(tiny_model, split_mode="tensor", n_ctx=256, flash_attn=True, allreduce=off) as base:
        tokens = ce.tokenize("the quick brown fox")
        for llm in (ce, base, ce, base):
            llm.eval(tokens)
        on_ce, on_base = ce.allreduce_routing(), base.allreduce_routing()
    st = allreduce.allreduce_stats()
    assert on_ce.copy_engines is True and on_ce.copy_engines_on and on_ce.min_bytes == 1, on_ce
    assert on_ce.paths["ce"].calls > 0 and on_ce.paths["ce"].calls == on_ce.total_calls, on_ce
    assert on_base.copy_engines is False and not on_base.copy_engines_on, on_base
    assert on_base.paths["ce"].calls == on_base.paths["ll"].calls == 0, on_base
    assert on_base.paths["nccl"].calls + on_base.paths["internal"].calls > 0, on_base
    assert {p: on_ce.paths[p].calls + on_base.paths[p].calls for p in allreduce.PATHS} == \
        {p: st.paths[p].calls for p in allreduce.PATHS}
    assert not any(k in os.environ for k in KNOBS)
