"""Synthetic models: every weight type loads and runs, no tensor is all zeros, metadata is right."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama_so import Llama, synth
from pyllama_so import testing
from pyllama_so.gguf_writer import GGML_TYPES


def read_tensor_infos(path: Path) -> tuple[list[tuple[str, tuple[int, ...], int, int]], int]:
    """Parse a GGUF header independently of the writer: (name, shape, type, offset) and data start."""
    with path.open("rb") as f:
        data = f.read(64 << 20)
    pos = 4
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, pos)
    assert version == 3
    pos += 20

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        s = data[pos:pos + n].decode()
        pos += n
        return s

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(t: int) -> None:
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                value(et)
        else:
            pos += sizes[t]

    for _ in range(n_kv):
        string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        value(t)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4
        shape = struct.unpack_from(f"<{nd}Q", data, pos)
        pos += 8 * nd
        ttype, off = struct.unpack_from("<IQ", data, pos)
        pos += 12
        infos.append((name, shape, ttype, off))
    return infos, pos + (-pos % 32)


@pytest.mark.parametrize("wtype", synth.WEIGHT_TYPES)
def test_weight_types_load_and_run(model_dir: Path, wtype: str) -> None:
    path = synth.write_model(model_dir / f"t-{wtype}.gguf", "tiny", wtype, quiet=True)
    with Llama(path, n_ctx=256) as llm:
        logits = llm.eval(llm.tokenize("hello"))
        assert np.isfinite(logits).all()
        assert llm.model.n_layer == synth.SHAPES["tiny"].n_layer
        assert llm.model.n_embd == synth.SHAPES["tiny"].n_embd
        assert llm.n_vocab() == synth.SHAPES["tiny"].n_vocab
        assert llm.model.meta("general.architecture") == "qwen3"


def test_no_tensor_is_all_zeros_or_a_copy(tiny_model: Path) -> None:
    infos, start = read_tensor_infos(tiny_model)
    blob = tiny_model.read_bytes()
    seen = set()
    names = {name for name, *_ in infos}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    for name, shape, ttype, off in infos:
        tname = next(k for k, v in GGML_TYPES.items() if v[0] == ttype)
        nbytes = int(np.prod(shape)) // GGML_TYPES[tname][1] * GGML_TYPES[tname][2]
        chunk = blob[start + off:start + off + nbytes]
        assert len(chunk) == nbytes, name
        assert any(chunk), f"{name} is all zeros"
        if len(chunk) > 1024:
            assert chunk not in seen, f"{name} repeats another tensor"
            seen.add(chunk)


def test_shapes_have_the_documented_sizes() -> None:
    n = {name: sum(t.n_elements for t in synth.tensors(s, "f16")) for name, s in synth.SHAPES.items()}
    # docs/benchmarks.md: the 8B F16 synthetic model is 15.26 GiB
    assert abs(n["qwen3-8b"] * 2 / 2**30 - 15.26) < 0.01
    assert 32e9 < n["qwen3-32b"] < 33.5e9


def test_vocabulary_is_the_requested_size() -> None:
    for size in (300, 512, 151936):
        tokens, scores, types = synth.vocabulary(size)
        assert len(tokens) == len(scores) == len(types) == size
        assert len(set(tokens)) == size
    with pytest.raises(ValueError):
        synth.vocabulary(100)


def test_cli_writes_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.gguf"
    assert synth.main(["tiny", "-t", "bf16", "-o", str(out)]) == 0
    mtime = out.stat().st_mtime_ns
    assert synth.main(["tiny", "-o", str(out)]) == 0
    assert out.stat().st_mtime_ns == mtime
    assert "exists" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        synth.main(["huge"])


def test_random_weight_model_without_a_file() -> None:
    shape = synth.SHAPES["tiny"]
    kv = synth.metadata(shape, "f16", "tiny")
    kv.pop("general.file_type")
    kv = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in kv.items()}
    types = {t.name: "f16" for t in synth.tensors(shape, "f16") if len(t.shape) > 1}
    from pyllama_so._llama import Context

    def logits(seed: int) -> np.ndarray:
        m = testing.random_model(kv, types, seed=seed, stdev=0.05)
        ctx = Context(m, n_ctx=64)
        out = ctx.decode(m.tokenize("hello"), all_logits=True)
        ctx.free()
        m.free()
        return out

    a, b, c = logits(1), logits(1), logits(2)
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("where", ["/proc/x.gguf", "file/x.gguf"])
def test_cli_unwritable_path_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("a file, not a folder")
    if where.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("no /proc")
    out = Path(where) if where.startswith("/") else tmp_path / where
    res = subprocess.run([sys.executable, "-m", "pyllama_so.synth", "tiny", "-o", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"synth: error: cannot write {out}: "), res.stderr


def test_name_says_synthetic_and_shape(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        assert llm.model.meta("general.name") == "synthetic qwen3 tiny"


def test_cache_replaces_models_of_older_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Models cached before general.name was written are neither reused nor left behind."""
    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path))
    models = tmp_path / "models"
    models.mkdir()
    old = models / "tiny-f16-v2.gguf"
    old.write_bytes(b"an older version")
    other = models / "small-f16-v2.gguf"  # another shape's file stays
    other.write_bytes(b"another shape")
    path = synth.cached_model("tiny", "f16")
    assert sorted(p.name for p in models.iterdir()) == sorted([path.name, other.name])
    with Llama(path, n_ctx=256) as llm:
        assert llm.model.meta("general.name") == "synthetic qwen3 tiny"
