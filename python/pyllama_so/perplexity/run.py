"""One perplexity run: the chunks of a text (or of a base file's tokens) through a model, and the summary."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_so import _llama, config
from pyllama_so.perplexity.base_file import BaseFile, scored_per_chunk
from pyllama_so.perplexity.scoring import BaseRows, Comparison, base_rows, compare, target_nll

# Lewis Carroll, Alice's Adventures in Wonderland (1865; public domain), the Millennium Fulcrum Edition 2.9 text
# that the Canterbury corpus has as alice29.txt, taken from the Brotli 1.2.1 source distribution on PyPI
# (tests/testdata/alice29.txt, sha256 7467306e...c38f0) with its CRLF line ends made LF: 148481 bytes.
TEXT = resources.files("pyllama_so") / "data" / "alice29.txt"

DEFAULT_TOP_K = 64


@dataclass(frozen=True)
class Settings:
    """The model, context and chunking of a run; the flags of args.MODEL_FLAGS plus -c, --chunks, --kl-top-k."""

    model: str
    n_ctx: int = 512
    n_chunks: int = 0  # 0: every whole chunk of the text
    n_batch: int = 2048
    n_ubatch: int | None = None  # None: config.ContextParams' default for the chunk-sized batch
    n_gpu_layers: int = -1
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    attn_split: tuple[float, ...] = ()
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_threads: int = -1
    split_overlap: bool = False
    rpc_servers: tuple[str, ...] = ()
    top_k: int = DEFAULT_TOP_K

    def __post_init__(self) -> None:
        if self.n_ctx < 4:
            raise ValueError(f"n_ctx must be >= 4 (half of each chunk is scored), got {self.n_ctx}")
        if self.n_chunks < 0:
            raise ValueError(f"n_chunks must be >= 0 (0: all), got {self.n_chunks}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        config.check_combination(self.model_params(), self.context_params())  # Llama's rules

    def model_params(self) -> config.ModelParams:
        return config.ModelParams(n_gpu_layers=self.n_gpu_layers, split_mode=self.split_mode, main_gpu=self.main_gpu,
                                  tensor_split=self.tensor_split or None, attn_split=self.attn_split or None,
                                  rpc_servers=self.rpc_servers or None)

    def context_params(self) -> config.ContextParams:
        """A context of one chunk: n_batch and n_ubatch at most one chunk (llama-perplexity's n_batch); an
        n_ubatch above n_batch is refused as everywhere."""
        return config.ContextParams(
            n_ctx=self.n_ctx, n_batch=self.batch,
            n_ubatch=None if self.n_ubatch is None else min(self.n_ubatch, self.n_ctx),
            n_threads=self.n_threads, n_threads_batch=self.n_threads, flash_attn=self.flash_attn, type_k=self.type_k,
            type_v=self.type_v, split_overlap=self.split_overlap)

    @property
    def batch(self) -> int:
        """llama-perplexity's n_batch: at most one chunk."""
        return min(self.n_batch, self.n_ctx)

    @property
    def ubatch(self) -> int:
        n_ubatch = self.context_params().n_ubatch
        assert n_ubatch is not None  # None given becomes the default in ContextParams.__post_init__
        return n_ubatch

    def flags(self) -> dict[str, Any]:
        """What the report and the base file record."""
        d = dataclasses.asdict(self)
        d["model"] = os.path.basename(self.model)
        d.update(n_batch=self.batch, n_ubatch=self.ubatch)
        return d


def _stats(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error."""
    n = len(x)
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0


@dataclass
class Summary:
    model: str
    settings: dict[str, Any]
    n_ctx: int
    n_chunk: int
    n_scored: int
    seconds: float
    nll: np.ndarray = field(repr=False)
    base: BaseFile | None = field(default=None, repr=False)  # with --kl-divergence
    comparison: Comparison | None = field(default=None, repr=False)
    split_overlap_stats: dict[str, Any] | None = None

    @property
    def ppl(self) -> tuple[float, float]:
        """exp(mean NLL) and its standard error, as llama-perplexity's final estimate."""
        mean, err = _stats(self.nll)
        return math.exp(mean), math.exp(mean) * err

    def kld(self) -> dict[str, Any] | None:
        if self.comparison is None or self.base is None:
            return None
        c, base_nll = self.comparison, -self.base.rows.target_logp.astype(np.float64)[: self.n_scored]
        kld = c.kld
        mean, err = _stats(kld)
        # the base's log-probabilities are float32: this run's NLL rounded alike, so a run against its own base is 1
        ln_ratio, ln_err = _stats(self.nll.astype(np.float32).astype(np.float64) - base_nll)
        same, n = float(c.same_top.mean()), len(kld)
        dp = c.target_p - np.exp(-base_nll)
        base_mean, base_err = _stats(base_nll)
        q = np.quantile(kld, [0.999, 0.99, 0.95, 0.5])
        return {
            "ppl_base": math.exp(base_mean), "ppl_base_stderr": math.exp(base_mean) * base_err,
            "ln_ppl_ratio": ln_ratio, "ln_ppl_ratio_stderr": ln_err,
            "ppl_ratio": math.exp(ln_ratio), "ppl_ratio_stderr": math.exp(ln_ratio) * ln_err,
            "kld_mean": mean, "kld_stderr": err, "kld_max": float(kld.max()), "kld_p999": float(q[0]),
            "kld_p99": float(q[1]), "kld_p95": float(q[2]), "kld_median": float(q[3]), "kld_min": float(kld.min()),
            "same_top": same, "same_top_stderr": math.sqrt(same * (1 - same) / n) if n > 1 else 0.0,
            "rms_dp": float(np.sqrt((dp ** 2).mean())), "base_rest_mass": float(c.rest_p.mean()),
            "top_k": self.base.top_k, "base_model": self.base.model, "base_settings": self.base.settings,
        }

    def to_dict(self) -> dict[str, Any]:
        ppl, err = self.ppl
        return {"model": self.model, "settings": self.settings, "n_ctx": self.n_ctx, "n_chunk": self.n_chunk,
                "n_scored": self.n_scored, "seconds": self.seconds, "ppl": ppl, "ppl_stderr": err,
                "kld": self.kld(), "split_overlap_stats": self.split_overlap_stats}


Progress = Callable[[int, int, float, float], None]  # chunks done, chunks, PPL so far, seconds so far


def tokenize_text(model: _llama.Model, text: str) -> np.ndarray:
    return np.asarray(model.tokenize(text, add_special=True), dtype=np.int32)


def run(settings: Settings, *, text: str | None = None, base_in: BaseFile | None = None,
        base_out: Path | None = None, progress: Progress | None = None) -> Summary:
    """Perplexity of text (or, with base_in, of its tokens, compared with it), saving a base file to base_out.

    ValueError: a text shorter than one chunk, a base of another vocabulary or chunk size, bad settings."""
    if (text is None) == (base_in is None):
        raise ValueError("give either a text or a base to compare with")
    if base_in is not None and base_in.n_ctx != settings.n_ctx:
        raise ValueError(f"the base was evaluated in chunks of {base_in.n_ctx} tokens, not {settings.n_ctx}")
    if not os.path.isfile(settings.model):
        raise FileNotFoundError(f"model file not found: {settings.model}")
    model = config.load_model(settings.model, settings.model_params())
    ctx = None
    try:
        n_ctx = settings.n_ctx
        if base_in is not None:
            if base_in.n_vocab != model.n_vocab:
                raise ValueError(f"the base has a vocabulary of {base_in.n_vocab} tokens, this model {model.n_vocab}")
            tokens, add_bos, bos = base_in.tokens, base_in.add_bos, base_in.bos
        else:
            tokens, add_bos, bos = tokenize_text(model, text or ""), bool(model.add_bos), model.token_bos
        n_chunk = len(tokens) // n_ctx
        if n_chunk == 0:
            raise ValueError(f"the text has {len(tokens)} tokens, fewer than one chunk of n_ctx={n_ctx}")
        if settings.n_chunks:
            n_chunk = min(n_chunk, settings.n_chunks)
        ctx = config.create_context(model, settings.context_params())
        first = n_ctx // 2
        nll_parts: list[np.ndarray] = []
        rows_out: list[BaseRows] = []
        comparisons: list[Comparison] = []
        t0 = time.perf_counter()
        for i in range(n_chunk):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
            if add_bos:
                chunk[0] = bos
            ctx.clear()
            # the logits of positions first .. n_ctx-2 score tokens first+1 .. n_ctx-1 (the last one's are unused)
            logits = ctx.decode(chunk, all_logits=True, logits_from=first)[:-1]
            targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx].astype(np.int64)
            nll_parts.append(target_nll(logits, targets))
            if base_out is not None:
                rows_out.append(base_rows(logits, targets, settings.top_k))
            if base_in is not None:
                comparisons.append(compare(logits, targets, base_in.chunk_rows(i)))
            del logits
            if progress is not None:
                progress(i + 1, n_chunk, math.exp(float(np.concatenate(nll_parts).mean())), time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        so_stats = ctx.split_overlap_stats() if settings.split_overlap else None
        desc = f"{os.path.basename(settings.model)} ({model.desc})"
        if base_out is not None:
            BaseFile(desc, settings.flags(), n_ctx, model.n_vocab, min(settings.top_k, model.n_vocab), add_bos, bos,
                     np.asarray(tokens[:n_chunk * n_ctx], dtype=np.int32), BaseRows.concat(rows_out)).save(base_out)
    finally:
        if ctx is not None:
            ctx.free()
        model.free()
    nll = np.concatenate(nll_parts)
    assert len(nll) == n_chunk * scored_per_chunk(n_ctx)
    return Summary(desc, settings.flags(), n_ctx, n_chunk, len(nll), seconds, nll, base_in,
                   Comparison(*(np.concatenate([getattr(c, f.name) for c in comparisons])
                                for f in dataclasses.fields(Comparison))) if comparisons else None,
                   so_stats)
