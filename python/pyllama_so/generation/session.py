"""Llama's one sequence (seq_id 0 of its context): the tokens its KV cache holds, their logits rows when Llama
keeps them (logits_all), and the generation loop over them. The rules it follows (prefix reuse, the context end,
prompt scoring) are the ones the server's slots follow: sequence.py, limits.py, scoring.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pyllama_so import _llama
from pyllama_so.generation import limits, scoring, sequence
from pyllama_so.generation.hooks import LogitsProcessor, StoppingCriteria
from pyllama_so.generation.logprobs import TokenLogprob

Logprobs = tuple[float | None, list[tuple[int, float]]]  # a token's, and its top alternatives


class Session:
    """The sequence of a Llama's context. tokens: what its cache holds, in order; logits_all: each evaluated
    token's logits row is kept in scores_rows(); backend_sampling: a chain runs in the decode graph where it can."""

    def __init__(self, ctx: _llama.Context, *, logits_all: bool, backend_sampling: bool) -> None:
        self.ctx = ctx
        self.tokens: list[int] = []
        self.logits_all = logits_all
        self.backend_sampling = backend_sampling
        self._scores: np.ndarray | None = None  # logits_all: (n_ctx, n_vocab), rows [0, len(tokens)) valid

    def scores_rows(self) -> np.ndarray:
        if not self.logits_all:
            raise RuntimeError("the logits of evaluated tokens are kept only with Llama(logits_all=True)")
        if self._scores is None:  # np.empty: the OS commits pages as rows are written
            self._scores = np.empty((self.ctx.n_ctx, self.ctx.model.n_vocab), dtype=np.single)
        return self._scores

    def keep_rows(self, start: int, rows: np.ndarray) -> None:
        """logits_all: store the logits rows of positions start, start + 1, ..."""
        if self.logits_all:
            self.scores_rows()[start:start + len(rows)] = rows

    def clear(self) -> None:
        self.ctx.clear()
        self.tokens.clear()

    def eval(self, tokens: list[int]) -> np.ndarray:
        """Append tokens; their logits rows, shape (len(tokens), n_vocab)."""
        if len(self.tokens) + len(tokens) > self.ctx.n_ctx:
            raise _llama.ContextFullError(f"{len(self.tokens)} cached + {len(tokens)} new tokens exceed "
                                          f"n_ctx={self.ctx.n_ctx}")
        logits = self.ctx.decode(tokens, all_logits=True)
        self.keep_rows(len(self.tokens), logits)
        self.tokens.extend(tokens)
        return logits

    def check_prompt(self, tokens: Sequence[int]) -> None:
        """A prompt must be non-empty and leave room for a token (PromptTooLongError, llama-cpp-python's words)."""
        if not tokens:
            raise ValueError("the prompt is empty")
        if not limits.prompt_fits(len(tokens), self.ctx.n_ctx):
            raise _llama.PromptTooLongError(f"Requested tokens ({len(tokens)}) exceed context window of "
                                            f"{self.ctx.n_ctx}")

    def prefill(self, tokens: list[int]) -> int:
        """Bring the sequence to `tokens`, reusing the common cached prefix; the last token's logits stay in
        the context (output -1) for the sampler. Returns how many tokens were evaluated."""
        self.check_prompt(tokens)
        keep = sequence.reuse_prefix(self.ctx, 0, self.tokens, tokens)
        if self.logits_all:  # every row, as llama-cpp-python's eval; the last stays for the sampler
            self.keep_rows(keep, self.ctx.decode(tokens[keep:], all_logits=True))
        else:
            self.ctx.prefill(tokens[keep:])
        self.tokens.extend(tokens[keep:])
        return len(tokens) - keep

    def score_prompt(self, tokens: list[int], n_top: int, piece: Callable[[int], str]) -> list[TokenLogprob]:
        """echo with logprobs: the prompt evaluated from its start, each token scored (scoring.score_prompt);
        the sequence then holds the prompt, its last token's logits the context's last output."""
        self.check_prompt(tokens)
        return scoring.score_prompt(self.ctx, 0, self.tokens, tokens, n_top, piece, self.ctx.model.token_bos,
                                    rows=self.scores_rows()[:len(tokens)] if self.logits_all else None)

    def use_backend(self, sampler: _llama.Sampler, n_logprobs: int | None, slow: bool) -> None:
        """Put the chain in the decode graph where the call lets it (no logprobs, no Python hooks)."""
        if self.backend_sampling and n_logprobs is None and not slow:
            self.ctx.set_backend_sampler(0, sampler)  # llama.cpp may keep it on the CPU (split_mode="tensor")

    def steps(self, tokens: list[int], sampler: _llama.Sampler, max_tokens: int | None, stop_on_eog: bool,
              n_logprobs: int | None, logits_processor: LogitsProcessor | None,
              stopping_criteria: StoppingCriteria | None) -> Iterator[tuple[int, Logprobs | None]]:
        """(token, logprobs or None) per generated token after the prompt `tokens`, which the sequence holds (its
        last token's logits the context's last output). Stops at an end-of-generation token (stop_on_eog; not
        yielded), the stopping criteria, max_tokens or the context's end (limits.goes_on)."""
        ctx, model = self.ctx, self.ctx.model
        slow = logits_processor is not None or stopping_criteria is not None
        sampler.accept(tokens)  # penalties and DRY count the prompt, as in llama-cpp-python
        produced = 0
        tok = self._slow_sample(sampler, logits_processor) if slow else sampler.sample(ctx)
        while True:
            lp = None if n_logprobs is None else ctx.logprobs(tok, n_logprobs)
            if stop_on_eog and model.is_eog(tok):
                return
            if stopping_criteria is not None and stopping_criteria(
                    np.array(self.tokens + [tok], dtype=np.intc), ctx.logits_view(-1)):
                return
            yield tok, lp
            produced += 1
            if not limits.goes_on(produced, len(self.tokens), max_tokens, ctx.n_ctx):
                return
            if slow:
                ctx.prefill([tok])
                self.tokens.append(tok)
                tok = self._slow_sample(sampler, logits_processor)
            else:
                nxt = ctx.decode_sample(sampler, tok)
                self.tokens.append(tok)
                tok = nxt
            if self.logits_all:  # the row of the token just decoded (the context's last output)
                self.keep_rows(len(self.tokens) - 1, ctx.logits_view(-1)[None, :])

    def _slow_sample(self, sampler: _llama.Sampler, logits_processor: LogitsProcessor | None) -> int:
        if logits_processor is None:
            return sampler.sample(self.ctx)
        scores = logits_processor(np.array(self.tokens, dtype=np.intc), self.ctx.logits_view(-1).copy())
        return sampler.sample_logits(np.asarray(scores, dtype=np.float32))
