"""Shutting the server down: Engine.drain() (no HTTP), and python -m pyllama_so.server on SIGINT and
SIGTERM: it stops taking requests, lets those in progress finish for --shutdown-grace seconds, ends the
rest with a last chunk and [DONE], and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from pyllama_so import _llama
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.engine import SHUTTING_DOWN, Delta, Done, Engine, EngineStopped, Event, Failed, Job, Step
from server_process import ServerProcess  # scripts/server_process.py

GRACE = 3.0
GREEDY = SamplingParams(temperature=0.0)
# greedy after it, the tiny model falls into a loop of two tokens: no end-of-generation token ends it early
PROMPT = [1] + np.random.default_rng(1005).integers(3, 500, 19).tolist()


def test_drain_lets_jobs_finish_then_ends_the_rest(tiny_model: Path) -> None:
    """Two slots of 32k tokens: a and c would generate to the end of their slot, b 5 tokens, d waits. drain(60)
    (at step 1) refuses new jobs but lets the others run: b ends as it would have and c takes its slot.
    drain(0) (two steps after b ended) ends a and c with what they have ("length") and fails d, which
    never got a slot. Steps, not times, decide, so any machine speed gives the same events."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=65536, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    last: dict[str, Done | Failed] = {}
    refused: list[BaseException] = []
    b_done_at: list[int] = []
    ended = threading.Semaphore(0)

    def sink(name: str) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            if not isinstance(event, Delta):
                last[name] = event
                ended.release()
        return emit

    def on_step(step: Step) -> None:
        if step.index == 1:
            engine.drain(60)
            try:
                engine.submit(Job(PROMPT, sink("late")))
            except EngineStopped as e:
                refused.append(e)
        if "b" in last and not b_done_at:
            b_done_at.append(step.index)
        if b_done_at and step.index == b_done_at[0] + 2:
            engine.drain(0)

    engine = Engine(ctx, queue_size=4, on_step=on_step)
    engine.start()
    try:
        for name, max_tokens in (("a", None), ("b", 5), ("c", None), ("d", None)):
            engine.submit(Job(PROMPT, sink(name), max_tokens=max_tokens, sampling=GREEDY))
        for _ in range(4):
            assert ended.acquire(timeout=120)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert [str(e) for e in refused] == [SHUTTING_DOWN] and "late" not in last
    b = last["b"]
    assert isinstance(b, Done) and (b.finish_reason, b.usage.completion_tokens) == ("length", 5)
    for name in "ac":
        done = last[name]
        assert isinstance(done, Done) and done.finish_reason == "length", (name, done)
        assert 0 < done.usage.completion_tokens < 32768 - len(PROMPT)
    d = last["d"]
    assert isinstance(d, Failed) and d.stopped and d.message == SHUTTING_DOWN


class Stream:
    """A streamed completion read on its own thread: each data line with the time it came."""

    def __init__(self, url: str, body: dict[str, object]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, object]) -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append((time.monotonic(), line[len("data: "):]))
        except httpx.HTTPError as e:  # a stream cut short
            self.error = e

    def wait_started(self) -> None:
        deadline = time.monotonic() + 60
        while len(self.lines) < 2:  # the first text, not only the first chunk
            assert time.monotonic() < deadline and self._thread.is_alive(), (self.lines, self.error)
            time.sleep(0.01)

    def join(self) -> None:
        self._thread.join(60)  # a hang guard
        assert not self._thread.is_alive()

    def chunks(self) -> list[dict[str, object]]:
        assert self.lines and self.lines[-1][1] == "[DONE]", (self.lines[-3:], self.error)
        return [json.loads(text) for _, text in self.lines[:-1]]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_a_stream_go_on_then_ends_it(tiny_model: Path, sig: signal.Signals) -> None:
    """A stream to the end of a 32k-token slot (which the tiny model's greedy text never ends early) when
    the signal comes: it goes on for the grace period, then gets a last chunk with finish_reason
    "length", its usage and [DONE]. The server exits 0. (A busy machine only delays the end: no upper
    bound on the time but the hang guard.)"""
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-np", "2", "-c", "65536",
                        "--shutdown-grace", str(GRACE)]) as server:
        endless = Stream(server.url, {"prompt": PROMPT, "max_tokens": None, "temperature": 0,
                                      "stream_options": {"include_usage": True}})
        endless.wait_started()
        signalled = time.monotonic()
        server.proc.send_signal(sig)
        endless.join()
        assert server.proc.wait(30) == 0, server.log
    chunks = endless.chunks()
    last, usage = chunks[-2], chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert 0 < usage["usage"]["completion_tokens"] < 32768 - len(PROMPT)  # type: ignore[index]
    ended = endless.lines[-1][0] - signalled
    assert ended > GRACE - 0.3, ended  # not before the grace period is over
    assert any(t > signalled + GRACE / 2 for t, _ in endless.lines[:-3])  # it generated on
    assert "the grace period is over: ending 1 requests, failing 0 waiting" in server.log, server.log


def test_a_second_signal_ends_requests_at_once(tiny_model: Path) -> None:
    """One slot, an endless stream in it and a request waiting: a first SIGINT (grace 30 s) lets both go
    on; a second one ends the stream at once, with its last chunk and [DONE], and fails the waiting
    request with 503."""
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-np", "1", "-c", "65536", "--queue-size", "1",
                        "--shutdown-grace", "30"]) as server:
        endless = Stream(server.url, {"prompt": PROMPT, "max_tokens": None, "temperature": 0})
        endless.wait_started()
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, f"{server.url}/v1/completions", json={"prompt": "Hi"}, timeout=60)
            deadline = time.monotonic() + 30
            while httpx.get(f"{server.url}/engine").json()["queue"]["waiting"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            server.proc.send_signal(signal.SIGINT)
            server.wait_for_log(r"shutting down: 2 requests in progress or waiting get up to 30 s")
            n_lines = len(endless.lines)
            deadline = time.monotonic() + 60
            while len(endless.lines) < n_lines + 3:  # the stream goes on after the first signal
                assert time.monotonic() < deadline and endless.lines[-1][1] != "[DONE]", endless.lines[-3:]
                time.sleep(0.01)
            assert server.proc.poll() is None and endless.lines[-1][1] != "[DONE]" and not waiting.done()
            second = time.monotonic()
            server.proc.send_signal(signal.SIGINT)
            refused = waiting.result(timeout=30)
            endless.join()
        assert server.proc.wait(30) == 0, server.log
    assert endless.lines[-1][0] - second < 15  # well within the 30 s grace: the second signal ended it
    assert endless.chunks()[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable", refused.text
    assert "the grace period is over: ending 1 requests, failing 1 waiting" in server.log
