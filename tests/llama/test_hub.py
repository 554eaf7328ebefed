"""Llama.from_pretrained (llama-cpp-python's) over a stand-in for the Hugging Face Hub: huggingface_hub's
list_repo_files and hf_hub_download replaced by a folder, so the glob, the split shards, additional files and the
errors are checked without a network."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyllama_so import Llama, hub

hf = pytest.importorskip("huggingface_hub")


@pytest.fixture
def repo(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """A repository "org/tiny-GGUF" with the tiny model under two quantization names, a split model's three
    shards (copies: only their names matter until loaded) and a README; records the downloads."""
    files = ["README.md", "tiny.Q8_0.gguf", "tiny.F16.gguf", "big/big-00001-of-00003.gguf",
             "big/big-00002-of-00003.gguf", "big/big-00003-of-00003.gguf", "mmproj.gguf"]
    log: dict[str, list] = {"downloads": []}

    def list_repo_files(repo_id: str, revision: str | None = None) -> list[str]:
        assert repo_id == "org/tiny-GGUF"
        return files

    def hf_hub_download(repo_id: str, filename: str, **kw: object) -> str:
        assert filename in files, filename
        log["downloads"].append(filename)
        dst = tmp_path / "cache" / filename
        dst.parent.mkdir(parents=True, exist_ok=True)
        if filename.endswith(".gguf"):
            shutil.copyfile(tiny_model, dst)
        else:
            dst.write_text("readme")
        return str(dst)

    monkeypatch.setattr(hf, "list_repo_files", list_repo_files)
    monkeypatch.setattr(hf, "hf_hub_download", hf_hub_download)
    return log


def test_from_pretrained_loads_the_one_matching_file(repo: dict[str, list]) -> None:
    with Llama.from_pretrained("org/tiny-GGUF", "*Q8_0.gguf", n_ctx=256, n_threads=2) as llm:
        assert llm.tokenize(b"hello")
        assert llm.model_path.endswith("tiny.Q8_0.gguf")
    assert repo["downloads"] == ["tiny.Q8_0.gguf"]


def test_a_split_model_brings_its_shards_and_the_additional_files(repo: dict[str, list]) -> None:
    path = hub.download("org/tiny-GGUF", "big/*-00001-of-*.gguf", additional_files=["mmproj*"])
    assert path.name == "big-00001-of-00003.gguf"
    assert repo["downloads"] == ["big/big-00001-of-00003.gguf", "big/big-00002-of-00003.gguf",
                                 "big/big-00003-of-00003.gguf", "mmproj.gguf"]


@pytest.mark.parametrize(("pattern", "says"), [("*Q4_K_M.gguf", "no file of org/tiny-GGUF matches"),
                                               ("tiny.*.gguf", "2 files of org/tiny-GGUF match")])
def test_no_file_or_several_is_a_value_error(repo: dict[str, list], pattern: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Llama.from_pretrained("org/tiny-GGUF", pattern)
    assert repo["downloads"] == []


def test_a_shard_without_its_siblings_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="shard 1 of 2, but the repository lacks m-00002-of-00002.gguf"):
        hub.shards_of("m-00001-of-00002.gguf", ["m-00001-of-00002.gguf"])
    assert hub.shards_of("plain.gguf", ["plain.gguf"]) == []


def test_the_quantization_of_llama_servers_hf_flag() -> None:
    """-hf REPO[:QUANT]: the file whose name holds QUANT (case-insensitive), Q4_K_M by default, else the first
    GGUF file; a split model's first shard; never a projector."""
    files = ["README.md", "mmproj-model-f16.gguf", "Model-Q8_0.gguf", "Model-Q4_K_M.gguf",
             "big/Model-F16-00002-of-00002.gguf", "big/Model-F16-00001-of-00002.gguf"]
    assert hub.quant_file(files, None) == "Model-Q4_K_M.gguf"
    assert hub.quant_file(files, "q8_0") == "Model-Q8_0.gguf"
    assert hub.quant_file(files, "F16") == "big/Model-F16-00001-of-00002.gguf"
    assert hub.quant_file(["mmproj-f16.gguf", "b-IQ2_XS.gguf", "a-Q5_K_S.gguf"], None) == "a-Q5_K_S.gguf"
    with pytest.raises(ValueError, match="no GGUF file of quantization Q2_K"):
        hub.quant_file(files, "Q2_K")
    with pytest.raises(ValueError, match="no GGUF file in the repository"):
        hub.quant_file(["README.md", "mmproj.gguf"], None)


def test_download_quant_downloads_the_chosen_file(repo: dict[str, list]) -> None:
    assert hub.download_quant("org/tiny-GGUF:f16").name == "tiny.F16.gguf"
    assert hub.download_quant("org/tiny-GGUF", "tiny.Q8_0.gguf").name == "tiny.Q8_0.gguf"
    assert repo["downloads"] == ["tiny.F16.gguf", "tiny.Q8_0.gguf"]
