"""The file of `--kl-divergence-base`: what a later `--kl-divergence` run compares against.

A NumPy .npz archive (a zip of .npy arrays, deflate-compressed; `numpy.load(FILE)` reads it):

| array | type, shape | what |
|---|---|---|
| `format` | str | `pyllama_so-kld-base-1` |
| `model` | str | the base's model file name and llama.cpp description |
| `settings` | str | the base's flags, as JSON (for the report) |
| `n_ctx`, `n_vocab`, `top_k` | int64 | chunk size, vocabulary size, tokens kept per position |
| `add_bos`, `bos` | bool, int64 | whether each chunk's first token is replaced by the BOS token, and that token |
| `tokens` | int32 (n_chunk * n_ctx,) | the evaluated tokens, as tokenized (before the BOS replacement) |
| `top_ids` | int32 (n_scored, top_k) | per scored position, the base's most probable tokens, best first |
| `top_logp` | float32 (n_scored, top_k) | their log-probabilities |
| `rest_logp` | float32 (n_scored,) | log of the probability of all other tokens together |
| `target_logp` | float32 (n_scored,) | log-probability of the token that came next (the base's perplexity) |

Positions are scored as llama-perplexity scores them: in each chunk of n_ctx tokens, the logits of positions
n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1, so n_scored = n_chunk * (n_ctx - 1 - n_ctx/2).
llama.cpp's own format keeps every token's whole distribution (uint16, n_vocab per position: 128 KiB per
position for a 65536-token vocabulary); the top k and the rest take 8 k + 8 bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_so.perplexity.scoring import BaseRows

FORMAT = "pyllama_so-kld-base-1"


def scored_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


@dataclass
class BaseFile:
    model: str
    settings: dict[str, Any]
    n_ctx: int
    n_vocab: int
    top_k: int
    add_bos: bool
    bos: int
    tokens: np.ndarray
    rows: BaseRows

    @property
    def n_chunk(self) -> int:
        return len(self.tokens) // self.n_ctx

    def chunk_rows(self, i: int) -> BaseRows:
        n = scored_per_chunk(self.n_ctx)
        return self.rows.slice(i * n, (i + 1) * n)

    def save(self, path: Path) -> None:
        """Write to path (under a temporary name first: an interrupted run leaves no half file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        try:
            with tmp.open("wb") as f:
                np.savez_compressed(
                    f, format=np.array(FORMAT), model=np.array(self.model),
                    settings=np.array(json.dumps(self.settings)),
                    n_ctx=np.int64(self.n_ctx), n_vocab=np.int64(self.n_vocab), top_k=np.int64(self.top_k),
                    add_bos=np.bool_(self.add_bos), bos=np.int64(self.bos), tokens=self.tokens.astype(np.int32),
                    top_ids=self.rows.top_ids, top_logp=self.rows.top_logp, rest_logp=self.rows.rest_logp,
                    target_logp=self.rows.target_logp)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def load(path: Path) -> BaseFile:
        """Read a file that save() wrote; ValueError naming the file when it is not one, or is inconsistent."""
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:  # not a zip / not .npy inside
            raise ValueError(f"{path}: not a --kl-divergence-base file ({e})") from None
        with z:
            if "format" not in z.files or str(z["format"]) != FORMAT:
                raise ValueError(f"{path}: not a --kl-divergence-base file of this version (expected {FORMAT})")
            base = BaseFile(str(z["model"]), json.loads(str(z["settings"])), int(z["n_ctx"]), int(z["n_vocab"]),
                            int(z["top_k"]), bool(z["add_bos"]), int(z["bos"]), z["tokens"],
                            BaseRows(z["top_ids"], z["top_logp"], z["rest_logp"], z["target_logp"]))
        n_scored = base.n_chunk * scored_per_chunk(base.n_ctx)
        if len(base.tokens) % base.n_ctx or len(base.rows) != n_scored or base.rows.top_ids.shape[1:] != (base.top_k,):
            raise ValueError(f"{path}: inconsistent sizes ({len(base.tokens)} tokens, n_ctx {base.n_ctx}, "
                             f"{len(base.rows)} scored positions, top_ids {base.rows.top_ids.shape})")
        return base
