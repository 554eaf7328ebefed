"""The Engine: the slots of one llama.cpp context, and the thread that runs their steps.

Each turn of the engine thread (_step) is llama-server's pre-decode / decode / post-decode, or vLLM's schedule() /
update_from_output(): the step on the devices ends and what it sampled is recorded into the slots (Executor.collect);
the free slots take waiting jobs and the scheduler plans the next step (Scheduler.take, Scheduler.schedule: a
StepPlan); the plan is carried out (Admitter.admit, Executor.launch); and while that step runs on the devices, the
text of the one that ended is streamed to the jobs (Results.stream). Whether a slot goes on is decided from its
sampled token (end of generation, max_tokens, the end of its context) before the next step starts; a stop string,
found in the text afterwards, ends the request at once, and the one token the slot had in the running step is
decoded and dropped. When nothing is to be done on the context between two steps (no request to admit, none
cancelled), one call ends a step and starts the next (Executor.chain), with no Python between them.

Who may touch what (llama-server's split of a task queue from its results):
- The engine thread owns the Context, the Slots and their Samplers and the step counters: only it
  reads or writes them, and it calls into llama.cpp (decode, truncate, sampling) holding no lock.
  While a step runs, it makes no call on the Context and frees no Sampler of that step.
- Other threads (the HTTP side) go through the job queue: submit(), cancel(), drain() and stop()
  change a deque of waiting jobs and a few flags under one lock, which guards nothing else and under
  which no C call runs. Job.cancelled is the one field they write on a job the engine may hold.
- Results go the other way through each Job's emit callback, called on the engine thread.
- snapshot() returns the last EngineSnapshot the engine thread published: an immutable object that
  replaces the previous one whole after each step, so a reader never sees a half-written slot.

Everything here runs without HTTP.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from pyllama_so import _llama
from pyllama_so.generation import limits
from pyllama_so.server.engine.admission import Admitter
from pyllama_so.server.engine.executor import Executor
from pyllama_so.server.engine.job import SHUTTING_DOWN, EngineStopped, Failed, Job, PromptError, QueueFull
from pyllama_so.server.engine.job_queue import JobQueue
from pyllama_so.server.engine.results import Results
from pyllama_so.server.engine.scheduler import PREFIX_SHARE, Scheduler, StepPlan
from pyllama_so.server.engine.slot import RetiredSamplers, Slot, SlotInfo
from pyllama_so.server.engine.stats import EngineSnapshot, Step, StepStats

log = logging.getLogger("pyllama_so.server")


class Engine:
    """The slots of ctx (one per sequence, ctx.n_seq_max of them) and the thread that runs them.

    submit() a Job; it waits in a queue of at most queue_size jobs beyond the free slots (QueueFull
    after that) until a slot takes it. cancel() drops it wherever it is; a slot it held keeps what it
    evaluated. drain() starts a shutdown: no new jobs, and those accepted end within a grace period.
    on_step, if given, is called on the engine thread after each step (once the next one runs). The
    module docstring says which thread may touch what.
    """

    def __init__(self, ctx: _llama.Context, *, queue_size: int = 64,
                 on_step: Callable[[Step], None] | None = None, backend_sampling: bool = False,
                 chain_steps: bool = True, prefill_chunk: int | None = None,
                 prefix_share: float = PREFIX_SHARE) -> None:
        # fixed at construction: read from any thread
        self.ctx = ctx
        self.backend_sampling = backend_sampling  # slots' chains in the decode graph (Context.set_backend_sampler)
        self.chain_steps = chain_steps  # a step that needs no admission starts in the call that ends the one before
        self.model = ctx.model
        self.n_batch = ctx.n_batch
        self.n_ubatch = ctx.n_ubatch
        split_overlap = ctx.split_overlap_stats()
        # the most prompt tokens of a step while slots generate: by default one ubatch, with split overlap's lanes one
        # a lane (a piece of one ubatch runs on one lane beside the generated tokens' small ubatch, and nothing of the
        # prompt overlaps it: docs/benchmarks.md, "Mixed load")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        default_chunk = ctx.n_ubatch * (2 if split_overlap["enabled"] else 1)
        self.prefill_chunk = min(default_chunk if prefill_chunk is None else prefill_chunk, ctx.n_batch)
        self._scheduler = Scheduler(n_batch=self.n_batch, prefill_chunk=self.prefill_chunk, prefix_share=prefix_share)
        self.prefix_share = prefix_share  # 0: a cached prefix never decides the slot
        self.n_ctx_slot = ctx.n_ctx_seq
        self.n_slots = ctx.n_seq_max
        self.queue_size = queue_size
        self.on_step = on_step
        self._queue = JobQueue()
        self._lock = self._queue.lock  # the queue's (tests hold it to queue jobs for one step)
        # the engine thread's
        self._slots = [Slot(i) for i in range(self.n_slots)]
        self._stats = StepStats(self.n_ctx_slot, self.n_batch, self.n_ubatch, split_overlap)
        retired = RetiredSamplers()
        self._retired = retired
        self._results = Results(self.model, self._slots, self._queue, self._stats, retired, self._publish)
        self._admitter = Admitter(ctx, self._slots, self._queue, backend_sampling=backend_sampling)
        self._executor = Executor(ctx, self._slots, self._scheduler, self._stats, retired, self._queue, self._results,
                                  self._publish)
        # published by the engine thread, read anywhere
        self.error: BaseException | None = None
        self._snapshot: EngineSnapshot
        self._publish()
        self._thread = threading.Thread(target=self._run, name="pyllama_so-engine", daemon=True)

    # -- the HTTP side's calls (any thread) --

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the step in progress, fail every job left, and end the thread."""
        with self._lock:
            self._queue.stopping = True
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def drain(self, grace: float) -> None:
        """Begin a shutdown: submit() refuses new jobs from now on; the accepted ones run for at most grace
        more seconds, after which each one still generating ends as at its max_tokens (Done, "length")
        and each still waiting fails. A later call may shorten the grace (0: end them at the next step)."""
        deadline = time.perf_counter() + grace
        q = self._queue
        with self._lock:
            if q.accepting:
                log.info("shutting down: %d requests in progress or waiting get up to %g s", q.n_jobs, grace)
            q.accepting = False
            q.deadline = deadline if q.deadline is None else min(q.deadline, deadline)
            self._lock.notify_all()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._queue.stopping

    @property
    def accepting(self) -> bool:
        return self.running and self._queue.accepting

    def submit(self, job: Job) -> None:
        if not job.prompt:
            raise PromptError("the prompt is empty")
        # a completion needs room for one token after the prompt (llama-server refuses n_tokens >= n_ctx);
        # max_tokens 0 only evaluates the prompt into a slot's cache
        if not limits.prompt_fits(len(job.prompt), self.n_ctx_slot, generates=job.max_tokens != 0):
            raise PromptError(f"the prompt has {len(job.prompt)} tokens but a slot's context holds {self.n_ctx_slot}"
                              + ("" if job.max_tokens == 0 else ", the first generated token included"), too_long=True)
        if job.id_slot is not None and job.id_slot >= self.n_slots:
            raise ValueError(f"id_slot {job.id_slot} out of range: the server has {self.n_slots} slots")
        q = self._queue
        with self._lock:
            if not q.accepting:
                raise EngineStopped(SHUTTING_DOWN)
            if not self.running:
                raise EngineStopped("the engine is not running" + (f": {self.error}" if self.error else ""))
            if q.n_jobs >= self.n_slots + self.queue_size:
                raise QueueFull(f"all {self.n_slots} slots are busy and {self.queue_size} requests wait")
            q.put(job)

    def cancel(self, job: Job) -> None:
        """Drop the job: at once if it still waits, else at the engine's next step."""
        job.cancelled = True
        self._queue.withdraw(job)

    def snapshot(self) -> EngineSnapshot:
        """The slots and counters of the last step, and the queue now."""
        snap = self._snapshot  # the engine thread replaces it whole: one read is consistent
        with self._lock:
            waiting, accepting = len(self._queue.waiting), self._queue.accepting
        return replace(snap, waiting=waiting, queue_size=self.queue_size, running=self.running,
                       accepting=accepting and self.running,
                       error=None if self.error is None else str(self.error))

    # -- the engine thread --

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as e:  # a bug here must not leave requests hanging
            log.exception("the engine failed")
            self.error = e
            self._executor.abandon()
        with self._lock:
            self._queue.stopping = True
            waiting = self._queue.clear()
        failed = Failed(SHUTTING_DOWN if self.error is None else f"the engine failed: {self.error}", stopped=True)
        for s in self._slots:
            job = s.job
            if job is not None:
                s.release(self._retired)
                self._queue.retire(job, failed)
        for job in waiting:
            self._queue.retire(job, failed)
        self._publish()

    def _step(self) -> bool:
        """End the running step, plan the next (taking waiting jobs), start it, stream the text of the one that
        ended. False when the engine stops."""
        if self._chainable():
            out = self._executor.chain()
            self._step_published(out.step)
            self._results.stream(out.sampled)
            return True
        out = self._executor.collect()
        ended = out.step
        busy = any(s.job is not None for s in self._slots)
        if ended is not None and not out.sampled and not busy:
            self._step_published(ended)  # before waiting for work: nothing runs meanwhile
            ended = None
        work = self._take(has_work=bool(out.sampled) or busy)
        if work is None:
            return False
        taken, deadline = work
        # from here on without the lock: the slots are this thread's
        now = time.perf_counter()
        plan = self._scheduler.schedule(self._infos(), taken)
        self._results.release_cancelled(plan.release)
        if deadline is not None and now >= deadline:
            self._results.stream(out.sampled)
            self._results.end_grace(now, taken)
            self._step_published(ended)
            return True
        self._executor.launch(self._admit(plan))
        # while the step runs: the snapshot of the one that ended, then its text
        if ended is not None or not self._executor.running:  # idle: what cancels and admissions changed is in none
            self._step_published(ended)
        self._results.stream(out.sampled)
        return True

    def _chainable(self) -> bool:
        """Whether the running step can end and the next begin in one call (Executor.chain): nothing to do between
        them on the context (no admission, cancel, shutdown)."""
        if not self.chain_steps or not self._executor.chainable():
            return False
        q = self._queue
        with self._lock:
            return not (q.stopping or q.deadline is not None
                        or (q.waiting and any(s.job is None for s in self._slots)))

    def _take(self, has_work: bool) -> tuple[list[Job], float | None] | None:
        """Wait until there is work (has_work: sampled tokens to stream, or busy slots), then take the waiting jobs
        the free slots run now. Returns them and the shutdown's deadline; None when the engine stops."""
        q = self._queue
        with self._lock:
            idle = False
            while not (q.stopping or q.waiting or has_work):
                self._lock.wait()
                idle = True
            if idle:  # the devices waited for work, not for the host: the next step's host time starts now
                self._stats.t_end = time.perf_counter()
            if q.stopping:
                return None
            taken = self._scheduler.take(q.waiting, self._infos())
            q.remove(taken)
            return taken, q.deadline

    def _admit(self, plan: StepPlan) -> StepPlan:
        """Carry out the plan's admissions; where one does not go as planned (the job ended instead, or its slot kept
        less of its cache), plan the rest of the step again from the slots as they are. Returns the plan to launch."""
        while True:
            for i, a in enumerate(plan.admit):
                if not self._admitter.admit(a):
                    plan = self._scheduler.schedule(self._infos(), [b.job for b in plan.admit[i + 1:]])
                    self._results.release_cancelled(plan.release)
                    break
            else:
                return plan

    def _infos(self) -> list[SlotInfo]:
        return [s.info() for s in self._slots]

    def _step_published(self, ended: Step | None) -> None:
        """Publish the slots as the step that ended left them (and as admissions since changed them), then
        tell on_step."""
        self._publish()
        if ended is not None and self.on_step is not None:
            self.on_step(ended)

    def _publish(self) -> None:
        """Replace the snapshot that snapshot() returns (one reference: readers see the old or the new)."""
        self._snapshot = self._stats.snapshot(self._slots)
