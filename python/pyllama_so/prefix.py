"""How many tokens two token sequences share from the start: the prefix a cache can keep (Llama's context, the
prompt cache, the server's slots)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of a's and b's common prefix (numpy: prompts may have 100k tokens)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n
