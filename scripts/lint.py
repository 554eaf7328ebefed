#!/usr/bin/env python3
"""Lint: ruff over the Python code, cython-lint over the Cython files, mypy over the package and the scripts,
with the settings in pyproject.toml. Exit status 0 when all three pass, 1 when one fails.

--install first pip-installs the linters (the lint extra) and the libraries the code imports (the packages the
test extra installs, the project's own extras expanded, without the model files of real-models), but not
pyllama_so itself: nothing is built, so CI runs this before the builds, and mypy still checks the calls into
those libraries against their own types. (The compiled modules are read from their .pyi stubs.)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pip's copy of the same parser (tomllib is tomli, moved into the standard library)
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
NO_CODE = {"real-models"}  # extras that install model files, nothing to check calls against


def requirements(pyproject: Path = REPO / "pyproject.toml", extra: str = "test") -> list[str]:
    """What `pip install ".[extra]"` installs besides the project: its dependencies and the extra's, with the
    project's own extras that it names expanded (each once), in order, none of NO_CODE."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    own = re.compile(rf"{re.escape(project['name'])}\[(.+)\]")
    out = list(project.get("dependencies", []))
    todo, seen = [extra], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name in NO_CODE:
            continue
        seen.add(name)
        for req in extras[name]:
            if m := own.fullmatch(req):
                todo += [e.strip() for e in m.group(1).split(",")]
            elif req not in out:
                out.append(req)
    return out


def cython_files(root: Path = REPO / "python") -> list[Path]:
    return sorted(p for ext in ("pyx", "pxi", "pxd") for p in root.rglob(f"*.{ext}"))


def checks() -> list[tuple[str, list[str]]]:
    """Each linter's name and command line, run from the repository's root."""
    py = sys.executable
    return [("ruff", [py, "-m", "ruff", "check"]),
            ("cython-lint", [py, "-m", "cython_lint.cython_lint",
                             *(str(p.relative_to(REPO)) for p in cython_files())]),
            ("mypy", [py, "-m", "mypy"])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true", help="pip-install the linters and the libraries first")
    args = ap.parse_args(argv)
    if args.install:
        subprocess.run([sys.executable, "-m", "pip", "install", *requirements()], check=True)
    failed = [name for name, cmd in checks() if subprocess.run(cmd, cwd=REPO).returncode != 0]
    if failed:
        print(f"lint: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
