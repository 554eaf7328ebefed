"""GGUF files from the Hugging Face Hub, for Llama.from_pretrained (llama-cpp-python's): the one file of a
repository whose path matches a pattern, the rest of its shards when it is a split model, and any
additional files, downloaded through huggingface_hub into its cache (or local_dir)."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

EXTRA = 'pip install "pyllama_so[hub]"'
# llama.cpp's split files: NAME-00001-of-00003.gguf (gguf-split)
_SHARD = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def _hub() -> ModuleType:
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(f"downloading from the Hugging Face Hub needs huggingface_hub: {EXTRA}") from None
    return huggingface_hub


def _one(files: Sequence[str], pattern: str, repo_id: str) -> str:
    found = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if not found:
        raise ValueError(f"no file of {repo_id} matches {pattern!r}; its files: {', '.join(files)}")
    if len(found) > 1:
        raise ValueError(f"{len(found)} files of {repo_id} match {pattern!r}: {', '.join(found)}; give one")
    return found[0]


def shards_of(path: str, files: Sequence[str]) -> list[str]:
    """The other shards of a split model's first shard among files (none for a file of its own)."""
    m = _SHARD.match(path)
    if m is None:
        return []
    n = int(m["n"])
    want = [f"{m['stem']}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1) if i != int(m["i"])]
    missing = [w for w in want if w not in files]
    if missing:
        raise ValueError(f"{path} is shard {int(m['i'])} of {n}, but the repository lacks {', '.join(missing)}")
    return want


def quant_file(files: Sequence[str], quant: str | None) -> str:
    """llama-server's -hf REPO[:QUANT] choice: the GGUF file (the first shard of a split one) whose name holds
    QUANT, case-insensitive, Q4_K_M when none is given, falling back to the first GGUF file then; never a
    multimodal projector (mmproj)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in Path(f).name.lower())
    ggufs = [f for f in ggufs if (m := _SHARD.match(f)) is None or int(m["i"]) == 1]
    want = (quant or "Q4_K_M").lower()
    found = [f for f in ggufs if want in Path(f).name.lower()]
    if found:
        return found[0]
    if quant is None and ggufs:
        return ggufs[0]
    raise ValueError(f"no GGUF file {'of quantization ' + quant + ' ' if quant else ''}in the repository; "
                     f"its files: {', '.join(files)}")


def download_quant(repo_quant: str, filename: str | None = None) -> Path:
    """The local path of llama-server's -hf REPO[:QUANT] (-hff FILE names the file instead), downloaded."""
    repo_id, _, quant = repo_quant.partition(":")
    hub = _hub()
    files = list(hub.list_repo_files(repo_id))
    return _fetch(hub, repo_id, files, filename or quant_file(files, quant or None))


def download(repo_id: str, filename: str, *, additional_files: Sequence[str] | None = None,
             local_dir: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
             revision: str | None = None) -> Path:
    """The local path of repo_id's one file matching filename (a glob over its paths, e.g. "*Q4_K_M.gguf"),
    downloaded with the rest of its shards and the files matching each of additional_files. ValueError when
    no file or several match."""
    hub = _hub()
    files = list(hub.list_repo_files(repo_id, revision=revision))
    return _fetch(hub, repo_id, files, filename, additional_files=additional_files, local_dir=local_dir,
                  cache_dir=cache_dir, revision=revision)


def _fetch(hub: ModuleType, repo_id: str, files: Sequence[str], filename: str, *,
           additional_files: Sequence[str] | None = None, local_dir: str | os.PathLike[str] | None = None,
           cache_dir: str | os.PathLike[str] | None = None, revision: str | None = None) -> Path:
    """Download the file of files matching filename, its other shards and additional_files; its local path."""
    main = _one(files, filename, repo_id)
    extra = [_one(files, pattern, repo_id) for pattern in additional_files or ()]
    path = None
    for name in [main, *shards_of(main, files), *extra]:
        got = hub.hf_hub_download(repo_id, name, revision=revision, local_dir=local_dir, cache_dir=cache_dir)
        if name == main:
            path = Path(got)
    assert path is not None
    return path
