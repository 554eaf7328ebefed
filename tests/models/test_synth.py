"""Synthetic models: every weight type loads and runs, no tensor is all zeros, metadata is right."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama_so import Llama, synth, testing
from pyllama_so._llama import FTYPES, QuantizeError, quantize_model
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
        assert llm.model.meta("general.file_type") == str(FTYPES[wtype])


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


@pytest.mark.parametrize("wtype", ["q8_0", "f16", "bf16"])
def test_output_matrix_rows_are_all_distinct(wtype: str) -> None:
    """Chunks cut from the pool a whole number of rows apart repeat rows; in the output matrix such twins give
    tokens equal logits (which defeats top-k's exactness checks, unlike any trained model), so its rows must all
    differ. Another matrix of the same shape, cut the same way, does repeat rows here: the check can fail."""
    import io

    from pyllama_so.gguf_writer import TensorSpec

    n_embd, n_vocab = 128, 151936  # 19 Mi values: five chunks of the pool, rows of 4 Q8_0 blocks
    row_bytes = GGML_TYPES[wtype][2] * n_embd // (32 if wtype == "q8_0" else 1)

    def n_distinct_rows(name: str) -> int:
        buf = io.BytesIO()
        synth._RandomPool(seed=3).write(TensorSpec(name, (n_embd, n_vocab), wtype), buf)
        rows = np.frombuffer(buf.getvalue(), dtype=f"V{row_bytes}")
        assert rows.size == n_vocab
        return len(np.unique(rows))

    assert n_distinct_rows("output.weight") == n_vocab
    if wtype == "q8_0":  # offsets of whole blocks: one pair of chunks in four lines up with the rows
        assert n_distinct_rows("blk.0.ffn_down.weight") < n_vocab


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


def test_list_counts_the_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    """--list gives each shape's parameter count in full (tiny has under a million: "0.000 B" said nothing)."""
    assert synth.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, shape in synth.SHAPES.items():
        n = sum(t.n_elements for t in synth.tensors(shape, "f16"))
        assert any(line.split()[:3] == [name, f"{n:,}", "params"] for line in lines), (name, lines)
    assert 100_000 < sum(t.n_elements for t in synth.tensors(synth.SHAPES["tiny"], "f16")) < 1_000_000


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


def test_the_fixture_models_are_written_to_pytests_folders(tiny_model: Path, small_model: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tests' models go to pytest's temporary folders: the user's model cache is left as it was."""
    for path in (tiny_model, small_model):
        assert tmp_path_factory.getbasetemp() in path.parents
        assert synth.default_cache_dir() not in path.parents
    with Llama(small_model, vocab_only=True) as llm:
        assert llm.metadata["general.name"] == "synthetic qwen3 small"


# ggml type id -> (name, elements per block, bytes per block), from ggml.h / ggml.c, independent of the
# writer: the types llama.cpp may choose for q4_0 and q4_k_m
_GGML_TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 6: ("q5_0", 32, 22),
               8: ("q8_0", 32, 34), 12: ("q4_K", 256, 144), 14: ("q6_K", 256, 210)}
# what each synth type asks llama.cpp for: the main type, and Q6_K, which llama-quantize gives
# output.weight (both) and some attn_v/ffn_down (q4_k_m)
_ASKED = {"q4_0": ("q4_0", {"q4_0", "q6_K"}), "q4_k_m": ("q4_K", {"q4_K", "q6_K"})}
# llama.cpp's type for rows that are not a whole number of a 256-block type's blocks
_FALLBACK = {"q4_K": "q5_0", "q6_K": "q8_0"}
_BLOCK = {name: block for name, block, _ in _GGML_TYPES.values()}


@pytest.mark.parametrize("wtype", synth.QUANTIZED_TYPES)
def test_quantized_tensor_types(model_dir: Path, wtype: str) -> None:
    """Read back what llama.cpp chose: the types asked where a tensor's rows fit their blocks, their
    fallbacks where not (tiny: rows of 128 take Q5_0/Q8_0, ffn_down's rows of 256 the K-quants)."""
    path = synth.write_model(model_dir / f"types-{wtype}.gguf", "tiny", wtype, quiet=True)
    infos, start = read_tensor_infos(path)
    main, asked = _ASKED[wtype]
    chosen = {name: _GGML_TYPES[ttype][0] for name, _, ttype, _ in infos}
    end = 0
    for name, shape, ttype, off in infos:
        tname, block, size = _GGML_TYPES[ttype]
        ncols = shape[0]
        if len(shape) == 1:
            assert tname == "f32", name
        elif tname in asked:
            assert ncols % block == 0, name
        else:
            misfit = {a for a in asked if ncols % _BLOCK[a]}  # rows not a whole number of blocks
            assert tname in {_FALLBACK[a] for a in misfit if a in _FALLBACK}, f"{name}: {tname} (rows of {ncols})"
        end = max(end, start + off + int(np.prod(shape)) // block * size)
    assert end == path.stat().st_size  # the type ids and sizes read back describe the whole file
    blk = [n for n in chosen if n.startswith("blk.") and n.endswith(".weight") and "norm" not in n]
    assert main in {chosen[n] for n in blk}, chosen
    # every weight whose rows hold 256-blocks took a type that was asked (no fallback)
    shapes = {name: shape for name, shape, _, _ in infos}
    assert all(chosen[n] in asked for n in blk if shapes[n][0] % 256 == 0), chosen


def test_quantize_model_sets_the_embedding_and_output_types(tiny_model: Path, tmp_path: Path) -> None:
    """token_embedding_type and output_tensor_type override llama.cpp's choice for those two tensors only."""
    default, chosen = tmp_path / "default.gguf", tmp_path / "chosen.gguf"
    quantize_model(tiny_model, default, "q8_0")
    quantize_model(tiny_model, chosen, "q8_0", token_embedding_type="q4_0", output_tensor_type="Q5_0")
    types = [{name: _GGML_TYPES[t][0] for name, _, t, _ in read_tensor_infos(p)[0]} for p in (default, chosen)]
    assert types[0]["token_embd.weight"] == types[0]["output.weight"] == "q8_0"
    assert types[1]["token_embd.weight"] == "q4_0" and types[1]["output.weight"] == "q5_0"
    assert {k: v for k, v in types[1].items() if k not in ("token_embd.weight", "output.weight")} == \
        {k: v for k, v in types[0].items() if k not in ("token_embd.weight", "output.weight")}
    with pytest.raises(ValueError, match="unknown token_embedding_type 'q4_k'"):
        quantize_model(tiny_model, tmp_path / "bad.gguf", "q8_0", token_embedding_type="q4_k")


def test_bad_weight_type_is_a_value_error_and_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown weight type 'q4_k'"):
        synth.write_model(tmp_path / "m.gguf", "tiny", "q4_k")
    with pytest.raises(ValueError, match="unknown weight type"):
        synth.cached_model("tiny", "q4_k")
    with pytest.raises(ValueError, match="unknown quantization type"):
        quantize_model(tmp_path / "a.gguf", tmp_path / "b.gguf", "q4_k")
    cmd = [sys.executable, "-m", "pyllama_so.synth", "tiny", "-t", "q4_k", "-o", str(tmp_path / "m.gguf")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "synth: error: unknown weight type 'q4_k'; expected one of " + ", ".join(synth.WEIGHT_TYPES)]
    assert list(tmp_path.iterdir()) == []


def test_quantize_model_refuses_its_input_and_reports_failure(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the output is the input"):
        quantize_model(tiny_model, tiny_model.parent / "." / tiny_model.name, "q4_0")
    link = tmp_path / "link.gguf"
    link.symlink_to(tiny_model)
    with pytest.raises(ValueError, match="the output is the input"):
        quantize_model(tiny_model, link, "q4_0")
    with pytest.raises(QuantizeError, match="cannot quantize .*missing.gguf to q4_0.*failed to load"):
        quantize_model(tmp_path / "missing.gguf", tmp_path / "out.gguf", "q4_0")


@pytest.mark.parametrize("error", [KeyboardInterrupt, QuantizeError])
def test_quantizing_leaves_no_temporary_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              error: type[BaseException]) -> None:
    """An interrupted or failed quantization removes the F16 file and the unfinished output."""
    seen = []

    def failing(src: Path, dst: Path, ftype: str, n_threads: int = 0) -> None:
        seen.append(Path(src))
        assert Path(src).parent == tmp_path and Path(src).stat().st_size > 0  # the F16 file, next to the output
        Path(dst).write_bytes(b"half a model")
        raise error("stop")

    monkeypatch.setattr(synth, "quantize_model", failing)
    with pytest.raises(error):
        synth.write_model(tmp_path / "m.gguf", "tiny", "q4_0", quiet=True)
    assert seen and list(tmp_path.iterdir()) == []


def test_cli_quantizes_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.gguf"
    assert synth.main(["tiny", "-t", "q4_k_m", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert "m.gguf: quantizing to q4_k_m with llama.cpp" in captured.err
    assert "m.gguf: quantized in " in captured.err
    assert list(tmp_path.iterdir()) == [out]
    with Llama(out, n_ctx=256) as llm:
        assert "Q4_K - Medium" in llm.model.desc


def test_cache_holds_quantized_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path))
    path = synth.cached_model("tiny", "q4_0")
    assert [p.name for p in (tmp_path / "models").iterdir()] == [f"tiny-q4_0-v{synth.CACHE_VERSION}.gguf"]
    assert synth.cached_model("tiny", "q4_0") == path
    with Llama(path, n_ctx=256) as llm:
        assert np.isfinite(llm.eval(llm.tokenize("hello"))).all()


def test_progress_in_a_log_is_one_line_per_update(tmp_path: Path) -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "pyllama_so.synth", "tiny", "-o", str(tmp_path / "t.gguf")],
                         capture_output=True, text=True, timeout=120)  # stderr is a pipe, not a terminal
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr
    lines = res.stderr.splitlines()
    assert lines and all(line.startswith("synth: t.gguf: ") for line in lines)
    assert lines[-1].startswith("synth: t.gguf: written in ")


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    """A write that fails part-way (here: a tensor of the wrong size) leaves neither the file nor its .part."""
    from pyllama_so.gguf_writer import TensorSpec, write_gguf

    path = tmp_path / "broken.gguf"
    specs = [TensorSpec("a", (32,), "f32"), TensorSpec("b", (32,), "f32")]
    with pytest.raises(RuntimeError, match="b: wrote 4 bytes"):
        write_gguf(path, {"general.architecture": "llama"}, specs,
                   lambda t, f: f.write(b"\0" * (t.nbytes if t.name == "a" else 4)))
    assert sorted(tmp_path.iterdir()) == []
