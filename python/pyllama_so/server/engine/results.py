"""After a step: the text of the tokens it sampled, streamed to the jobs as it becomes final, and the jobs that end
(Done with their usage and timings), are cancelled, or run out of the shutdown's grace period."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyllama_so import _llama
from pyllama_so.server.engine.job import SHUTTING_DOWN, Delta, Done, Failed, Job, Timings, Usage, emit
from pyllama_so.server.engine.job_queue import JobQueue
from pyllama_so.server.engine.slot import RetiredSamplers, Slot, SlotState
from pyllama_so.server.engine.stats import StepStats

log = logging.getLogger("pyllama_so.server")


@dataclass(frozen=True, slots=True)
class Sampled:
    """A token a step sampled for a slot's job, with its logprob and top alternatives when the job asked for them,
    and when the step ended."""

    slot: Slot
    job: Job
    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None
    t: float


class Results:
    """Emits the jobs' events on the engine thread; publish() replaces the engine's snapshot."""

    def __init__(self, model: _llama.Model, slots: Sequence[Slot], queue: JobQueue, stats: StepStats,
                 retired: RetiredSamplers, publish: Callable[[], None]) -> None:
        self._model = model
        self._slots = slots
        self._queue = queue
        self._stats = stats
        self._retired = retired
        self._publish = publish

    def stream(self, sampled: Sequence[Sampled]) -> None:
        """The text of sampled tokens, in order: emitted as it becomes final; a request ends at an end-of-generation
        token, a stop string, or the limit found when the token was sampled (Slot.continues). A request that ended is
        in a snapshot published here (not only at the end of the next step, which may never come)."""
        n_jobs = sum(s.job is not None for s in self._slots)
        for out in sampled:
            s, job = out.slot, out.job
            if s.job is not job:  # cancelled, or ended by the shutdown's grace period
                continue
            assert s.text is not None
            if job.max_tokens == 0:  # the prompt is in the cache: nothing to generate
                self.finish(s, "length", out.t)
                continue
            eog = self._model.is_eog(out.token)
            if s.logprob_rows is not None and not eog:
                s.logprob_rows.add(out.token, (out.logprob, out.top or []))
            if eog:
                self.finish(s, "stop", out.t)
                continue
            s.n_generated += 1
            ready = s.text.push(out.token)
            if ready:
                s.sent += len(ready)
                s.has_new_line = s.has_new_line or "\n" in ready
                tokens = tuple(s.text.tokens[s.tokens_sent:])
                s.tokens_sent = len(s.text.tokens)
                emit(job, Delta(ready, tuple(s.logprob_rows.take(s.sent)) if s.logprob_rows else (), tokens, s.id))
            if s.text.stopped:
                self.finish(s, "stop", out.t)
            elif not s.continues:
                self.finish(s, "length", out.t)
        if sum(s.job is not None for s in self._slots) != n_jobs:
            self._publish()

    def finish(self, s: Slot, reason: str, now: float) -> None:
        """The slot's job ends with Done: the rest of its text, its usage and timings."""
        job = s.job
        assert job is not None and s.text is not None
        if s.state is SlotState.PREFILL:  # the shutdown's grace ended before the prompt did
            s.t_prompt_end = now
        prompt_start = s.t_prompt_start if s.t_prompt_start is not None else s.t_prompt_end
        evaluated = len(job.prompt) - s.cached - len(s.pending)
        timings = Timings(cache_n=s.cached, prompt_n=evaluated, prompt_ms=1e3 * (s.t_prompt_end - prompt_start),
                          predicted_n=len(s.text.tokens), predicted_ms=1e3 * (now - s.t_prompt_end),
                          queue_ms=1e3 * (s.t_admitted - job.submitted))
        usage = Usage(prompt_tokens=len(job.prompt), cached_tokens=s.cached, completion_tokens=len(s.text.tokens))
        tail = s.text.finish()
        s.has_new_line = s.has_new_line or "\n" in tail
        rows = tuple(s.logprob_rows.take(s.sent + len(tail), final=True)) if s.logprob_rows else ()
        tokens = tuple(s.text.tokens[s.tokens_sent:])
        s.tokens_sent = len(s.text.tokens)
        s.release(self._retired)
        s.last_timings = timings
        self._stats.job_done(timings)
        log.info("%s slot %d: prompt %d tokens (%d cached, %d evaluated, %.1f ms, %.1f t/s), generated %d "
                 "(%.1f ms, %.1f t/s), queued %.1f ms, finish %s", job.id, s.id, usage.prompt_tokens,
                 timings.cache_n, timings.prompt_n, timings.prompt_ms, timings.prompt_per_second,
                 timings.predicted_n, timings.predicted_ms, timings.predicted_per_second, timings.queue_ms, reason)
        self._queue.retire(job, Done(tail, reason, usage, timings, rows, tokens, s.id, s.text.stop_word,
                                     len(s.tokens)))

    def release_cancelled(self, slot_ids: Sequence[int]) -> None:
        """Free the slots of cancelled jobs; what they evaluated stays cached."""
        for i in slot_ids:
            s = self._slots[i]
            job = s.job
            assert job is not None
            log.info("%s slot %d: cancelled after %d prompt tokens and %d generated", job.id, s.id,
                     len(job.prompt) - len(s.pending), len(s.text.tokens) if s.text else 0)
            s.release(self._retired)
            self._queue.retire(job, None)

    def end_grace(self, now: float, taken: Sequence[Job]) -> None:
        """The shutdown's grace period is over: running jobs end with what they have, waiting ones (taken: those
        just taken from the queue) fail."""
        with self._queue.lock:
            waiting = [*taken, *self._queue.clear()]
        running = [s for s in self._slots if s.job is not None]
        if running or waiting:
            log.info("the grace period is over: ending %d requests, failing %d waiting", len(running), len(waiting))
        for s in running:
            self.finish(s, "length", now)
        for job in waiting:
            self._queue.retire(job, Failed(SHUTTING_DOWN, stopped=True))
