"""Llama.set_cache with pyllama_so.cache.LlamaRAMCache (llama-cpp-python's prompt cache): a completion whose prompt
extends an earlier one's starts from that state (the same text as without the cache), and the cache keeps
within its capacity, least recently used out first."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama_so import Llama
from pyllama_so.cache import LlamaCache, LlamaRAMCache


def test_a_prompt_that_extends_a_cached_one_starts_from_its_state(tiny_model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    a = "The quick brown fox jumps over the lazy dog and"
    b = "Something else entirely, to fill the context"
    with Llama(tiny_model, n_ctx=512, n_threads=2) as plain:
        want = plain.create_completion(a + " then", max_tokens=6, temperature=0)["choices"][0]["text"]
    with Llama(tiny_model, n_ctx=512, n_threads=2) as llm:
        llm.set_cache(LlamaRAMCache())
        loads: list[int] = []
        real = llm.load_state
        monkeypatch.setattr(llm, "load_state", lambda st: (loads.append(st.n_tokens), real(st))[1])
        llm.create_completion(a, max_tokens=4, temperature=0)
        llm.create_completion(b, max_tokens=4, temperature=0)  # the context now holds b
        assert loads == [] and len(llm.cache) == 2
        got = llm.create_completion(a + " then", max_tokens=6, temperature=0)["choices"][0]["text"]
        assert len(loads) == 1 and loads[0] > len(llm.tokenize(a.encode())) - 1  # a's prompt and its tokens
        assert got == want
        llm.set_cache(None)
        assert llm.cache is None


def test_the_cache_keeps_within_its_capacity(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:
        one = llm.create_completion("Hello", max_tokens=2, temperature=0) and llm.save_state()
        size = int(one.llama_state_size)
        cache = LlamaCache(capacity_bytes=2 * size + size // 2)  # two states fit, not three
        assert LlamaCache is LlamaRAMCache
        for i, key in enumerate(([1, 2, 3], [4, 5], [6])):
            cache[key] = one
            assert cache.cache_size <= cache.capacity_bytes and len(cache) == min(i + 1, 2)
        assert [1, 2, 9] not in cache and [4, 5, 7] in cache  # [1, 2, 3], the oldest, went
        assert cache[[6, 6]] is one
        with pytest.raises(KeyError):
            cache[[8]]
    with pytest.raises(ValueError, match="capacity_bytes"):
        LlamaRAMCache(-1)
