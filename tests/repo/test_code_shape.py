"""The package stays readable: no source file of python/pyllama_so over 600 lines and no Python function over 80
(issue 40's limits; Cython functions are checked by eye, as ast cannot parse them)."""

from __future__ import annotations

import ast

from helpers.paths import REPO

PACKAGE = REPO / "python" / "pyllama_so"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
SOURCES = (".py", ".pyi", ".pyx", ".pxi", ".pxd")


def test_no_source_file_is_longer_than_600_lines() -> None:
    long = {p.relative_to(PACKAGE).as_posix(): n for p in sorted(PACKAGE.rglob("*")) if p.suffix in SOURCES
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long


def test_no_python_function_is_longer_than_80_lines() -> None:
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = n
    assert not long
