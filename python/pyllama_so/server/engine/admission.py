"""Carrying an Admission out: the job's sampler chain, the slot's cache cut to the prefix it keeps (or the prompt
scored into it), and the slot set up for the request."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import numpy as np

from pyllama_so import _llama
from pyllama_so.generation import sampler as chains, scoring, sequence, text
from pyllama_so.generation.logprobs import LogprobRows, TokenLogprob
from pyllama_so.server.engine.job import Delta, Failed, Job, emit
from pyllama_so.server.engine.job_queue import JobQueue
from pyllama_so.server.engine.scheduler import Admission
from pyllama_so.server.engine.slot import Slot, SlotState


class Admitter:
    """Gives jobs their slots on the engine thread (backend_sampling: a slot's chain goes into the decode graph)."""

    def __init__(self, ctx: _llama.Context, slots: Sequence[Slot], queue: JobQueue, *,
                 backend_sampling: bool) -> None:
        self._ctx = ctx
        self._model = ctx.model
        self._n_ctx_slot = ctx.n_ctx_seq
        self._slots = slots
        self._queue = queue
        self._backend_sampling = backend_sampling

    @functools.cached_property
    def _eog_tokens(self) -> np.ndarray:
        """The vocabulary's end-of-generation tokens, found once, when a job first ignores them."""
        return np.array([t for t in range(self._model.n_vocab) if self._model.is_eog(t)], dtype=np.int64)

    def admit(self, a: Admission) -> bool:
        """Carry the admission out. True when it went as planned; False when the job ended instead (cancelled, or
        a sampler or prompt scores it cannot have) or the slot kept fewer tokens than planned."""
        job = a.job
        if job.cancelled:
            self._queue.retire(job, None)
            return False
        sampler = self._sampler(job)
        if sampler is None:
            return False
        slot = self._slots[a.slot]
        scored: list[TokenLogprob] = []
        t_scored = 0.0
        if job.prompt_logprobs is not None:
            t_scored = time.perf_counter()
            try:
                scored = scoring.score_prompt(self._ctx, slot.id, slot.tokens, job.prompt, job.prompt_logprobs,
                                              text.piece_of(self._model), self._model.token_bos)
                # the prompt but its last token stays: the job's first step evaluates it again for its logits
                keep = sequence.cut(self._ctx, slot.id, slot.tokens, len(job.prompt) - 1)
            except (_llama.LlamaError, ValueError) as e:
                sampler.free()
                self._queue.retire(job, Failed(f"the prompt could not be scored: {e}"))
                return False
        else:
            keep = sequence.reuse_prefix(self._ctx, slot.id, slot.tokens, job.prompt, reuse=job.cache_prompt,
                                         shared=a.prefix)
        self._start(slot, job, sampler, keep, scored, t_scored)
        return keep == a.keep

    def _sampler(self, job: Job) -> _llama.Sampler | None:
        """The job's llama.cpp sampler chain, seeded per request; None when it cannot have one (the job ends)."""
        params = job.sampling if job.seed is None else dataclasses.replace(job.sampling, seed=job.seed)
        if job.ignore_eos:  # as llama-server: a bias of -inf on every end-of-generation token
            params = chains.with_banned(params, self._eog_tokens)
        try:
            return chains.new_sampler(self._model, params, n_ctx=self._n_ctx_slot, grammar=job.grammar)
        except ValueError as e:  # the HTTP side checks first; a job submitted without that check fails alone
            self._queue.retire(job, Failed(str(e)))
            return None

    def _start(self, slot: Slot, job: Job, sampler: _llama.Sampler, keep: int, scored: list[TokenLogprob],
               t_scored: float) -> None:
        """The slot takes the job, its cache holding the first keep tokens of the prompt (scored: the prompt's rows
        when the job asked for them, scored from t_scored)."""
        slot.job, slot.task, slot.state = job, job, SlotState.PREFILL
        slot.pending = list(job.prompt[keep:])
        slot.cached, slot.evaluated, slot.tokens_sent, slot.has_new_line = keep, 0, 0, False
        slot.text = text.text_stream(self._model, job.stop, job.special_text)
        slot.sent = 0
        slot.logprob_rows = None if job.logprobs is None else LogprobRows(
            text.piece_of(self._model), sum(len(r.text) for r in scored))
        slot.sampler = sampler
        slot.n_sampled, slot.continues = 0, False
        slot.sampler.accept(job.prompt)  # penalties and DRY count the prompt, as Llama does
        if self._backend_sampling and job.logprobs is None:
            self._ctx.set_backend_sampler(slot.id, slot.sampler)  # llama.cpp may keep it on the CPU
        slot.t_admitted, slot.t_prompt_start = time.perf_counter(), None
        slot.n_requests += 1
        slot.n_prompt_cached += keep
        if job.prompt_logprobs is not None:  # evaluated, not reused; its rows ahead of the generated tokens' text
            slot.cached, slot.evaluated, slot.t_prompt_start = 0, keep, t_scored
            slot.n_prompt_cached -= keep
            slot.n_prompt_evaluated += keep
            emit(job, Delta("", tuple(scored), slot=slot.id))
