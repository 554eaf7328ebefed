"""The repository's folders, as the tests find them (tests/conftest.py puts SCRIPTS on sys.path)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"  # the commands and the modules beside them (server_process, gpu_check, ...)
DATA = REPO / "tests" / "data"
