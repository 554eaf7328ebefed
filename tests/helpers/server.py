"""The main server of the server tests and its reference (the fixtures server and llm in
tests/server/conftest.py): a server subprocess with the tiny model and 4 slots, Llama with the same context,
batch and ubatch, and the requests that keep them comparable."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import openai

from pyllama_so import Llama
from server_process import ServerProcess  # scripts/server_process.py, shared with scripts/server-scenario

# The main server: 4 slots of 256 tokens; Llama with the same context, batch and ubatch is the reference.
SLOT_CTX, N_BATCH, N_UBATCH = 256, 256, 32
MAIN_ARGS = ["-c", str(4 * SLOT_CTX), "-np", "4", "-b", str(N_BATCH), "-ub", str(N_UBATCH), "--queue-size", "8"]
PROMPT = "The quick brown fox jumps over the lazy dog. 0123456789"
# the timeout of clients and waits: a guard against a hang, not a limit on speed (a request may queue behind
# others on a machine busy with other work)
HANG_GUARD_S = 300


class Server(ServerProcess):
    """A server subprocess (scripts/server_process.py) with 2 threads, and its clients."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, api_key: str = "none") -> None:
        self.api_key = api_key
        super().__init__(["-t", "2", *args], env)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key, max_retries=0, timeout=HANG_GUARD_S, **kw)

    def post(self, path: str, body: Any = None, *, content: bytes | None = None, key: str | None = None,
             timeout: float = HANG_GUARD_S) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key or self.api_key}", "Content-Type": "application/json"}
        return httpx.post(f"{self.url}{path}", json=body if content is None else None, content=content,
                          headers=headers, timeout=timeout)

    def slots(self) -> dict[str, Any]:
        """The engine's snapshot (GET /engine: slots, queue, step counters, split overlap)."""
        return httpx.get(f"{self.url}/engine", headers={"Authorization": f"Bearer {self.api_key}"},
                         timeout=HANG_GUARD_S).json()


def reference(llm: Llama, prompt: str | list[int], max_tokens: int | None) -> tuple[str, str, int, int]:
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
    return (out["choices"][0]["text"], out["choices"][0]["finish_reason"], out["usage"]["prompt_tokens"],
            out["usage"]["completion_tokens"])


def unique_tokens(seed: int, n: int) -> list[int]:
    """A prompt of token ids no other test's prompt starts like (after BOS), so no slot has it cached."""
    return [1] + np.random.default_rng(1000 + seed).integers(3, 500, n - 1).tolist()


def clear_slot_caches(server: Server, seed: int) -> None:
    """Every slot then holds a unique prompt, so that the next request evaluates its prompt (but BOS) whatever the
    requests before: a prompt found in a slot's cache has its last token evaluated alone, and a batch of one token
    can take other kernels than a longer one (the next sampled text then drifts)."""
    r = server.post("/v1/completions", {"prompt": unique_tokens(seed, 8), "n": 4, "max_tokens": 1})
    assert r.status_code == 200, r.text
