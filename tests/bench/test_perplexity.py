"""python -m pyllama_so.perplexity: llama-perplexity's chunks and scoring (checked against a direct computation on
the tiny synthetic model), the base file and the KL divergence against it (exact with a top k that covers the
vocabulary, a lower bound below it), split modes and split overlap over CPU virtual devices, the command line's
output and errors, and a sane perplexity of a real model on the bundled text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.logits_reference import log_softmax
from helpers.real_models import real_model
from pyllama_so import _llama, synth
from pyllama_so.perplexity import TEXT, Settings, run
from pyllama_so.perplexity.base_file import BaseFile, scored_per_chunk

N_CTX = 64
TEXT_HEAD = TEXT.read_text(encoding="utf-8")[:6000]  # several chunks of 64 tokens of the tiny model


@pytest.fixture(scope="module")
def other_tiny(model_dir: Path) -> Path:
    """The tiny shape with other random weights: same vocabulary, other distributions."""
    return synth.write_model(model_dir / "tiny-f16-seed1.gguf", "tiny", "f16", seed=1, quiet=True)


def _direct_logits(model_path: Path, tokens: np.ndarray, n_chunk: int) -> list[np.ndarray]:
    """Each chunk's logits of every position, evaluated as llama-perplexity does: empty cache, BOS first."""
    model = _llama.Model.load(str(model_path), n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2)
    try:
        assert model.add_bos
        out = []
        for i in range(n_chunk):
            chunk = tokens[i * N_CTX:(i + 1) * N_CTX].copy()
            chunk[0] = model.token_bos
            ctx.clear()
            out.append(ctx.decode(chunk, all_logits=True))
        return out
    finally:
        ctx.free()
        model.free()


def _tokens(model_path: Path) -> np.ndarray:
    model = _llama.Model.load(str(model_path), n_gpu_layers=0)
    try:
        return model.tokenize(TEXT_HEAD)
    finally:
        model.free()


def test_scores_the_second_half_of_each_chunk(tiny_model: Path) -> None:
    tokens = _tokens(tiny_model)
    settings = Settings(model=str(tiny_model), n_ctx=N_CTX, n_chunks=3, n_gpu_layers=0, n_threads=2)
    s = run(settings, text=TEXT_HEAD)
    assert s.n_chunk == 3 and s.n_scored == 3 * scored_per_chunk(N_CTX) == 3 * 31
    first = N_CTX // 2
    want = []
    for i, logits in enumerate(_direct_logits(tiny_model, tokens, 3)):
        lp = log_softmax(logits[first:N_CTX - 1])
        targets = tokens[i * N_CTX + first + 1:(i + 1) * N_CTX]
        want.append(-lp[np.arange(len(targets)), targets])
    np.testing.assert_allclose(s.nll, np.concatenate(want), rtol=1e-9, atol=1e-9)
    ppl, err = s.ppl
    assert ppl == pytest.approx(float(np.exp(np.concatenate(want).mean())), rel=1e-12) and err > 0


def test_every_whole_chunk_by_default(tiny_model: Path) -> None:
    n_tokens = len(_tokens(tiny_model))
    s = run(Settings(model=str(tiny_model), n_ctx=N_CTX, n_gpu_layers=0, n_threads=2), text=TEXT_HEAD)
    assert s.n_chunk == n_tokens // N_CTX > 3


def _kld_full(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


@pytest.mark.parametrize("top_k", [512, 8])
def test_kl_divergence_against_a_base_file(tiny_model: Path, other_tiny: Path, tmp_path: Path, top_k: int) -> None:
    """KLD(base || other model) per position: the full KLD when top k covers the vocabulary (512 tokens), a lower
    bound of it with 8; the base against itself is exactly 0 with the same top token everywhere."""
    base_path = tmp_path / "base.npz"
    kw = dict(n_ctx=N_CTX, n_chunks=2, n_gpu_layers=0, n_threads=2, top_k=top_k)
    run(Settings(model=str(tiny_model), **kw), text=TEXT_HEAD, base_out=base_path)
    base = BaseFile.load(base_path)
    assert base.top_k == top_k and base.n_chunk == 2 and base.rows.top_ids.shape == (62, top_k)

    same = run(Settings(model=str(tiny_model), **kw), base_in=base).kld()
    assert same is not None and same["kld_max"] == 0.0 and same["same_top"] == 1.0 and same["ppl_ratio"] == 1.0

    got = run(Settings(model=str(other_tiny), **kw), base_in=base)
    tokens = base.tokens
    first = N_CTX // 2
    pairs = zip(_direct_logits(tiny_model, tokens, 2), _direct_logits(other_tiny, tokens, 2), strict=True)
    full = np.concatenate([_kld_full(p[first:-1], q[first:-1]) for p, q in pairs])
    assert got.comparison is not None
    if top_k >= 512:
        np.testing.assert_allclose(got.comparison.kld, full, rtol=1e-4, atol=1e-6)
        assert got.kld()["base_rest_mass"] == 0.0
    else:
        assert (got.comparison.kld <= full + 1e-6).all() and got.comparison.kld.mean() > 0.1 * full.mean()
    k = got.kld()
    assert k["kld_mean"] == pytest.approx(got.comparison.kld.mean()) and k["kld_max"] >= k["kld_p99"] >= k["kld_median"]
    assert k["ppl_ratio"] == pytest.approx(got.ppl[0] / k["ppl_base"], rel=1e-6)  # float32 base values


def _cli(*args: str, virtual_devices: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_") and k != "GGML_CPU_VIRTUAL_DEVICES"}
    if virtual_devices:
        env["GGML_CPU_VIRTUAL_DEVICES"] = str(virtual_devices)
    return subprocess.run([sys.executable, "-m", "pyllama_so.perplexity", *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_cli_tensor_split_and_split_overlap_over_virtual_devices(tiny_model: Path, tmp_path: Path) -> None:
    """A base on the CPU; tensor split over 2 CPU virtual devices is within rounding of it (F16 weights), and split
    overlap (two ubatches of 64 per chunk, one per lane) against a tensor-split base is bitwise the same."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT_HEAD)
    common = ["-m", str(tiny_model), "-f", str(text), "-c", "128", "--chunks", "3", "-t", "2", "-ub", "64"]
    cpu_base, meta_base = tmp_path / "cpu.npz", tmp_path / "meta.npz"
    res = _cli(*common, "-ngl", "0", "-sm", "none", "--kl-divergence-base", str(cpu_base))
    assert res.returncode == 0, res.stderr
    assert "Final estimate: PPL = " in res.stdout and f"saved the base to {cpu_base}" in res.stdout
    assert "perplexity: chunk 3/3" in res.stderr  # progress, one line per update off a terminal

    res = _cli(*common, "-sm", "tensor", "--kl-divergence-base", str(cpu_base), "--kl-divergence", "-o", "json",
               virtual_devices=2)
    assert res.returncode == 0, res.stderr
    k = json.loads(res.stdout)["kld"]
    assert k["kld_max"] < 1e-4 and k["same_top"] == 1.0 and abs(k["ppl_ratio"] - 1) < 1e-3, k

    res = _cli(*common, "-sm", "tensor", "--kl-divergence-base", str(meta_base), virtual_devices=2)
    assert res.returncode == 0, res.stderr
    res = _cli(*common, "-sm", "tensor", "-so", "1", "--kl-divergence-base", str(meta_base), "--kl-divergence",
               "-o", "json", virtual_devices=2)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["split_overlap_stats"]["enabled"] and all(out["split_overlap_stats"]["ubatches"]), out
    assert out["kld"]["kld_max"] == 0.0 and out["kld"]["same_top"] == 1.0, out["kld"]


def test_cli_errors(tiny_model: Path, tmp_path: Path) -> None:
    res = _cli("-m", str(tiny_model), "--kl-divergence")
    assert res.returncode == 2 and "--kl-divergence needs --kl-divergence-base FILE" in res.stderr
    short = tmp_path / "short.txt"
    short.write_text("too short")
    res = _cli("-m", str(tiny_model), "-f", str(short), "-c", "64")
    assert res.returncode == 1 and "fewer than one chunk of n_ctx=64" in res.stderr, res.stderr
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    res = _cli("-m", str(tiny_model), "--kl-divergence-base", str(bad), "--kl-divergence")
    assert res.returncode == 2 and f"{bad}: not a --kl-divergence-base file" in res.stderr, res.stderr
    res = _cli("-m", str(tiny_model), "-sm", "layer", "-so", "1")
    assert res.returncode == 2 and "split_overlap needs split_mode=\"tensor\"" in res.stderr, res.stderr


def test_a_base_of_another_vocabulary_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "base.npz"
    run(Settings(model=str(tiny_model), n_ctx=N_CTX, n_chunks=1, n_gpu_layers=0, n_threads=2), text=TEXT_HEAD,
        base_out=path)
    with np.load(path) as z:
        arrays = dict(z)
    arrays["n_vocab"] = np.int64(1000)
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match="the base has a vocabulary of 1000 tokens, this model 512"):
        run(Settings(model=str(tiny_model), n_ctx=N_CTX, n_gpu_layers=0), base_in=BaseFile.load(path))
    with pytest.raises(ValueError, match="chunks of 64 tokens, not 128"):
        run(Settings(model=str(tiny_model), n_ctx=128, n_gpu_layers=0), base_in=BaseFile.load(path))


def test_real_model_perplexity_is_sane(tmp_path: Path) -> None:
    """SmolLM2 on Alice: 18.6 over 4 chunks of 128 tokens when measured (19.5 over 3 of 512); a broken
    evaluation (no BOS handling, wrong positions, a bad split) lands far outside, a random model near its
    vocabulary size (49152)."""
    path = real_model("smollm2-135m")
    s = run(Settings(model=str(path), n_ctx=128, n_chunks=2, n_gpu_layers=0, split_mode="none", n_threads=2),
            text=TEXT.read_text(encoding="utf-8"))
    assert 8 < s.ppl[0] < 40, s.ppl


def test_decode_logits_from(tiny_model: Path) -> None:
    """Context.decode(logits_from=k): the rows of tokens k.. only, equal to those of all_logits alone."""
    model = _llama.Model.load(str(tiny_model), n_gpu_layers=0)
    try:
        tokens = model.tokenize(TEXT_HEAD)[:40]
        ctx = _llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=2)  # 3 llama_decode calls
        try:
            full = ctx.decode(tokens, all_logits=True)
            ctx.clear()
            part = ctx.decode(tokens, all_logits=True, logits_from=21)
            assert part.shape == (19, full.shape[1]) and np.array_equal(part, full[21:])
            for bad, all_logits in ((40, True), (-1, True), (5, False)):
                with pytest.raises(ValueError, match="logits_from must be in 0..39"):
                    ctx.decode(tokens, all_logits=all_logits, logits_from=bad)
        finally:
            ctx.free()
    finally:
        model.free()
