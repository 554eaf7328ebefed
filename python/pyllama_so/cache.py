"""llama-cpp-python's prompt cache for Llama.set_cache: states (LlamaState) of earlier completions, keyed by the
tokens their context held; a completion whose prompt shares a longer prefix with a cached state than with what
the context holds starts from that state. In memory, least recently used first out past capacity_bytes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pyllama_so.generation.sequence import common_prefix
from pyllama_so.generation.state import LlamaState


class LlamaRAMCache:
    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._states: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()
        self.cache_size = 0  # bytes of the cached states

    def _longest(self, key: Sequence[int]) -> tuple[int, ...] | None:
        best, best_n = None, 0
        for k in self._states:
            n = common_prefix(k, key)
            if n > best_n:
                best, best_n = k, n
        return best

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        """The state whose tokens share the longest prefix with key (KeyError when none shares any)."""
        k = self._longest(key)
        if k is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self._states.move_to_end(k)
        return self._states[k]

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._longest(key) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(int(t) for t in key)
        old = self._states.pop(k, None)
        if old is not None:
            self.cache_size -= int(old.llama_state_size)
        self._states[k] = value
        self.cache_size += int(value.llama_state_size)
        while self._states and self.cache_size > self.capacity_bytes:
            self.cache_size -= int(self._states.popitem(last=False)[1].llama_state_size)

    def __len__(self) -> int:
        return len(self._states)


LlamaCache = LlamaRAMCache  # llama-cpp-python's name of the in-memory cache
