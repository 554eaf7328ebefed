"""The engine's decisions, apart from carrying them out: which waiting jobs the free slots take, which slot each
job goes to, which slots decode their next token, which prompt pieces join them (a StepPlan), and what goes when
the KV cache is full (an Eviction). Pure: it reads the slots as plain data (SlotInfo) and the jobs, and calls
nothing of llama.cpp, so it is tested without a model.

A step is one llama_decode call holding the next token of every generating slot and pieces of the prompts of
prefilling slots: while any slot generates, at most prefill_chunk prompt tokens (a long prompt delays the running
generations by about one piece per token, not by its whole prefill), otherwise up to n_batch. A request goes to the
free slot holding the longest prefix of its prompt, if at least prefix_share of it (or to the one it names, id_slot,
once that is free); otherwise, and among equals, to one next to the busy slots, since llama.cpp cuts a step into a
ubatch per run of consecutive slot ids.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyllama_so.generation import sequence
from pyllama_so.server.engine.job import Job
from pyllama_so.server.engine.slot import SlotInfo, SlotState

# the share of a prompt a slot's cached prefix must hold to choose the slot over one next to the busy slots, by
# default (Engine's prefix_share; llama-server's --slot-prompt-similarity, 0.1 by default, plays that part against
# its least-recently-used choice)
PREFIX_SHARE = 0.1


def id_runs(ids: Iterable[int]) -> int:
    """How many runs of consecutive numbers the distinct ids make ({0, 1, 2, 5}: 2)."""
    v = sorted(set(ids))
    return sum(1 for i, b in enumerate(v) if i == 0 or b != v[i - 1] + 1)


@dataclass(frozen=True)
class Admission:
    """A job goes to a slot whose cache holds prefix tokens of its prompt; the slot keeps keep of them and
    evaluates the rest of the prompt."""

    job: Job
    slot: int
    prefix: int
    keep: int


@dataclass(frozen=True)
class PromptPiece:
    """Tokens start:start + n of a prefilling slot's pending prompt tokens; last: they end the prompt (the step
    samples the slot's first token from their last row)."""

    slot: int
    start: int
    n: int
    last: bool


@dataclass(frozen=True)
class StepPlan:
    """What the next step does, in order: release the slots of cancelled jobs (their caches stay), admit jobs to
    slots, then decode the sampled token of each slot in generate and the prompt pieces."""

    release: tuple[int, ...] = ()
    admit: tuple[Admission, ...] = ()
    generate: tuple[int, ...] = ()
    pieces: tuple[PromptPiece, ...] = ()


class Room(enum.Enum):
    """How a step that found the KV cache full (one cache for all slots: -kvu) makes room, in the order tried."""

    DROP_IDLE = "drop the idle slots' cached prompts"
    DEFER_PIECES = "prompt pieces wait"
    GIVE_BACK = "a prompt begun earlier that waits gives its cells back"
    END = "a generating slot ends"
    FAIL = "the step fails"


@dataclass(frozen=True)
class Eviction:
    """What a full KV cache costs: room's action on slots, and the step's slots that try again (none: the step
    is given up)."""

    room: Room
    slots: tuple[int, ...]
    retry: tuple[int, ...]


class Scheduler:
    """The engine's policy over a context of n_batch tokens a step (see the module docstring)."""

    def __init__(self, *, n_batch: int, prefill_chunk: int, prefix_share: float = PREFIX_SHARE) -> None:
        if not 1 <= prefill_chunk <= n_batch:
            raise ValueError(f"prefill_chunk must be in [1, n_batch={n_batch}], got {prefill_chunk}")
        if not 0.0 <= prefix_share <= 1.0:
            raise ValueError(f"prefix_share must be in [0, 1], got {prefix_share}")
        self.n_batch = n_batch
        self.prefill_chunk = prefill_chunk
        self.prefix_share = prefix_share  # 0: a cached prefix never decides the slot

    def take(self, waiting: Iterable[Job], slots: Sequence[SlotInfo]) -> list[Job]:
        """The waiting jobs (in order of arrival) that the idle slots take now. A job for one slot (id_slot) whose
        slot is busy waits without holding back the jobs behind it; the others take any idle slot."""
        free = {s.id for s in slots if not s.busy}
        taken: list[Job] = []
        n_any = 0  # jobs taken that go to any free slot
        for job in waiting:
            if len(free) <= n_any:
                break
            if job.id_slot is None:
                n_any += 1
            elif job.id_slot in free:  # len(free) > n_any: the others still find a slot
                free.discard(job.id_slot)
            else:
                continue
            taken.append(job)
        return taken

    def schedule(self, slots: Sequence[SlotInfo], jobs: Sequence[Job] = ()) -> StepPlan:
        """The next step: the cancelled jobs' slots released, the jobs (taken by take()) admitted, the jobs for one
        slot first, then the tokens of the slots that go on and the prompt pieces, the slots' as they will be."""
        release = tuple(s.id for s in slots if s.busy and s.cancelled)
        going = [s for s in slots if s.busy and not s.cancelled]
        busy = {s.id for s in going}
        admit: list[Admission] = []
        for job in sorted(jobs, key=lambda j: j.id_slot is None):
            a = self._place(job, [s for s in slots if s.id not in busy], busy)
            busy.add(a.slot)
            admit.append(a)
        generate = tuple(s.id for s in going if s.goes_on)
        prefilling = [(s.id, s.pending) for s in sorted(going, key=lambda s: s.t_admitted)
                      if s.state is SlotState.PREFILL]
        prefilling += [(a.slot, len(a.job.prompt) - a.keep) for a in admit]  # admitted after every other
        return StepPlan(release, tuple(admit), generate, self._pieces(prefilling, len(generate), {}))

    def follow(self, slots: Sequence[SlotInfo], generate: Sequence[int], in_step: Mapping[int, int]) -> StepPlan:
        """The step that follows the running one with nothing admitted or released between them: generate, the
        slots that go on (known before their tokens are: see Executor.chain), and the prompt pieces after those
        in the running step (in_step: slot id -> how many of its pending tokens it holds)."""
        prefilling = [(s.id, s.pending) for s in sorted(slots, key=lambda s: s.t_admitted)
                      if s.state is SlotState.PREFILL]
        return StepPlan(generate=tuple(generate), pieces=self._pieces(prefilling, len(generate), in_step))

    def _place(self, job: Job, free: Sequence[SlotInfo], busy: Collection[int]) -> Admission:
        """The free slot holding the longest prefix of the job's prompt, where that prefix is at least
        prefix_share of the prompt; among equals, one that leaves the busy slots' ids in the fewest runs of
        consecutive ids (a gap costs every step of the request a pass over the weights more), then the longest
        prefix, then the least recently used."""
        free = [s for s in free if job.id_slot is None or s.id == job.id_slot]
        if not free:
            raise RuntimeError(f"{job.id}: no free slot (take() chooses the jobs the free slots can run)")
        prefixes = {s.id: sequence.common_prefix(s.tokens, job.prompt) for s in free}

        def choice(s: SlotInfo) -> tuple[int, int, int, float]:
            # a prefix under prefix_share of the prompt saves less than a step of two ubatches costs
            prefix = prefixes[s.id]
            worth = prefix if self.prefix_share > 0 and prefix >= self.prefix_share * len(job.prompt) else 0
            return worth, -id_runs([*busy, s.id]), prefix, -s.last_used

        slot = max(free, key=choice)
        prefix = prefixes[slot.id]
        if job.prompt_logprobs is not None:  # the prompt is scored from its start, then cut back by its last token
            keep = len(job.prompt) - 1
        else:
            keep = sequence.reusable_prefix(slot.tokens, job.prompt, prefix) if job.cache_prompt else 0
        return Admission(job, slot.id, prefix, keep)

    def _pieces(self, prefilling: Sequence[tuple[int, int]], n_generating: int,
                in_step: Mapping[int, int]) -> tuple[PromptPiece, ...]:
        """The prompt pieces of a step, in order of admission (prefilling: (slot id, pending tokens)): while any slot
        generates (n_generating), at most prefill_chunk tokens, else up to n_batch. A slot whose pending tokens are
        all in the running step (in_step) has none."""
        budget = min(self.prefill_chunk, self.n_batch - n_generating) if n_generating else self.n_batch
        pieces = []
        for slot, pending in prefilling:
            start = in_step.get(slot, 0)
            rest = pending - start
            if rest <= 0:  # its last piece is in the running step
                continue
            if budget <= 0:
                break
            n = min(rest, budget)
            budget -= n
            pieces.append(PromptPiece(slot, start, n, n == rest))
        return tuple(pieces)

    def make_room(self, slots: Sequence[SlotInfo], stepping: Sequence[int]) -> Eviction:
        """A step of the slots stepping (in slot order) found no room in the KV cache. Frees or defers one thing
        so that nothing is lost while something else can go: first the idle slots' cached prompts; then prompt
        pieces wait while slots generate (or all but the oldest prompt's); then a waiting prompt begun earlier gives
        its cells back (it is evaluated again later); then a generating slot ends with "length" (its text is whole:
        one without max_tokens, else the newest) and its cache goes at the next try; a prompt piece alone that
        does not fit fails its request."""
        idle = tuple(s.id for s in slots if not s.busy and s.tokens)
        if idle:
            return Eviction(Room.DROP_IDLE, idle, tuple(stepping))
        by_id = {s.id: s for s in slots}
        pieces = [by_id[i] for i in stepping if by_id[i].state is SlotState.PREFILL]
        generating = [by_id[i] for i in stepping if by_id[i].state is SlotState.GENERATE]
        if pieces and generating:
            return Eviction(Room.DEFER_PIECES, tuple(s.id for s in pieces), tuple(s.id for s in generating))
        if len(pieces) > 1:
            newest = max(pieces, key=lambda s: s.t_admitted)
            return Eviction(Room.DEFER_PIECES, (newest.id,), tuple(i for i in stepping if i != newest.id))
        begun = [s for s in slots if s.state is SlotState.PREFILL and s.tokens and s.id not in stepping]
        if begun:
            s = max(begun, key=lambda s: s.t_admitted)
            return Eviction(Room.GIVE_BACK, (s.id,), tuple(stepping))
        if generating:
            s = max(generating, key=lambda s: (s.unbounded, s.t_admitted))
            return Eviction(Room.END, (s.id,), tuple(i for i in stepping if i != s.id))
        return Eviction(Room.FAIL, tuple(stepping), ())
