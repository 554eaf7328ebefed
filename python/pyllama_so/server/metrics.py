"""GET /metrics (with --metrics): the engine's counters in Prometheus' text format, through prometheus-client,
with llama-server's metric names (server_task_result_metrics::to_metrics in the pinned tree's
tools/server/server-task.cpp).

Counters are totals since the engine started; the two throughput gauges are averaged over the window since
the previous scrape, as llama-server resets its buckets at each scrape. llama-server declares
n_tokens_max, a high watermark, as a counter without the _total suffix that prometheus-client gives every
counter: it is a gauge here, under the same sample name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from pyllama_so.server.engine import EngineSnapshot

PREFIX = "llamacpp:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    """Reads a fresh snapshot at each scrape."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._last = (0, 0.0, 0, 0.0)  # the ended jobs' prompt and predicted tokens and seconds at the last scrape

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        c = snap.counters
        with self._lock:  # two scrapes at once must not share a window
            prompt_n, prompt_s, predicted_n, predicted_s = self._last
            self._last = (c.timed_prompt_tokens, c.prompt_seconds, c.predicted_tokens, c.predicted_seconds)
        # a job's times are counted when it ends: the rates use the tokens of the jobs that ended
        window_prompt_s, window_predicted_s = c.prompt_seconds - prompt_s, c.predicted_seconds - predicted_s
        counters = [
            ("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", c.prompt_tokens),
            ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", c.prompt_cached),
            ("prompt_seconds", "Total time spent processing prompts", c.prompt_seconds),
            ("tokens_predicted", "Number of generation tokens processed", c.predicted_tokens),
            ("tokens_predicted_seconds", "Total time spent generating tokens", c.predicted_seconds),
            ("n_decode", "Total number of llama_decode() calls", c.decodes),
        ]
        for name, doc, value in counters:
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        busy = sum(s.job is not None for s in snap.slots)
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             (c.timed_prompt_tokens - prompt_n) / window_prompt_s if window_prompt_s > 0 else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             (c.predicted_tokens - predicted_n) / window_predicted_s if window_predicted_s > 0 else 0.0),
            ("requests_processing", "Number of requests processing", busy),
            ("requests_deferred", "Number of requests deferred", snap.waiting),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             c.busy_slot_steps / max(c.decodes, 1)),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", c.n_tokens_max),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)


class Metrics:
    """The registry of one server's collector."""

    content_type = CONTENT_TYPE

    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)
