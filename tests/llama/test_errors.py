"""Bad input gets a clear exception and leaves the process usable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_so import ContextFullError, Llama, ModelLoadError, _llama


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        Llama(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        Llama(tmp_path)


def test_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 definitely a zip file" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Llama(bad)


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_gguf(tmp_path: Path, tiny_model: Path, keep: float) -> None:
    """The error carries llama.cpp's reason (its first error line), not only that the load failed."""
    data = tiny_model.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match=r"failed to load model from .*cut\.gguf: llama_model_load: error loading "
                       r"model: tensor '.+' data is not within the file bounds, model is corrupted or incomplete"):
        Llama(cut)


def test_header_only_gguf(tmp_path: Path) -> None:
    cut = tmp_path / "header.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ModelLoadError):
        Llama(cut)


@pytest.mark.parametrize("mode", ["rows", "TENSOR2", 7, -1])
def test_unknown_split_mode(tiny_model: Path, mode: object) -> None:
    with pytest.raises(ValueError, match="split_mode"):
        Llama(tiny_model, split_mode=mode)  # type: ignore[arg-type]


def test_attn_split_without_tensor_split_says_it_needs_tensor(tiny_model: Path) -> None:
    """The split mode is wrong whatever the length: a split longer than the devices still says so."""
    too_long = [1.0] * (max(1, _llama.gpu_device_count()) + 1)
    with pytest.raises(ValueError, match='attn_split needs split_mode="tensor"'):
        Llama(tiny_model, split_mode="layer", attn_split=too_long)


def test_tensor_split_longer_than_devices(tiny_model: Path) -> None:
    n = max(1, _llama.gpu_device_count())
    with pytest.raises(ValueError, match="tensor_split"):
        Llama(tiny_model, tensor_split=[1.0] * (n + 1))
    with pytest.raises(ValueError, match="tensor_split"):
        Llama(tiny_model, tensor_split=[-1.0])


def test_ubatch_larger_than_batch(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="n_ubatch"):
        Llama(tiny_model, n_batch=64, n_ubatch=128)


@pytest.mark.parametrize("kw", [dict(flash_attn="maybe"), dict(type_k="f12"), dict(type_v=99), dict(n_ctx=-1)])
def test_bad_context_options(tiny_model: Path, kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Llama(tiny_model, **kw)  # type: ignore[arg-type]


def test_context_too_small_for_prompt(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        long_prompt = llm.tokenize("x" * (llm.n_ctx() + 1))
        with pytest.raises(ContextFullError):
            llm.eval(long_prompt)
        with pytest.raises(ContextFullError):
            llm.create_completion("y" * (llm.n_ctx() + 1), max_tokens=4)
        # the context is still usable after the error
        assert llm.eval(llm.tokenize("ok")).shape[0] == 3


def test_token_out_of_range(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256) as llm:
        with pytest.raises(ValueError, match="out of range"):
            llm.eval([llm.n_vocab()])


@pytest.mark.parametrize("split_mode", ["layer", "none", "row", 1])
def test_split_overlap_needs_tensor_split(tiny_model: Path, split_mode: str | int) -> None:
    """A ValueError: the lanes only overlap tensor split's AllReduces; a non-bool is a TypeError."""
    said = r"split_overlap needs split_mode=\"tensor\" \(got split_mode='(layer|none|row)'\)"
    with pytest.raises(ValueError, match=said):
        Llama(tiny_model, split_mode=split_mode, split_overlap=True)
    with pytest.raises(TypeError, match="split_overlap must be a bool"):
        Llama(tiny_model, split_mode="tensor", split_overlap=1)  # type: ignore[arg-type]


def test_process_usable_after_errors(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Llama(tmp_path / "missing.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:1000])
    with pytest.raises(ModelLoadError):
        Llama(cut)
    with Llama(tiny_model, n_ctx=256) as llm:
        assert llm.eval(llm.tokenize("fine")).shape == (5, llm.n_vocab())


@pytest.mark.parametrize("text", [123, [104, 105], 1.5, None])
def test_tokenize_needs_text(tiny_model: Path, text: object) -> None:
    """bytes(123) is 123 zero bytes: only str and bytes are text."""
    with Llama(tiny_model, n_ctx=256) as llm:
        with pytest.raises(TypeError, match="str or bytes"):
            llm.tokenize(text)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="str or bytes"):
            llm.model.tokenize(text)
        assert llm.tokenize(b"hi") == llm.tokenize(bytearray(b"hi")) == llm.tokenize("hi")


def test_tensor_split_without_devices_says_what_to_do(tiny_model: Path) -> None:
    """-sm tensor on a machine without GPUs: the error names the two ways to get devices, and the
    public pyllama_so.cpu_virtual_devices it names works."""
    code = """if True:
        import sys
        import pyllama_so
        if pyllama_so._llama.gpu_device_count():
            sys.exit("has GPU devices")
        try:
            pyllama_so.Llama(sys.argv[1], split_mode="tensor", flash_attn=True)
        except pyllama_so.ModelLoadError as e:
            print(e)
        pyllama_so.cpu_virtual_devices(2)
        with pyllama_so.Llama(sys.argv[1], split_mode="tensor", flash_attn=True) as llm:
            print("loaded", llm.n_ctx())
    """
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_VIRTUAL_DEVICES"}
    res = subprocess.run([sys.executable, "-c", code, str(tiny_model)], env=env, capture_output=True, text=True,
                         timeout=120)
    if "has GPU devices" in res.stderr:
        pytest.skip("GPU devices present: tensor split has devices")
    assert res.returncode == 0, res.stderr
    error, loaded = res.stdout.strip().splitlines()
    assert error.startswith("failed to load model")
    assert "GGML_CPU_VIRTUAL_DEVICES=2" in error and "pyllama_so.cpu_virtual_devices(2)" in error
    assert loaded == "loaded 4096"
