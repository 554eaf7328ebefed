"""Fixtures of the server tests: the main server and its reference Llama, one of each per test module
(helpers.server has their sizes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.server import MAIN_ARGS, N_BATCH, N_UBATCH, SLOT_CTX, Server
from pyllama_so import Llama


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with Server(["-m", str(tiny_model), *MAIN_ARGS]) as s:
        yield s


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Llama]:
    with Llama(tiny_model, n_ctx=SLOT_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=2) as llm:
        yield llm
