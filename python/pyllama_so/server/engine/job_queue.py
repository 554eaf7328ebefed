"""The jobs between the HTTP side and the engine thread: those waiting for a slot, how many are in (waiting or in a
slot), and the flags of a shutdown, all under one lock that guards nothing else and under which no C call runs."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from pyllama_so.server.engine.job import Done, Failed, Job, emit


class JobQueue:
    """Its fields only under lock (a Condition: the engine thread waits on it for work)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.waiting: deque[Job] = deque()
        self.n_jobs = 0  # accepted and not ended: waiting, or in a slot
        self.accepting = True
        self.deadline: float | None = None  # set by drain(): jobs still running then are ended
        self.stopping = False

    def put(self, job: Job) -> None:
        """Under the lock: the job waits for a slot, and the engine thread wakes."""
        self.waiting.append(job)
        self.n_jobs += 1
        self.lock.notify()

    def remove(self, jobs: Iterable[Job]) -> None:
        """Under the lock: the jobs no longer wait (a slot took them)."""
        for job in jobs:
            self.waiting.remove(job)

    def withdraw(self, job: Job) -> None:
        """The job leaves if it still waits (it was cancelled: nobody listens)."""
        with self.lock:
            if job in self.waiting:
                self.waiting.remove(job)
                self.n_jobs -= 1

    def clear(self) -> list[Job]:
        """Under the lock: take every waiting job out."""
        waiting = list(self.waiting)
        self.waiting.clear()
        return waiting

    def retire(self, job: Job, event: Done | Failed | None) -> None:
        """The job leaves the engine, with its last event (None: cancelled, nobody listens)."""
        if event is not None:
            emit(job, event)
        with self.lock:
            self.n_jobs -= 1
