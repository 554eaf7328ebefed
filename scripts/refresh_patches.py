"""Regenerate patches/ from a git checkout of the pinned tree, so that every patch is what
`git format-patch` writes (index lines, diffstat, the header's date and message kept).

    scripts/refresh-patches                 # rewrite patches/NNNN-*.patch in place
    scripts/refresh-patches --check         # exit 1 if refreshing would change a patch (CI's test)
    scripts/refresh-patches --keep DIR      # leave the checkout in DIR: one commit per patch, to edit
                                            # (git commit --amend / rebase -i), then run again with --from DIR

The pinned tree is extracted afresh (scripts/fetch-upstream, from .upstream/cache when the sdist is
there), committed as the base, and each patch applied with `git am` in order (one commit each, the
message and author date from its header). `git format-patch --zero-commit --no-signature` then writes
them back under their current names. With --from DIR the commits of an edited checkout are written
instead (the base is its first commit).
"""
from __future__ import annotations

import argparse
import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"
AUTHOR = ["-c", "user.name=pyllama_so", "-c", "user.email=pyllama_so@users.noreply.github.com"]


def git(tree: Path, *args: str) -> str:
    env = {"GIT_CEILING_DIRECTORIES": str(tree.parent), "GIT_COMMITTER_DATE": "2026-11-30T00:00:00Z",
           "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tree.parent)}
    res = subprocess.run(["git", *AUTHOR, *args], cwd=tree, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"refresh-patches: git {' '.join(args[:2])} failed in {tree}:\n{res.stdout}{res.stderr}")
    return res.stdout


def checkout_with_patches(work: Path, patches: list[Path]) -> Path:
    """The pinned tree in work/llama.cpp as a git repository: the base commit, then one per patch."""
    tree = work / "llama.cpp"
    pin = json.loads((REPO / "cmake" / "upstream-pin.json").read_text())
    cached = sorted((REPO / ".upstream" / "cache").glob(f"*{pin['version']}*.tar.gz"))
    cmd = [sys.executable, str(REPO / "scripts" / "fetch-upstream"), "--dest", str(tree), "--force"]
    if cached:
        cmd += ["--sdist", str(cached[-1])]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"refresh-patches: fetching the pinned tree failed:\n{res.stdout}{res.stderr}")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--no-gpg-sign", "-m", f"llama.cpp {pin['commit']} (pinned)")
    for patch in patches:
        git(tree, "am", "-q", "--no-gpg-sign", "--keep-cr", "--committer-date-is-author-date", str(patch))
    return tree


def format_patches(tree: Path, names: list[str], out: Path) -> list[Path]:
    """The commits after the base as format-patch files in out, named as names (in order)."""
    base = git(tree, "rev-list", "--max-parents=0", "HEAD").split()[0]
    n = len(git(tree, "rev-list", f"{base}..HEAD").split())
    if n != len(names):
        sys.exit(f"refresh-patches: the checkout has {n} commits after the base but patches/ has {len(names)} "
                 "patches: add or remove the patch file first (its name gives the order)")
    raw = out / "raw"
    git(tree, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "-o", str(raw),
        f"{base}..HEAD")
    written = []
    for src, name in zip(sorted(raw.glob("*.patch")), names, strict=True):
        dst = out / name
        src.rename(dst)
        written.append(dst)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a patch would change")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the patched checkout in DIR (must not exist)")
    ap.add_argument("--from", dest="from_tree", type=Path, metavar="DIR",
                    help="write the commits of this checkout (made with --keep) instead of re-applying")
    a = ap.parse_args()
    patches = sorted(PATCHES.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    if not patches:
        sys.exit("refresh-patches: no patches/NNNN-*.patch")
    if a.keep is not None and a.keep.exists():
        sys.exit(f"refresh-patches: --keep {a.keep} exists; name a new folder")
    with tempfile.TemporaryDirectory(prefix="refresh-patches-") as tmp:
        work = Path(tmp)
        tree = a.from_tree.resolve() if a.from_tree else checkout_with_patches(work, patches)
        out = work / "out"
        out.mkdir()
        fresh = format_patches(tree, [p.name for p in patches], out)
        changed = []
        for old, new in zip(patches, fresh, strict=True):
            if old.read_text() != new.read_text():
                changed.append(old.name)
                if a.check:
                    sys.stdout.writelines(difflib.unified_diff(old.read_text().splitlines(True),
                                                               new.read_text().splitlines(True),
                                                               f"patches/{old.name}", "refreshed", n=1))
                else:
                    shutil.copyfile(new, old)
        if a.keep is not None and not a.from_tree:
            shutil.copytree(tree, a.keep, symlinks=True)
            print(f"refresh-patches: the patched checkout is in {a.keep}")
    verb = "would change" if a.check else "rewrote"
    listed = f": {', '.join(changed)}" if changed else ""
    print(f"refresh-patches: {verb} {len(changed)} of {len(patches)} patches{listed}")
    return 1 if a.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
