"""test-llama-archs in pytest: every architecture x every device configuration (pyllama_so.archs).

The default run covers pyllama_so.archs.DEFAULT_ARCHS; `-m slow` runs the others, `-m ''` all of them. Rows that
upstream skips are skipped with its reason; a summary table like upstream's is printed at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import pyllama_so
from pyllama_so import archs

MAKES_CPU_VIRTUAL_DEVICES = True  # conftest runs this module last
CONFIGS = archs.device_configs()
_RUNNER = archs.Runner()
_ROWS: list[archs.Row] = []


def _params() -> list:
    out = []
    for arch, moe, mqa in archs.cases(archs.select_archs()):
        for cfg in CONFIGS:
            marks = []
            if arch not in archs.DEFAULT_ARCHS:
                marks.append(pytest.mark.slow)
            if cfg.gpu:
                marks.append(pytest.mark.gpu)
            out.append(pytest.param(arch, moe, mqa, cfg, marks=marks,
                                    id=f"{arch}-{archs.variant_name(moe, mqa)}-{cfg.label.replace(' ', '_')}"))
    return out


@pytest.fixture(scope="module", autouse=True)
def summary_table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if _ROWS:
        text = "\n" + archs.format_table(_ROWS) + "\n" + archs.summary(_ROWS) + "\n"
        capman = request.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled():  # teardown output is captured otherwise
            print(text, flush=True)


@pytest.mark.parametrize("arch,moe,mqa,cfg", _params())
def test_arch(request: pytest.FixtureRequest, arch: str, moe: bool, mqa: bool, cfg: archs.DeviceConfig) -> None:
    row = _RUNNER.run(arch, moe, cfg, mqa)
    _ROWS.append(row)
    if not row.executed:
        pytest.skip(row.skip_reason)
    assert row.ok, f"{row.nmse_status} (NMSE {row.nmse}), roundtrip {row.roundtrip_status} {row.error}"


def test_default_subset_runs_tensor_split_on_virtual_devices() -> None:
    """The Meta rows over 2 and 3 virtual devices exist, each without and with split overlap, so tensor
    split and its lanes are tested without a GPU."""
    metas = [(len(c.devices), c.split_overlap, c.label) for c in CONFIGS if c.tensor and not c.gpu]
    assert metas == [(2, False, "Meta(CPUV0,CPUV1)"), (2, True, "Meta(CPUV0,CPUV1) -so"),
                     (3, False, "Meta(CPUV0,CPUV1,CPUV2)"), (3, True, "Meta(CPUV0,CPUV1,CPUV2) -so")]
    assert archs.testing.arch_flags("llama")["sm_tensor"]


def test_default_subset_has_mqa_variants_that_decode_single_tokens() -> None:
    """The default subset runs MQA variants (one KV head for four query heads, which tensor split must copy) of
    its architectures with attention (qwen3's dense fixture is MQA already), and every row decodes single
    tokens after the batch: a decode step builds other graphs than a batch (an MQA layer aborted only there)."""
    assert {arch for arch, _, mqa in archs.cases(archs.DEFAULT_ARCHS) if mqa} == {"llama", "gemma3", "lfm2"}
    runner = archs.Runner()
    model = runner._model("gemma3", False, [], "layer", mqa=True)
    try:
        ctx = runner._context(model, False)
        try:
            logits = runner.decode(ctx, False)
            assert ctx.n_past() == archs.N_TOKENS + archs.N_DECODE  # the steps appended one token each
        finally:
            ctx.free()
    finally:
        model.free()
    assert archs.N_DECODE >= 1 and logits.shape[0] == archs.N_TOKENS + archs.N_DECODE


def _so_config(n_devices: int) -> archs.DeviceConfig:
    return next(c for c in CONFIGS if c.split_overlap and not c.gpu and len(c.devices) == n_devices)


@pytest.mark.parametrize("n_devices", [2, 3])
def test_split_overlap_rows_run_both_lanes(n_devices: int) -> None:
    """The runner's 128 tokens in ubatches of 64 put one ubatch on each lane, so a -so row tests the lanes."""
    cfg = _so_config(n_devices)
    runner = archs.Runner()
    model = runner._model("llama", False, cfg.devices, cfg.split_mode)
    try:
        ctx = runner._context(model, False, cfg.split_overlap)
        try:
            archs.testing.arch_logits(ctx, runner.tokens)
            stats = ctx.split_overlap_stats()
        finally:
            ctx.free()
    finally:
        model.free()
    assert stats["enabled"] and stats["reason"] == "on", stats
    assert stats["ubatches"] == [1, 1], stats


@pytest.mark.parametrize("n_devices", [2, 3])
def test_split_overlap_row_is_compared_bitwise_with_meta(n_devices: int) -> None:
    """A -so row fails when its logits are not bitwise the plain Meta row's, even by one ulp in one logit."""
    cfg = _so_config(n_devices)
    runner = archs.Runner()
    plain = next(c for c in CONFIGS if c.tensor and not c.split_overlap and c.devices == cfg.devices)
    assert runner.run("qwen3", False, plain).ok
    assert runner.run("qwen3", False, cfg).ok  # against the logits the plain row left in the runner
    key = ("qwen3", False, False, cfg.devices)
    ref = runner._meta[key]
    ref[5, 7] = np.nextafter(ref[5, 7], np.inf)  # the cache holds the row's array
    row = runner.run("qwen3", False, cfg)
    assert row.executed and not row.ok, row
    assert row.nmse_status == "FAIL (vs. Meta)" and row.nmse is not None and row.nmse <= archs.NMSE_MAX, row
    assert f"in 1 of {archs.N_TOKENS + archs.N_DECODE} logit rows" in row.error and "bitwise" in row.error, row.error


def test_split_overlap_row_fails_when_lanes_stay_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices without events (the test-only GGML_CPU_VIRTUAL_NO_EVENTS) keep the lanes off: the -so row fails
    saying so, where equal logits alone would pass it; the plain Meta row is unaffected."""
    monkeypatch.setenv("GGML_CPU_VIRTUAL_NO_EVENTS", "1")
    cfg = _so_config(2)
    runner = archs.Runner()
    plain = next(c for c in CONFIGS if c.tensor and not c.split_overlap and c.devices == cfg.devices)
    assert runner.run("llama", False, plain).ok
    row = runner.run("llama", False, cfg)
    assert row.executed and not row.ok, row
    assert row.nmse_status == "FAIL (lanes off)", row
    assert row.error == "split overlap stays off: a device has no events", row.error


@pytest.mark.parametrize("n_devices", [2, 3])
def test_meta_survives_delayed_device(monkeypatch: pytest.MonkeyPatch, n_devices: int) -> None:
    """Delaying every graph on all but device 0 changes timing only: results stay equal to the CPU's."""
    monkeypatch.setenv("GGML_CPU_VIRTUAL_DELAY_US", "1000")  # read per backend, i.e. per model context
    cfg = next(c for c in CONFIGS if c.tensor and not c.gpu and len(c.devices) == n_devices)
    row = _RUNNER.run("llama", False, cfg)  # the variables act on the virtual devices, not on its CPU reference
    assert row.executed and row.ok, (row.nmse_status, row.nmse, row.error)


@pytest.mark.parametrize("n_devices", [2, 3])
def test_suite_catches_broken_event_wait(monkeypatch: pytest.MonkeyPatch, n_devices: int) -> None:
    """With event waits that return at once (the test-only GGML_CPU_VIRTUAL_BREAK_EVENT_WAIT) and a
    delayed device, AllReduce reads partial sums before they exist: the Meta row must fail."""
    monkeypatch.setenv("GGML_CPU_VIRTUAL_DELAY_US", "1000")
    monkeypatch.setenv("GGML_CPU_VIRTUAL_BREAK_EVENT_WAIT", "1")
    cfg = next(c for c in CONFIGS if c.tensor and not c.gpu and len(c.devices) == n_devices)
    row = _RUNNER.run("llama", False, cfg)  # the variables act on the virtual devices, not on its CPU reference
    assert row.executed and not row.ok and row.nmse is not None, row
    assert not row.nmse <= archs.NMSE_MAX, row  # NaN counts as a failure too


def test_cli_exit_code() -> None:
    assert archs.main(["-a", "^llama$", "-b", "CPUV1"]) == 0


def test_cli_fails_on_broken_event_wait(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GGML_CPU_VIRTUAL_DELAY_US", "1000")
    monkeypatch.setenv("GGML_CPU_VIRTUAL_BREAK_EVENT_WAIT", "1")
    assert archs.main(["-a", "^qwen3$"]) == 1
    out = capsys.readouterr().out
    assert "Meta(CPUV0,CPUV1)" in out and "FAIL" in out and "failed" in out


def test_cli_shows_split_overlap_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert archs.main(["-a", "^llama$"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "Meta(CPUV" in line and "-so |" in line]
    assert len(rows) == 6 and all("OK (" in r for r in rows), out  # dense, MoE and MQA, over 2 and 3 devices


def test_arch_list_matches_upstream_exclusions() -> None:
    names = archs.testing.arch_names()
    assert "llama" in names and "mamba" in names
    for excluded in ("gemma4", "eagle3"):
        assert excluded not in names


def test_llama_tensor_split_on_virtual_devices(tiny_model: Path) -> None:
    """The user-facing path: Llama(split_mode="tensor") over the virtual devices equals the CPU."""
    from pyllama_so import Llama

    def logits(**kw: object) -> np.ndarray:
        with Llama(tiny_model, n_ctx=256, flash_attn=True, **kw) as llm:  # type: ignore[arg-type]
            return llm.eval(llm.tokenize("tensor split without a GPU"))

    ref = logits(n_gpu_layers=0, split_mode="none")
    archs.ensure_virtual_devices()
    # llama.cpp's tensor split spans every device whose buffer type is not the CPU's, in registry
    # order (GPUs first); this splits over CPUV0 and CPUV1 only (on a GPU host, the GPUs get 0)
    gpu_names = [d["name"] for d in pyllama_so.devices() if archs._is_gpu(d)]
    got = logits(split_mode="tensor", tensor_split=[float(n in ("CPUV0", "CPUV1")) for n in gpu_names])
    assert archs.nmse(ref, got) < archs.NMSE_MAX


def python(*args: str, virtual_devices: str | None = None) -> subprocess.CompletedProcess[str]:
    """A fresh process (virtual devices cannot be removed from one), GGML_CPU_VIRTUAL_DEVICES as given."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_VIRTUAL_DEVICES"}
    if virtual_devices is not None:
        env["GGML_CPU_VIRTUAL_DEVICES"] = virtual_devices
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_cli_bad_regex_is_one_line() -> None:
    res = python("-m", "pyllama_so.archs", "-a", "([")
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m pyllama_so.archs: error: -a '(['"), res.stderr


def test_cli_with_fewer_virtual_devices_skips_what_it_cannot_run() -> None:
    """Two virtual devices made before the suite: the rows that need a third are skipped, not failed."""
    res = python("-m", "pyllama_so.archs", "-a", "^qwen3$", virtual_devices="2")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {line.split("|")[2].strip(): line for line in res.stdout.splitlines() if line.startswith("|")}
    for label in ("CPUV2", "Meta(CPUV0,CPUV1,CPUV2)", "Meta(CPUV0,CPUV1,CPUV2) -so"):
        assert rows[label].split("|")[4].strip() == "SKIP", rows[label]
    assert "OK" in rows["Meta(CPUV0,CPUV1)"] and "OK" in rows["Meta(CPUV0,CPUV1) -so"]
    assert "no device CPUV2: only 2 CPU virtual devices exist" in res.stderr
    assert "Summary: 5 executed, 0 failed, 3 skipped" in res.stdout


@pytest.mark.parametrize("value, made, said", [
    ("abc", 0, "GGML_CPU_VIRTUAL_DEVICES=abc is not a count >= 0: using 0"),
    ("-1", 0, "GGML_CPU_VIRTUAL_DEVICES=-1 is not a count >= 0: using 0"),
    ("2x", 0, "GGML_CPU_VIRTUAL_DEVICES=2x is not a count >= 0: using 0"),
    ("100000", 16, "GGML_CPU_VIRTUAL_DEVICES=100000 is more than the 16 virtual devices supported: using 16"),
    ("3", 3, None),
])
def test_virtual_device_count_from_env_is_checked(value: str, made: int, said: str | None) -> None:
    """A value that is not a count, or one above the maximum, is warned about once (through the log at its
    default level), naming what was used instead."""
    code = "import pyllama_so as p\nfor _ in range(2): print(sum(d['backend'] == 'CPUV' for d in p.devices()))"
    res = python("-c", code, virtual_devices=value)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(made)] * 2
    warnings = [line for line in res.stderr.splitlines() if "GGML_CPU_VIRTUAL_DEVICES" in line]
    if said is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and said in warnings[0], res.stderr
