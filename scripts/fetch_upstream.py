"""Fetch the pinned llama.cpp tree and extract the parts the build needs.

The tree comes from the source distribution of the llama-cpp-python release named in
cmake/upstream-pin.json (its vendor/llama.cpp folder). The archive is checked against the pinned
sha256 before anything is extracted. Nothing of it is ever committed: the destination is git-ignored.

    scripts/fetch-upstream                      # -> .upstream/llama.cpp
    scripts/fetch-upstream --sdist FILE.tar.gz  # use an archive already on disk (still verified)
    scripts/fetch-upstream --from-tree DIR --dest BUILD/llama.cpp  # a local llama.cpp checkout

With --from-tree the same parts are copied from a local checkout into --dest, which the build then
patches: the user's checkout is never modified. Files are copied again only when they changed in the
checkout since the last copy, so a patched copy is not rebuilt on every configure.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PIN_FILE = REPO / "cmake" / "upstream-pin.json"
STAMP = ".pyllama_so-pin"


def load_pin() -> dict[str, Any]:
    return json.loads(PIN_FILE.read_text())


def stamp_text(pin: dict[str, Any]) -> str:
    """What an extracted tree records: the archive, the commit and which parts were taken, so that a
    tree extracted for another parts list is extracted again."""
    parts = hashlib.sha256(json.dumps(pin["include"]).encode()).hexdigest()[:16]
    return f"{pin['sdist_sha256']} {pin['commit']} parts={parts}\n"


def is_current(dest: Path, pin: dict[str, Any]) -> bool:
    try:
        return (dest / STAMP).read_text() == stamp_text(pin)
    except OSError:
        return False


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pip_command() -> tuple[list[str], dict[str, str] | None]:
    """pip of this interpreter, else the first on PATH, and the environment to run it in.

    Inside pip's isolated build environment pip is hidden, and PYTHONPATH points at an overlay whose
    sitecustomize hides site-packages from every interpreter that inherits it, so the pip found on
    PATH runs without those variables."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"], None
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            return [exe], env
    sys.exit("fetch-upstream: pip is needed to download the pinned sdist")


def download_sdist(pin: dict[str, Any], cache: Path) -> Path:
    name = f"{pin['package'].replace('-', '_')}-{pin['version']}.tar.gz"
    cached = cache / name
    if cached.exists() and sha256_of(cached) == pin["sdist_sha256"]:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    # --no-binary for this package only: with ":all:" pip would also build the isolated build
    # environment's requirements (cmake among them) from source.
    pip, env = pip_command()
    cmd = [*pip, "download", "--no-deps", "--no-binary", pin["package"], "-d", str(cache),
           f"{pin['package']}=={pin['version']}"]
    # First with --no-build-isolation: pip prepares the sdist's metadata with the scikit-build-core
    # at hand instead of installing the sdist's build requirements.
    for extra in (["--no-build-isolation"], []):
        print("fetch-upstream: " + " ".join(cmd + extra), file=sys.stderr, flush=True)
        res = subprocess.run(cmd + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if res.returncode == 0 and cached.exists():
            break
    if res.returncode != 0 or not cached.exists():
        sys.stderr.write(res.stdout)
        sys.exit(f"fetch-upstream: could not download {pin['package']}=={pin['version']}; "
                 "pass --sdist FILE or point the build at a local tree (PYLLAMA_SO_UPSTREAM_DIR)")
    return cached


def wanted(rel: str, patterns: list[str]) -> bool:
    """A plain pattern takes a file or a whole folder; a glob matches files at its own depth."""
    for pat in patterns:
        if any(c in pat for c in "*?["):
            if rel.count("/") == pat.count("/") and fnmatch.fnmatchcase(rel, pat):
                return True
        elif rel == pat or rel.startswith(pat + "/"):
            return True
    return False


def extract(sdist: Path, pin: dict[str, Any], dest: Path) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="upstream-", dir=dest.parent))
    count = 0
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                parts = member.name.split("/", 1)
                if len(parts) < 2 or not parts[1].startswith(pin["tree"] + "/"):
                    continue
                rel = parts[1][len(pin["tree"]) + 1:]
                if not member.isfile() or not wanted(rel, pin["include"]):
                    continue
                member.name = rel
                tar.extract(member, tmp, filter="data")
                count += 1
        (tmp / STAMP).write_text(stamp_text(pin))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return count


MANIFEST = ".pyllama_so-source"
PATCH_RECORD = ".pyllama-so-patches"  # cmake/apply-patches.cmake: the patches applied to the tree


def copy_tree(src: Path, pin: dict[str, Any], dest: Path) -> tuple[int, int]:
    """Mirror the wanted files of a local tree into dest; returns (files, files copied this time)."""
    if not (src / "include" / "llama.h").is_file():
        sys.exit(f"fetch-upstream: {src} is not a llama.cpp tree (no include/llama.h)")
    manifest_file = dest / MANIFEST
    try:
        old = json.loads(manifest_file.read_text())
    except (OSError, ValueError):
        old = {}
    if old.get("source") != str(src):
        old = {}
    seen: dict[str, list[int]] = {}
    copied = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if not path.is_file() or rel.startswith(".git/") or not wanted(rel, pin["include"]):
            continue
        st = path.stat()
        seen[rel] = [st.st_size, st.st_mtime_ns]
        target = dest / rel
        if old.get("files", {}).get(rel) == seen[rel] and target.exists():
            continue  # unchanged in the checkout: keep the (possibly patched) copy
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied += 1
    for rel in set(old.get("files", {})) - set(seen):
        (dest / rel).unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    if copied:  # some copied files are unpatched again: the applier checks each patch instead of its record
        (dest / PATCH_RECORD).unlink(missing_ok=True)
    manifest_file.write_text(json.dumps({"source": str(src), "files": seen}))
    return len(seen), copied


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=REPO / ".upstream" / "llama.cpp")
    ap.add_argument("--sdist", type=Path, help="a local copy of the pinned sdist")
    ap.add_argument("--force", action="store_true", help="extract again even if the tree is current")
    ap.add_argument("--from-tree", type=Path, metavar="DIR", help="copy from a local llama.cpp checkout instead")
    args = ap.parse_args()

    pin = load_pin()
    if args.from_tree:
        src, dest = args.from_tree.resolve(), args.dest.resolve()
        if dest == src or src in dest.parents:
            sys.exit(f"fetch-upstream: --dest {dest} must lie outside the checkout {src}")
        n, copied = copy_tree(src, pin, dest)
        print(f"fetch-upstream: {n} files of {src} in {dest} ({copied} copied)")
        return 0
    if not args.force and is_current(args.dest, pin):
        print(f"fetch-upstream: {args.dest} is at {pin['commit'][:9]}")
        return 0

    sdist = args.sdist or download_sdist(pin, args.dest.parent / "cache")
    digest = sha256_of(sdist)
    if digest != pin["sdist_sha256"]:
        sys.exit(f"fetch-upstream: sha256 mismatch for {sdist}:\n  got      {digest}\n"
                 f"  expected {pin['sdist_sha256']} (cmake/upstream-pin.json)")
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    n = extract(sdist, pin, args.dest)
    size = sum(p.stat().st_size for p in args.dest.rglob("*") if p.is_file())
    print(f"fetch-upstream: extracted {n} files ({size / 2**20:.1f} MiB) of llama.cpp "
          f"{pin['commit'][:9]} into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
