"""scripts/lint: what --install installs (the test extra's packages, not the project or the model files) and the
exit status of the three linters together."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lint  # scripts/lint.py
from helpers.paths import REPO, SCRIPTS

PYPROJECT = """
[project]
name = "demo_pkg"
dependencies = ["numpy>=1.23"]

[project.optional-dependencies]
test = ["pytest>=7", "demo_pkg[server,weights,lint]", "numpy>=1.23"]
server = ["fastapi>=0.100", "demo_pkg[chat]"]
chat = ["Jinja2>=3.1"]
weights = ["some-model-parts==1.0"]
lint = ["ruff==1.0", "demo_pkg[chat]"]
"""


def test_requirements_expand_the_projects_own_extras_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.setattr(lint, "NO_CODE", {"weights"})
    assert lint.requirements(tmp_path / "pyproject.toml") == ["numpy>=1.23", "pytest>=7", "fastapi>=0.100",
                                                              "ruff==1.0", "Jinja2>=3.1"]


def test_the_repositorys_requirements_are_the_linters_and_the_libraries_not_the_models() -> None:
    got = lint.requirements()
    names = {r.split("=")[0].split(">")[0].split("[")[0] for r in got}
    assert {"ruff", "mypy", "cython-lint", "numpy", "fastapi", "Jinja2", "huggingface-hub", "matplotlib"} <= names
    assert not any(n.startswith(("pyllama_so", "gemma3")) for n in names), got


def test_every_cython_file_is_linted() -> None:
    files = lint.cython_files()
    assert {p.suffix for p in files} == {".pyx", ".pxi", ".pxd"}
    assert {p.name for p in files} >= {"_llama.pyx", "_fixtures.pyx"}
    cmd = dict(lint.checks())["cython-lint"]
    assert [REPO / f for f in cmd[3:]] == files


def test_exit_status_names_the_failed_linters(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ok, bad = [sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(3)"]
    monkeypatch.setattr(lint, "checks", lambda: [("one", ok), ("two", bad), ("three", ok)])
    assert lint.main([]) == 1
    assert capsys.readouterr().err.strip() == "lint: two failed"
    monkeypatch.setattr(lint, "checks", lambda: [("one", ok)])
    assert lint.main([]) == 0


def test_the_command_and_its_linters_run() -> None:
    out = subprocess.run([sys.executable, str(SCRIPTS / "lint"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--install" in out.stdout, out.stderr
    for name, cmd in lint.checks():  # each linter is installed (the test extra) and its entry point answers
        version = subprocess.run([*cmd[:3], "--version"], capture_output=True, text=True, timeout=60)
        assert version.returncode == 0, (name, version.stderr)
