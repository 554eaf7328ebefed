"""The generation layer (pyllama_so.generation) under both fronts: its rules on their own (no model where none is
needed), one sampler chain per request, and Llama and the server engine following the same rule."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_so import Llama, _llama
from pyllama_so.generation import limits, sequence
from pyllama_so.generation.stream import CompletionStream
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.engine import Delta, Done, Engine, Event, Job
from pyllama_so.server.errors import ApiError
from pyllama_so.server.jobs import make_job
from pyllama_so.server.schemas import CompletionRequest

PROMPT = "The quick brown fox"
SLOT_CTX = 256


# -- the rules, without a model --

def test_the_context_end_rule() -> None:
    """A sampled token is decoded (and another sampled) while below max_tokens and short of the context's end:
    prompt and completion fill the context at most, the last token sent and never decoded."""
    assert limits.goes_on(1, 10, None, 256)
    assert not limits.goes_on(4, 10, 4, 256) and limits.goes_on(3, 10, 4, 256)
    assert limits.goes_on(1, 254, None, 256) and not limits.goes_on(1, 255, None, 256)
    assert limits.at_context_end(255, 256) and not limits.at_context_end(254, 256)
    assert limits.prompt_fits(255, 256) and not limits.prompt_fits(256, 256)
    assert limits.prompt_fits(256, 256, generates=False) and not limits.prompt_fits(257, 256, generates=False)
    assert [limits.max_tokens_limit(n) for n in (None, 0, -1, 5)] == [None, None, None, 5]


class FakeContext:
    """truncate() of a memory that can drop a suffix, or (recurrent) only a whole sequence."""

    def __init__(self, drops_suffix: bool) -> None:
        self.drops_suffix = drops_suffix
        self.calls: list[tuple[int, int]] = []

    def truncate(self, keep: int, seq_id: int = 0) -> None:
        self.calls.append((keep, seq_id))
        if keep and not self.drops_suffix:
            raise _llama.LlamaError("this model's memory cannot drop part of a sequence")


@pytest.mark.parametrize("drops_suffix", [True, False])
def test_prefix_reuse_keeps_the_common_prefix_short_of_the_last_token(drops_suffix: bool) -> None:
    ctx = FakeContext(drops_suffix)
    held = [1, 2, 3, 4, 5]
    keep = sequence.reuse_prefix(ctx, 3, held, [1, 2, 3, 9])  # type: ignore[arg-type]
    want = 3 if drops_suffix else 0  # a recurrent memory starts over
    assert keep == want and held == [1, 2, 3][:want]
    assert ctx.calls == ([(3, 3)] if drops_suffix else [(3, 3), (0, 3)])
    held = [1, 2, 3]
    assert sequence.reuse_prefix(ctx, 0, held, [1, 2, 3]) == (2 if drops_suffix else 0)  # type: ignore[arg-type]
    held, ctx.calls = [1, 2], []
    assert sequence.reuse_prefix(ctx, 0, held, [1, 2, 3, 4]) == 2 and ctx.calls == []  # type: ignore[arg-type]
    assert sequence.reuse_prefix(ctx, 0, held, [1, 2, 3, 4], reuse=False) == 0 and held == []  # type: ignore[arg-type]


def test_checked_sampling_params_name_logit_bias() -> None:
    params = SamplingParams(logit_bias={"5": 1.0, 7: float("-inf")})
    assert params.vocabulary is None and params.checked(8).vocabulary == 8 and params.checked(8) == params
    for bias in ({8: 1.0}, {-1: 1.0}, {"x": 1.0}, {5: "a"}, {5: float("nan")}):
        with pytest.raises(ValueError, match="^logit_bias"):
            SamplingParams(logit_bias=bias).checked(8)


# -- one sampler chain per request --

@pytest.fixture
def chains(monkeypatch: pytest.MonkeyPatch) -> list[_llama.Sampler]:
    """Every llama.cpp sampler chain built from now on, wherever it is built."""
    built: list[_llama.Sampler] = []

    class Counted(_llama.Sampler):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(_llama, "Sampler", Counted)
    return built


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Llama]:
    with Llama(tiny_model, n_ctx=512, n_threads=2, seed=7) as llm:
        yield llm


CALLS = {
    "completion": lambda llm: llm.create_completion(PROMPT, max_tokens=4, logit_bias={5: 1.0}),
    "stream": lambda llm: list(llm.create_completion(PROMPT, max_tokens=4, logit_bias={5: 1.0}, stream=True)),
    "echo with logprobs": lambda llm: llm.create_completion(PROMPT, max_tokens=4, echo=True, logprobs=2),
    "chat": lambda llm: llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4),
    "generate": lambda llm: list(llm.generate(llm.tokenize(PROMPT), max_tokens=4, temperature=0, logit_bias={5: 1.0})),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_llama_call_builds_one_chain(llm: Llama, chains: list[_llama.Sampler], call: str) -> None:
    CALLS[call](llm)
    assert len(chains) == 1


def test_a_bad_logit_bias_fails_at_the_call_with_no_chain_built(llm: Llama, chains: list[_llama.Sampler]) -> None:
    with pytest.raises(ValueError, match="^logit_bias"):
        llm.create_completion(PROMPT, max_tokens=4, logit_bias={llm.n_vocab(): 1.0}, stream=True)  # not iterated
    assert chains == []


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[Engine]:
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=2 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    engine = Engine(ctx)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()
        ctx.free()
        model.free()


def run(engine: Engine, job: Job, done: threading.Event) -> None:
    engine.submit(job)
    assert done.wait(120)


def sink(events: list[Event], done: threading.Event) -> Any:
    def emit(event: Event) -> None:
        events.append(event)
        if not isinstance(event, Delta):
            done.set()
    return emit


def test_a_server_request_builds_one_chain(engine: Engine, chains: list[_llama.Sampler]) -> None:
    """The HTTP side checks the request's parameters (make_job) without a chain; the engine builds the one."""
    body = CompletionRequest(prompt=PROMPT, max_tokens=4, logit_bias={"5": 1.0}, seed=3)
    prompt = engine.model.tokenize(PROMPT, add_special=True, parse_special=True).tolist()
    events: list[Event] = []
    done = threading.Event()
    job = make_job(engine, body, prompt, sink(events, done), body.token_limit, "cmpl-1", None)
    assert job.sampling.vocabulary == engine.model.n_vocab and chains == []
    run(engine, job, done)
    assert isinstance(events[-1], Done) and len(chains) == 1
    bad = CompletionRequest(prompt=PROMPT, max_tokens=4, logit_bias={str(engine.model.n_vocab): 1.0})
    with pytest.raises(ApiError) as err:
        make_job(engine, bad, prompt, sink([], threading.Event()), 4, "cmpl-2", None)
    assert err.value.status == 400 and err.value.param == "logit_bias" and len(chains) == 1


# -- Llama and the server through the same rule --

def test_llama_and_the_engine_stop_by_the_same_context_end_rule(llm: Llama, engine: Engine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A context-end rule that ends every sequence after 3 tokens ends Llama's generation and a server slot's at
    the same token, with finish reason "length"."""
    rule = limits.goes_on
    monkeypatch.setattr(limits, "goes_on",
                        lambda n, cached, max_tokens, n_ctx: n < 3 and rule(n, cached, max_tokens, n_ctx))
    prompt = llm.tokenize(PROMPT)
    assert len(list(llm.generate(prompt, max_tokens=20, temperature=0, stop_on_eog=False))) == 3
    llm.reset()
    out = llm.create_completion(prompt, max_tokens=20, temperature=0, logit_bias={llm.token_eos(): float("-inf")})
    assert out["usage"]["completion_tokens"] == 3 and out["choices"][0]["finish_reason"] == "length"
    events: list[Event] = []
    done = threading.Event()
    run(engine, Job(prompt, sink(events, done), max_tokens=20, sampling=SamplingParams(temperature=0), ignore_eos=True),
        done)
    end = events[-1]
    assert isinstance(end, Done) and end.usage.completion_tokens == 3 and end.finish_reason == "length"
    assert "".join(e.text for e in events if isinstance(e, (Delta, Done))) == out["choices"][0]["text"]


def test_llama_and_the_engine_reuse_a_prefix_through_the_same_function(llm: Llama, engine: Engine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Both fronts bring a sequence to a prompt with sequence.reuse_prefix: patched, it sees Llama's sequence 0
    and the server's slot, and what it keeps is what they reuse (none here: the whole prompt is evaluated)."""
    calls: list[tuple[int, int]] = []

    def reuse_nothing(ctx: Any, seq_id: int, held: list[int], prompt: list[int], **kw: Any) -> int:
        calls.append((seq_id, len(prompt)))
        return sequence.cut(ctx, seq_id, held, 0)

    prompt = llm.tokenize(PROMPT)
    llm.create_completion(prompt, max_tokens=2, temperature=0)
    monkeypatch.setattr(sequence, "reuse_prefix", reuse_nothing)
    evaluated: list[int] = []
    real = llm._seq().prefill

    def counting(tokens: list[int]) -> int:
        evaluated.append(real(tokens))
        return evaluated[-1]

    monkeypatch.setattr(llm._seq(), "prefill", counting)
    llm.create_completion(prompt, max_tokens=2, temperature=0)
    assert calls == [(0, len(prompt))] and evaluated == [len(prompt)]
    for _ in range(2):  # the second time, the slot holds the prompt: the patched rule still evaluates it whole
        events: list[Event] = []
        done = threading.Event()
        run(engine, Job(prompt, sink(events, done), max_tokens=2, sampling=SamplingParams(temperature=0), id_slot=1),
            done)
        assert isinstance(events[-1], Done) and events[-1].usage.cached_tokens == 0
    assert calls[1:] == [(1, len(prompt))] * 2


def test_llama_and_the_engine_stream_text_and_rows_through_one_class(llm: Llama) -> None:
    """CompletionStream: the text of a completion with the logprobs rows of the tokens it starts."""
    model = llm.model
    toks = llm.tokenize(" hello world", add_bos=False)
    out = CompletionStream(model, ["world"], logprobs=True, prompt_len=3)
    texts, rows = [], []
    for t in toks:
        text, r = out.push(t, (-0.5, [(t, -0.5)]))
        texts.append(text)
        rows += r
        if out.stopped:
            break
    tail, last = out.finish()
    assert "".join(texts) + tail == " hello " and out.stopped
    assert last is not None and [r.offset for r in rows + last][0] == 3
