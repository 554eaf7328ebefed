"""AllReduce settings per context (llama/include/pyllama-so-context-allreduce.h): each Llama hands its
AllReduceParams to its own comm contexts through the C API, and llm.allreduce_routing() reads them back from
there. This module checks the plumbing on two CPU virtual devices, whose comm context takes the settings and
reports them (acting on none); tests/multi_device/test_allreduce_ce.py has the CUDA effect (each context's own
counters show its own path)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import pyllama_so
from pyllama_so import Llama, archs
from pyllama_so.allreduce import AllReduceParams, AllReduceRouting
from pyllama_so.config import ContextParams, TensorSplitOnlyError

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last

KNOBS = ("GGML_CUDA_AR_CE", "GGML_CUDA_AR_CE_MIN_BYTES", "GGML_CUDA_AR_CE_CHUNK_BYTES", "GGML_CUDA_AR_LL_MAX_BYTES")
ENV_CHUNK = 256 << 10  # the command line's chunk size in these tests: the default of every context that sets none


@pytest.fixture(scope="module")
def split() -> list[float]:
    """A tensor split over CPUV0 and CPUV1 only (as tests/multi_device/test_split_overlap_api.py makes it)."""
    archs.ensure_virtual_devices()
    return [float(d["name"] in ("CPUV0", "CPUV1")) for d in pyllama_so.devices() if d["type"] in ("gpu", "igpu")]


@pytest.fixture
def command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables as a command line would leave them: only the chunk size set."""
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GGML_CUDA_AR_CE_CHUNK_BYTES", str(ENV_CHUNK))


def tensor_llama(model: Path, split: list[float], **kw: object) -> Llama:
    return Llama(model, split_mode="tensor", tensor_split=split, flash_attn=True, n_ctx=256, n_batch=128,
                 n_ubatch=64, n_threads=2, **kw)  # type: ignore[arg-type]


def test_two_contexts_report_their_own_settings(tiny_model: Path, split: list[float], command_line: None) -> None:
    """Three contexts alive at once, decoding in turn: each reports the settings it was given, a knob it left
    unset from the variable (or the built-in default), and nothing writes the environment."""
    forced = AllReduceParams(copy_engines=True, min_bytes=1, ll_max_bytes=0)
    off = AllReduceParams(copy_engines=False, chunk_bytes=2 << 20)
    prompt = list(range(1, 100))
    with tensor_llama(tiny_model, split, allreduce=forced) as a, tensor_llama(tiny_model, split, allreduce=off) as b, \
            tensor_llama(tiny_model, split) as c:
        for llm in (a, b, c):
            llm.eval(prompt[:50])
        a.eval(prompt[50:])  # after the others made and used theirs
        routing = {name: llm.allreduce_routing() for name, llm in (("forced", a), ("off", b), ("default", c))}
    assert routing["forced"] == AllReduceRouting(comm_contexts=1, copy_engines=True, min_bytes=1, chunk_bytes=ENV_CHUNK,
                                                 ll_max_bytes=0)
    assert routing["off"] == AllReduceRouting(comm_contexts=1, copy_engines=False, min_bytes=512 << 10,
                                              chunk_bytes=2 << 20, ll_max_bytes=64 << 10)
    assert routing["default"] == AllReduceRouting(comm_contexts=1, copy_engines=None, min_bytes=512 << 10,
                                                  chunk_bytes=ENV_CHUNK, ll_max_bytes=64 << 10)
    # the CPU virtual devices' reductions are none of the CUDA paths, and no copy engine is on
    assert all(r.total_calls == 0 and not r.copy_engines_on for r in routing.values())
    assert os.environ["GGML_CUDA_AR_CE_CHUNK_BYTES"] == str(ENV_CHUNK)
    assert not any(name in os.environ for name in KNOBS if name != "GGML_CUDA_AR_CE_CHUNK_BYTES")


def test_both_split_overlap_lanes_take_the_settings(tiny_model: Path, split: list[float], command_line: None) -> None:
    """With split overlap each lane's Meta backend has its own comm context: both take the context's settings."""
    params = AllReduceParams(copy_engines=True, min_bytes=4096, chunk_bytes=1 << 20, ll_max_bytes=1 << 20)
    with tensor_llama(tiny_model, split, split_overlap=True, allreduce=params) as llm:
        llm.eval(list(range(1, 129)))  # two ubatches, one on each lane
        assert llm.split_overlap_stats()["ubatches"] == [1, 1]
        routing = llm.allreduce_routing()
    assert routing == AllReduceRouting(comm_contexts=2, copy_engines=True, min_bytes=4096, chunk_bytes=1 << 20,
                                       ll_max_bytes=1 << 20)


def test_without_a_comm_context_nothing_reports(tiny_model: Path, split: list[float],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """GGML_CPU_VIRTUAL_COMM=0: the devices make no comm context (every reduction takes the Meta backend's
    generic path), so no one takes the settings and the report is empty."""
    monkeypatch.setenv("GGML_CPU_VIRTUAL_COMM", "0")  # read when a context makes its comm context
    with tensor_llama(tiny_model, split, allreduce=AllReduceParams(copy_engines=True)) as llm:
        llm.eval([1, 2, 3])
        assert llm.allreduce_routing() == AllReduceRouting()


def test_allreduce_needs_tensor_split(tiny_model: Path) -> None:
    with pytest.raises(TensorSplitOnlyError, match='allreduce needs split_mode="tensor"'):
        Llama(tiny_model, n_ctx=256, allreduce=AllReduceParams())
    with pytest.raises(TypeError, match="allreduce must be an AllReduceParams"):
        ContextParams(allreduce={"copy_engines": True})  # type: ignore[arg-type]
    with Llama(tiny_model, n_ctx=256) as llm:  # layer split: no Meta backend, no comm context
        assert llm.allreduce_routing() == AllReduceRouting()


def test_the_package_writes_no_environment_variable() -> None:
    """Settings reach the native side as parameters: nothing in pyllama_so sets or removes a variable of the
    process (a child process gets its own environment)."""
    package = Path(pyllama_so.__file__).resolve().parent
    write = re.compile(r"os\.environ\[[^\]]*\]\s*=(?!=)|os\.environ\.(pop|update|setdefault|clear)\(|"
                       r"os\.(putenv|unsetenv)\(|del\s+os\.environ")
    sources = [p for ext in ("py", "pyx", "pxi") for p in package.rglob(f"*.{ext}")]
    assert len(sources) > 20
    found = [f"{p.relative_to(package)}:{n}" for p in sources
             for n, line in enumerate(p.read_text().splitlines(), 1) if write.search(line)]
    assert found == []
