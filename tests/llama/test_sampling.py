"""llama.cpp's sampler chain from Python: greedy equals argmax, seeds reproduce, every parameter has an
effect a test can see, logprobs equal a log-softmax of eval()'s logits, and bad values are ValueErrors."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from helpers.cuda_devices import cuda_device_count
from helpers.logits_reference import generation_rows, log_softmax
from pyllama_so import Llama, LlamaGrammar, _llama
from pyllama_so.sampling import SamplingParams

# a logprob against eval()'s logits: on CUDA the reference batch runs other kernels than generation's
# one-token decodes (logits differ by ~1e-3), on the CPU they agree to float rounding
TOL = 2e-3 if cuda_device_count() else 1e-4

PROMPT = "The quick brown fox jumps over the lazy dog. 0123456789"
REPEATING = "one two three one two three one two three one two three one two three"


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Llama]:
    with Llama(tiny_model, n_ctx=512, n_threads=2, seed=7) as llm:
        yield llm


def greedy_by_eval(llm: Llama, prompt: list[int], n: int) -> list[int]:
    """The greedy continuation computed from eval()'s logits with numpy: what the sampler must equal."""
    llm.reset()
    logits = llm.eval(prompt)[-1]
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = llm.eval([tok])[-1]
    llm.reset()
    return out


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_greedy_equals_argmax_of_eval(request: pytest.FixtureRequest, model: str) -> None:
    path = request.getfixturevalue("tiny_model") if model == "tiny" else request.getfixturevalue("small_model")
    with Llama(path, n_ctx=512, n_threads=2) as llm:
        prompt = llm.tokenize(PROMPT)
        expected = greedy_by_eval(llm, prompt, 24)
        got = list(llm.generate(prompt, max_tokens=24, temperature=0, stop_on_eog=False))
        assert got == expected
        text = llm.create_completion(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
        assert llm.detokenize(expected).decode("utf-8", "replace").startswith(text)


def test_top_k_1_equals_greedy(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT)
    greedy = list(llm.generate(prompt, max_tokens=16, temperature=0, stop_on_eog=False))
    top1 = list(llm.generate(prompt, max_tokens=16, temperature=1.5, top_k=1, seed=3, stop_on_eog=False))
    assert top1 == greedy


def test_seed_reproduces_and_differs(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT)
    runs = [list(llm.generate(prompt, max_tokens=24, temperature=1.0, seed=s, stop_on_eog=False)) for s in (11, 11, 12)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    a = llm.create_completion(PROMPT, max_tokens=24, temperature=1.0, seed=5)["choices"][0]["text"]
    b = llm.create_completion(PROMPT, max_tokens=24, temperature=1.0, seed=5)["choices"][0]["text"]
    assert a == b


def test_llama_seed_makes_unseeded_calls_reproducible(tiny_model: Path) -> None:
    def run() -> list[list[int]]:
        with Llama(tiny_model, n_ctx=256, n_threads=2, seed=42) as llm:
            prompt = llm.tokenize(PROMPT)
            return [list(llm.generate(prompt, max_tokens=12, temperature=1.0, stop_on_eog=False)) for _ in range(2)]
    first, second = run(), run()
    assert first == second
    assert first[0] != first[1]  # each call draws its own seed from the Llama's generator


def test_logit_bias_forces_and_bans(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT)
    forced = list(llm.generate(prompt, max_tokens=8, temperature=0.8, seed=1, logit_bias={77: 100.0},
                               stop_on_eog=False))
    assert forced == [77] * 8
    greedy = list(llm.generate(prompt, max_tokens=8, temperature=0, stop_on_eog=False))
    banned = list(llm.generate(prompt, max_tokens=8, temperature=0, logit_bias={str(greedy[0]): float("-inf")},
                               stop_on_eog=False))
    assert greedy[0] not in banned
    assert banned[0] != greedy[0]


def test_repeat_penalty_lowers_repetition(llm: Llama) -> None:
    prompt = llm.tokenize(REPEATING)
    seen = set(prompt)

    def repeats(tokens: list[int]) -> int:
        count, history = 0, set(seen)
        for t in tokens:
            count += t in history
            history.add(t)
        return count

    plain = list(llm.generate(prompt, max_tokens=32, temperature=0, stop_on_eog=False))
    penalized = list(llm.generate(prompt, max_tokens=32, temperature=0, repeat_penalty=3.0, penalty_last_n=-1,
                                  stop_on_eog=False))
    assert repeats(penalized) < repeats(plain)


def test_min_p_removes_tokens_below_its_cut(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT)
    llm.reset()
    llm.context.prefill(prompt)  # the row generate() samples from, by the same decode
    probs = np.exp(log_softmax(np.array(llm.context.logits_view(-1))))
    llm.context.clear()
    min_p = 0.5
    allowed = set(np.flatnonzero(probs >= min_p * probs.max()).tolist())
    assert 1 <= len(allowed) < len(probs)
    drawn = set()
    for seed in range(40):
        drawn.add(next(iter(llm.generate(prompt, max_tokens=1, temperature=1.0, top_k=0, top_p=1.0, min_p=min_p,
                                         seed=seed, stop_on_eog=False))))
    assert drawn <= allowed
    without = set()
    for seed in range(40):
        without.add(next(iter(llm.generate(prompt, max_tokens=1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                           seed=seed, stop_on_eog=False))))
    assert without - allowed  # without the cut, tokens below it are drawn too


@pytest.mark.parametrize("extra", [dict(mirostat_mode=1), dict(mirostat_mode=2, mirostat_tau=1.0),
                                   dict(dry_multiplier=2.0, dry_allowed_length=1),
                                   dict(xtc_probability=1.0, xtc_threshold=0.001),
                                   dict(typical_p=0.2), dict(top_n_sigma=0.5),
                                   dict(frequency_penalty=1.5), dict(presence_penalty=1.5)])
def test_each_sampler_changes_the_output(llm: Llama, extra: dict) -> None:
    prompt = llm.tokenize(REPEATING)
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=9, stop_on_eog=False, max_tokens=48)
    plain = list(llm.generate(prompt, **base))
    changed = list(llm.generate(prompt, **base, **extra))
    again = list(llm.generate(prompt, **base, **extra))
    assert changed == again  # seeded: reproducible
    assert changed != plain


def test_sampler_chain_order_is_llama_cpps(llm: Llama) -> None:
    s = llm.sampler(temperature=0.7, top_k=30, top_p=0.9, min_p=0.1, typical_p=0.9, repeat_penalty=1.1,
                    dry_multiplier=0.5, xtc_probability=0.2, top_n_sigma=1.0, logit_bias={1: 1.0}, seed=1)
    assert s.members == ["logit-bias", "penalties", "dry", "top-n-sigma", "top-k", "typical", "top-p", "min-p",
                         "xtc", "temp-ext", "dist"]
    assert llm.sampler(temperature=0).members == ["greedy"]
    assert llm.sampler(temperature=0.5, mirostat_mode=2).members == ["temp", "mirostat-v2"]


def test_logprobs_equal_log_softmax_of_eval(llm: Llama) -> None:
    out = llm.create_completion(PROMPT, max_tokens=6, temperature=0, logprobs=5)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    # token texts are decoded one by one with invalid bytes dropped, as llama-cpp-python does
    assert "".join(lp["tokens"]) == choice["text"].replace("\ufffd", "")
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == len(PROMPT)
    prompt = llm.tokenize(PROMPT)
    tokens = list(llm.generate(prompt, max_tokens=6, temperature=0, stop_on_eog=False))
    rows = generation_rows(llm, prompt, tokens)
    ctx = llm.context
    for i, (tok, row) in enumerate(zip(tokens, rows, strict=True)):
        ref = log_softmax(row)
        assert lp["token_logprobs"][i] == pytest.approx(ref[tok], abs=TOL)
        top = np.argsort(-ref, kind="stable")[:5]
        # {text: logprob}: tokens of the same text share a key, so compare values, not a count
        expected = ref[np.concatenate([top, [tok]])]
        for value in lp["top_logprobs"][i].values():
            assert np.abs(expected - value).min() < TOL
        assert max(lp["top_logprobs"][i].values()) == pytest.approx(ref[top[0]], abs=TOL)
    # the Context call itself: the ids of the top N and their values
    llm.reset()
    row = llm.eval(prompt)[-1]
    ref = log_softmax(row)
    chosen, top = ctx.logprobs(int(np.argmax(row)), 5)
    assert chosen == pytest.approx(ref.max(), abs=TOL)
    assert [t for t, _ in top] == np.argsort(-ref, kind="stable")[:5].tolist()
    assert [v for _, v in top] == pytest.approx(np.sort(ref)[::-1][:5].tolist(), abs=TOL)
    llm.reset()


@pytest.mark.parametrize("n_words", [8, 300])  # 300 words: more than one llama_decode call of 256 tokens
def test_echo_logprobs_score_the_prompt(llm: Llama, tiny_model: Path, n_words: int) -> None:
    """echo=True with logprobs (llama-cpp-python's, e.g. for a prompt's log-likelihood): each prompt token
    scored given the ones before it, a leading BOS left out, the first listed token None, then the
    completion's rows as without echo."""
    prompt = " ".join(f"w{i % 37}" for i in range(n_words))
    tokens = llm.tokenize(prompt)
    assert n_words < 256 or len(tokens) > 256
    out = llm.create_completion(prompt, max_tokens=4, temperature=0, echo=True, logprobs=3)["choices"][0]
    plain = llm.create_completion(prompt, max_tokens=4, temperature=0, logprobs=3)["choices"][0]
    lp = out["logprobs"]
    first = 1 if tokens[0] == llm.token_bos() else 0
    n_listed = len(tokens) - first
    assert out["text"] == llm.detokenize(tokens).decode() + plain["text"]
    # the completion's rows as without echo, to rounding: that prompt came from the cache, its last token
    # decoded alone, where here its row is the whole prompt's batch's
    assert len(lp["tokens"]) == n_listed + 4
    assert lp["token_logprobs"][n_listed:] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=max(1e-3, 2 * TOL))
    assert lp["tokens"][n_listed:] == plain["logprobs"]["tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:n_listed] == sorted(lp["text_offset"][:n_listed]) and lp["text_offset"][0] == 0
    llm.reset()
    rows = llm.eval(tokens)
    llm.reset()
    for i in range(first + 1, len(tokens)):
        ref = log_softmax(rows[i - 1])
        assert lp["token_logprobs"][i - first] == pytest.approx(ref[tokens[i]], abs=TOL)
        # {text: logprob} of the top 3 and the token itself (tokens of one text share a key: values, not a count)
        expected = ref[np.concatenate([np.argsort(-ref, kind="stable")[:3], [tokens[i]]])]
        assert all(np.abs(expected - v).min() < TOL for v in lp["top_logprobs"][i - first].values())
    # with logits_all the prompt's rows are kept in scores as eval() gives them
    with Llama(tiny_model, n_ctx=512, n_threads=2, logits_all=True) as keep:
        again = keep.create_completion(prompt, max_tokens=4, temperature=0, echo=True, logprobs=3)["choices"][0]
        assert again["logprobs"]["token_logprobs"] == lp["token_logprobs"]
        np.testing.assert_allclose(keep.scores[:len(tokens)], rows, atol=TOL)


def test_streamed_echo_logprobs_come_with_the_prompt(llm: Llama) -> None:
    whole = llm.create_completion(PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1)["choices"][0]
    chunks = list(llm.create_completion(PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=1, stream=True))
    head = chunks[0]["choices"][0]
    assert head["text"] == llm.detokenize(llm.tokenize(PROMPT)).decode()
    assert head["logprobs"]["token_logprobs"][0] is None
    streamed = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == whole["logprobs"]["token_logprobs"]


def test_decode_logprobs_checks_its_rows_buffer(llm: Llama) -> None:
    llm.reset()
    with pytest.raises(ValueError, match="rows must have shape"):
        llm.context.decode_logprobs([1, 2, 3], 2, rows=np.zeros((2, llm.n_vocab()), dtype=np.float32))
    with pytest.raises(ValueError, match="n_top"):
        llm.context.decode_logprobs([1, 2], 99)
    llm.reset()


def test_streamed_logprobs_match_the_whole(llm: Llama) -> None:
    whole = llm.create_completion(PROMPT, max_tokens=10, temperature=0, logprobs=2)["choices"][0]
    tokens: list[str] = []
    for chunk in llm.create_completion(PROMPT, max_tokens=10, temperature=0, logprobs=2, stream=True):
        if chunk["choices"][0]["logprobs"]:
            tokens += chunk["choices"][0]["logprobs"]["tokens"]
    assert tokens == whole["logprobs"]["tokens"]


def test_grammar_constrains_the_output(llm: Llama) -> None:
    grammar = 'root ::= "yes" | "no"'
    for seed in range(5):
        out = llm.create_completion(PROMPT, max_tokens=8, temperature=1.0, seed=seed, grammar=grammar)
        assert out["choices"][0]["text"] in ("yes", "no")
    out = llm.create_completion(PROMPT, max_tokens=8, temperature=0,
                                grammar=LlamaGrammar.from_string('root ::= [0-9]+ "."'))
    text = out["choices"][0]["text"]
    assert text and text.rstrip(".").isdigit()


def test_invalid_grammar_is_a_value_error_with_the_parsers_message(llm: Llama) -> None:
    with pytest.raises(ValueError, match="grammar"):
        llm.create_completion(PROMPT, max_tokens=4, grammar="root ::= (")
    assert llm.create_completion(PROMPT, max_tokens=2, temperature=0)["choices"][0]["text"] is not None


def test_logits_processor_and_stopping_criteria(llm: Llama) -> None:
    def only_42(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        assert input_ids.ndim == 1 and scores.shape == (llm.n_vocab(),)
        out = np.full_like(scores, -np.inf)
        out[42] = 0.0
        return out

    prompt = llm.tokenize(PROMPT)
    assert list(llm.generate(prompt, max_tokens=5, logits_processor=only_42, stop_on_eog=False)) == [42] * 5
    calls = []

    def stop_after_3(input_ids: np.ndarray, logits: np.ndarray) -> bool:
        calls.append(len(input_ids))
        return len(calls) > 3

    assert len(list(llm.generate(prompt, max_tokens=10, temperature=0, stopping_criteria=stop_after_3,
                                 stop_on_eog=False))) == 3


@pytest.mark.parametrize("bad", [
    dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1), dict(typical_p=0.0),
    dict(penalty_last_n=-2), dict(repeat_penalty=0.0), dict(mirostat_mode=3), dict(mirostat_eta=0.0),
    dict(top_k=-1), dict(xtc_probability=2.0), dict(dry_multiplier=-1.0), dict(temperature="hot"),
    dict(frequency_penalty=float("nan")), dict(seed=2**32), dict(dry_sequence_breakers="ab"),
])
def test_bad_sampling_values_are_value_errors_naming_the_parameter(llm: Llama, bad: dict) -> None:
    (name,) = bad
    with pytest.raises(ValueError, match=name):
        llm.create_completion(PROMPT, max_tokens=2, **bad)
    with pytest.raises(ValueError, match=name):
        SamplingParams(**bad)


@pytest.mark.parametrize("bias", [{"x": 1.0}, {-1: 1.0}, {10**6: 1.0}, {5: "a"}, {5: float("nan")}, [1, 2]])
def test_bad_logit_bias_is_a_value_error(llm: Llama, bias: object) -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        llm.create_completion(PROMPT, max_tokens=2, logit_bias=bias)  # type: ignore[arg-type]
    assert llm.create_completion(PROMPT, max_tokens=2, temperature=0)["choices"][0]["finish_reason"]


@pytest.mark.parametrize("n", [-1, _llama.MAX_LOGPROBS + 1, "3", True])
def test_bad_logprobs_is_a_value_error(llm: Llama, n: object) -> None:
    with pytest.raises(ValueError, match="logprobs"):
        llm.create_completion(PROMPT, max_tokens=2, logprobs=n)  # type: ignore[arg-type]


def test_a_freed_sampler_is_an_error_not_a_crash(llm: Llama) -> None:
    s = llm.sampler(temperature=0)
    llm.reset()
    llm.eval(llm.tokenize(PROMPT))
    assert isinstance(s.sample(llm.context), int)
    s.free()
    s.free()  # idempotent
    assert s.closed
    with pytest.raises(ValueError, match="freed"):
        s.sample(llm.context)
    with pytest.raises(ValueError, match="freed"):
        _ = s.members
    llm.reset()


def test_temp_is_an_alias_of_temperature(llm: Llama) -> None:
    prompt = llm.tokenize(PROMPT)
    assert list(llm.generate(prompt, max_tokens=6, temp=0, stop_on_eog=False)) == \
        list(llm.generate(prompt, max_tokens=6, temperature=0, stop_on_eog=False))


def test_backend_sampling_gives_the_same_greedy_tokens(tiny_model: Path) -> None:
    with Llama(tiny_model, n_ctx=256, n_threads=2) as cpu, \
            Llama(tiny_model, n_ctx=256, n_threads=2, backend_sampling=True) as backend:
        prompt = cpu.tokenize(PROMPT)
        want = list(cpu.generate(prompt, max_tokens=16, temperature=0, stop_on_eog=False))
        assert list(backend.generate(prompt, max_tokens=16, temperature=0, stop_on_eog=False)) == want
        sampler = backend.sampler(temperature=0)
        assert backend.context.set_backend_sampler(0, sampler)  # the CPU backend runs it in the graph
        assert sampler.on_backend
        backend.reset()
        backend.context.prefill(prompt)
        assert sampler.sample(backend.context) == want[0]
        sampler.free()  # takes it out of the graph first
        assert not sampler.on_backend
        backend.reset()
        # seeded draws are reproducible with the chain in the graph
        runs = [list(backend.generate(prompt, max_tokens=12, temperature=1.0, seed=4, stop_on_eog=False))
                for _ in range(2)]
        assert runs[0] == runs[1]
        # logprobs need the logits: the chain stays on the CPU for them, and the values are the CPU's
        a = backend.create_completion(PROMPT, max_tokens=4, temperature=0, logprobs=2)["choices"][0]
        b = cpu.create_completion(PROMPT, max_tokens=4, temperature=0, logprobs=2)["choices"][0]
        assert a["text"] == b["text"]
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=TOL)


def test_a_step_begun_and_ended_equals_decode_batch_sample(tiny_model: Path) -> None:
    """decode_batch_sample_begin + _end (the server's step left running while it streams text) give what
    decode_batch_sample gives, over several steps with a prompt piece, a batch larger than n_batch and
    logprobs; in between, any other call on the context is a RuntimeError and leaves the step intact."""
    from pyllama_so import _llama
    model = _llama.Model.load(tiny_model)
    try:
        runs = []
        for split in (False, True):
            ctx = _llama.Context(model, n_ctx=1024, n_batch=16, n_ubatch=16, n_seq_max=3, n_threads=2)
            samplers = [_llama.Sampler(model, SamplingParams(seed=s, temperature=1.0), n_ctx=256) for s in range(3)]
            items = [(0, list(range(5, 30)), samplers[0], 2), (1, [8, 9], samplers[1], None), (2, [10, 11], None, None)]
            out = []
            for _ in range(6):
                if split:
                    ctx.decode_batch_sample_begin(items)
                    with pytest.raises(RuntimeError, match="decode_batch_sample_end"):
                        ctx.decode_batch([(2, [3], False)])
                    with pytest.raises(RuntimeError, match="decode_batch_sample_end"):
                        ctx.truncate(0, 1)
                    got = ctx.decode_batch_sample_end()
                else:
                    got = ctx.decode_batch_sample(items)
                assert got[2] is None
                out.append([(g[0], None if g[1] is None else round(g[1], 5)) for g in got[:2]])
                items = [(0, [got[0][0]], samplers[0], 2), (1, [got[1][0]], samplers[1], None),
                         (2, [12], None, None)]
            with pytest.raises(RuntimeError, match="no step"):
                ctx.decode_batch_sample_end()
            runs.append(out)
            for smp in samplers:
                smp.free()
            ctx.free()
        assert runs[0] == runs[1]
    finally:
        model.free()


def test_a_steps_rows_sampled_on_several_threads_equal_one_thread(tiny_model: Path) -> None:
    """decode_batch_sample samples the output rows of a step on sampling_threads threads, each sequence with
    its own chain: the tokens are those of one thread, seeded draws and grammars included."""
    model = _llama.Model.load(tiny_model)
    try:
        def samplers() -> list[_llama.Sampler]:
            params = [SamplingParams(seed=s, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) for s in range(3)]
            return [_llama.Sampler(model, p, n_ctx=256) for p in params] + [
                _llama.Sampler(model, SamplingParams(seed=9), n_ctx=256, grammar='root ::= [a-z ]+')]
        assert _sampled_steps(model, samplers(), 1, 12, 2) == _sampled_steps(model, samplers(), 4, 12, 2)
    finally:
        model.free()


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled_threads(quiet_s: float = 0.2, limit_s: float = 10.0) -> int:
    """The thread count once it has not changed for quiet_s: the workers of contexts freed by earlier tests
    exit after free() returns."""
    deadline = time.monotonic() + limit_s
    n, since = _native_threads(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.01)
        if (m := _native_threads()) != n:
            n, since = m, time.monotonic()
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_sampling_threads_are_kept_between_steps_and_end_with_the_context(tiny_model: Path) -> None:
    """A step's rows are sampled on worker threads the context keeps: a thread count changed between steps
    (the pool grows, or leaves workers idle) gives one thread's tokens, the workers outlive a step, and they
    exit when the context is freed."""
    model = _llama.Model.load(tiny_model)
    try:
        def samplers() -> list[_llama.Sampler]:
            return [_llama.Sampler(model, SamplingParams(seed=s, temperature=1.0), n_ctx=256) for s in range(4)]
        before = _settled_threads()
        ctx = _llama.Context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, n_threads=1)
        runs = []
        for counts in ([1] * 8, [2, 4, 1, 3, 4, 2, 1, 4]):
            smps, toks, out = samplers(), [[5, 6, 7], [8, 9], [10], [11, 12]], []
            ctx.clear()
            for n in counts:
                ctx.sampling_threads = n
                got = ctx.decode_batch_sample([(s, t, smp, None)
                                               for s, (t, smp) in enumerate(zip(toks, smps, strict=True))])
                toks = [[g[0]] for g in got]
                out.append([g[0] for g in got])
            for smp in smps:
                smp.free()
            runs.append(out)
        assert runs[0] == runs[1]
        assert _native_threads() >= before + 3  # the three workers of the four-thread steps, waiting
        ctx.free()
        deadline = time.monotonic() + 10
        while _native_threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _native_threads() <= before
    finally:
        model.free()


def _sampled_steps(model: _llama.Model, samplers: list[_llama.Sampler], threads: int, n_steps: int,
                   n_logprobs: int) -> list[list[tuple[int, float]]]:
    """(token, its logprob) of each sequence at each of n_steps decode_batch_sample steps of four sequences,
    one sampler each, the rows sampled on `threads` threads; frees the samplers."""
    ctx = _llama.Context(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, n_threads=2)
    try:
        ctx.sampling_threads = threads
        toks = [[5, 6, 7], [8, 9], [10], [11, 12]]
        out = []
        for _ in range(n_steps):
            got = ctx.decode_batch_sample([(s, t, smp, n_logprobs)
                                           for s, (t, smp) in enumerate(zip(toks, samplers, strict=True))])
            toks = [[g[0]] for g in got]
            out.append([(g[0], round(g[1], 5)) for g in got])
        return out
    finally:
        for smp in samplers:
            smp.free()
        ctx.free()


@pytest.mark.parametrize(("params", "grammar", "k"), [
    (SamplingParams(), None, 40),
    (SamplingParams(temperature=0.0), None, 1),
    (SamplingParams(top_k=128, top_p=0.5, typical_p=0.9, xtc_probability=0.5), None, 128),
    (SamplingParams(top_k=129), None, 0),  # llama.cpp sorts by buckets above 128
    (SamplingParams(top_k=0), None, 0),
    (SamplingParams(repeat_penalty=1.1), None, 0),  # penalties come before top-k
    (SamplingParams(temperature=0.0, presence_penalty=0.5), None, 0),
    (SamplingParams(logit_bias={5: 1.0}), None, 40),  # a logit bias ahead of top-k: the biased row's top k
    (SamplingParams(temperature=0.0, logit_bias={5: float("-inf")}), None, 1),  # ignore_eos's ban, greedy
    (SamplingParams(logit_bias={5: 1.0}, repeat_penalty=1.1), None, 0),
    (SamplingParams(logit_bias={5: 1.0, "5": 2.0}), None, 0),  # one token named twice: llama.cpp adds both
    (SamplingParams(dry_multiplier=0.8), None, 0),
    (SamplingParams(top_n_sigma=1.0), None, 0),
    (SamplingParams(mirostat_mode=2), None, 0),
    (SamplingParams(), 'root ::= [a-z ]+', 0),
])
def test_prefilter_applies_where_the_chain_starts_with_top_k(llm: Llama, params: SamplingParams,
                                                             grammar: str | None, k: int) -> None:
    """The candidates are picked out of the row only for chains whose first member is top-k (or greedy alone)
    and that have no grammar; prefilter=False turns it off."""
    smp = _llama.Sampler(llm._model, params, n_ctx=256, grammar=grammar)
    off = _llama.Sampler(llm._model, params, n_ctx=256, grammar=grammar, prefilter=False)
    try:
        assert smp.prefilter_k == k and off.prefilter_k == 0
    finally:
        smp.free()
        off.free()


def _rows(n_vocab: int) -> list[np.ndarray]:
    """Logits rows for the prefilter: plain ones, and ones with ties at and within the top 40, -inf, NaN,
    a constant row and rising ones (every entry enters the heap)."""
    rng = np.random.default_rng(3)
    rows = [(rng.standard_normal(n_vocab) * sd).astype(np.float32) for sd in (0.3, 1.0, 4.0) for _ in range(6)]
    tie_at_k = rows[0].copy()
    order = np.argsort(-tie_at_k)
    tie_at_k[order[40]] = tie_at_k[order[39]]  # the 40th and 41st largest are equal
    tie_within = rows[1].copy()
    tie_within[order[3]] = tie_within[order[2]]
    tie_top = rows[2].copy()
    tie_top[7] = tie_top[11] = tie_top.max() + 1.0  # two largest
    banned = rows[3].copy()
    banned[20:] = -np.inf  # fewer finite entries than top_k
    nan = rows[4].copy()
    nan[17] = np.nan
    rising = np.linspace(-3.0, 3.0, n_vocab, dtype=np.float32)
    return rows + [tie_at_k, tie_within, tie_top, banned, nan, np.zeros(n_vocab, np.float32), rising,
                   rising[::-1].copy(), np.round(rows[5] * 4) / 4]  # the last: many ties everywhere


@pytest.mark.parametrize("params", [
    SamplingParams(seed=1),
    SamplingParams(seed=2, temperature=1.5, top_k=5, top_p=0.9, min_p=0.0),
    SamplingParams(seed=3, top_k=128, typical_p=0.8, xtc_probability=0.5, xtc_threshold=0.05),
    SamplingParams(seed=4, top_k=1),
    SamplingParams(temperature=0.0),
])
def test_prefiltered_rows_sample_what_whole_rows_do(llm: Llama, params: SamplingParams) -> None:
    """The same tokens with and without the prefilter, draw after draw of one seeded chain, on rows built to
    hit every case of the candidate pick (and its fallbacks to the whole row)."""
    rows = _rows(llm.n_vocab()) * 3
    got = []
    for prefilter in (True, False):
        smp = _llama.Sampler(llm._model, params, n_ctx=256, prefilter=prefilter)
        try:
            got.append([smp.sample_logits(r) for r in rows])
        finally:
            smp.free()
    assert got[0] == got[1]


def _biased_rows(n_vocab: int) -> tuple[list[np.ndarray], dict[int, float]]:
    """_rows, and rows where a logit bias decides: its ban removes the largest logit, its boost lifts a token
    from the bottom into the top k or to the top, and it ties a biased token with the largest one (exactly:
    8.0 - 2.0 + 2.0); the bias itself, ahead of the chain."""
    rows = _rows(n_vocab)
    base = rows[0]
    top = int(np.argmax(base))
    low = int(np.argmin(base))
    bias = {top: float("-inf"), low: 2.5, 7: 100.0, 11: 2.0, 13: -1.5}
    tie = base.copy()
    unbiased = next(t for t in range(n_vocab) if t not in bias)
    tie[unbiased] = 8.0  # the largest unbiased logit (base's are below 2)
    tie[11] = 6.0  # 6.0 + 2.0 == 8.0: the biased token 11 ties it at the top
    tie[7] = -1000.0  # so that 7's boost does not decide the row
    boosted_into_k = base.copy()
    ranked = np.sort(base)[::-1]
    boosted_into_k[7] = (ranked[20] + ranked[21]) / 2 - 100.0  # 7 + 100 lands between the 21st and 22nd largest
    return rows + [tie, boosted_into_k], bias


@pytest.mark.parametrize("params", [
    SamplingParams(seed=5),
    SamplingParams(seed=6, top_k=5, top_p=0.9, min_p=0.0, temperature=1.2),
    SamplingParams(temperature=0.0),
])
def test_prefiltered_rows_with_a_logit_bias_sample_what_whole_rows_do(llm: Llama, params: SamplingParams) -> None:
    """A logit bias ahead of top-k (bans, boosts into and past the top k, a bias that makes a tie): the same
    tokens with and without the prefilter."""
    rows, bias = _biased_rows(llm.n_vocab())
    params = dataclasses.replace(params, logit_bias=bias)
    got, picked_whole = [], (0, 0)
    for prefilter in (True, False):
        smp = _llama.Sampler(llm._model, params, n_ctx=256, prefilter=prefilter)
        try:
            assert (smp.prefilter_k > 0) == prefilter
            got.append([smp.sample_logits(r) for r in rows * 3])
            if prefilter:
                picked_whole = smp.prefilter_rows
            else:
                assert smp.prefilter_rows == (0, 0)
        finally:
            smp.free()
    assert got[0] == got[1]
    assert not set(got[0]) & {t for t, b in bias.items() if b == float("-inf")}
    assert picked_whole[0] > len(rows) and picked_whole[1] >= 3  # most rows picked; the tie row (and others) whole
    # rows the bias decides: the first (its largest logit banned) and the boosted one are picked, the tie goes whole
    smp = _llama.Sampler(llm._model, params, n_ctx=256)
    try:
        for row, picked in ((rows[0], True), (rows[-1], True), (rows[-2], False)):
            before = smp.prefilter_rows
            smp.sample_logits(row)
            after = smp.prefilter_rows
            assert (after[0] - before[0], after[1] - before[1]) == ((1, 0) if picked else (0, 1))
    finally:
        smp.free()


@pytest.mark.parametrize("banned", [False, True])
def test_prefiltered_step_rows_equal_whole_rows(tiny_model: Path, banned: bool) -> None:
    """decode_batch_sample on several threads: default chains with the prefilter give the tokens and logprobs
    of the same chains given whole rows; also with a ban as ignore_eos makes it (and a boost) ahead of them."""
    model = _llama.Model.load(tiny_model)
    try:
        runs = []
        for prefilter in (True, False):
            samplers = [_llama.Sampler(model, SamplingParams(
                seed=s, temperature=0.0 if s == 3 else 0.8,
                logit_bias={2: float("-inf"), 40 + s: 3.0} if banned else None), n_ctx=256, prefilter=prefilter)
                for s in range(4)]
            assert all((smp.prefilter_k > 0) == prefilter for smp in samplers)
            runs.append(_sampled_steps(model, samplers, 2, 16, 3))
        assert runs[0] == runs[1]
        if banned:
            assert all(tok != 2 for step in runs[0] for tok, _ in step)
    finally:
        model.free()


@pytest.mark.parametrize("k", [3, 9, 17])
def test_prefilter_leaves_ties_to_llama_cpp(llm: Llama, k: int) -> None:
    """Rows of a few tied levels above a floor: which of the tied tokens top-k keeps, and in which order, is
    its partial sort's to decide, so such rows go to the chain whole (a pick of its own gives other draws)."""
    n = llm.n_vocab()
    rng = np.random.default_rng(k)
    for trial in range(20):
        row = np.full(n, -10.0, np.float32)
        idx = rng.choice(n, int(rng.integers(2, 3 * k)), replace=False)
        row[idx] = rng.integers(0, 3, len(idx)).astype(np.float32)
        params = SamplingParams(seed=trial, top_k=k, top_p=1.0, min_p=0.0)
        got = []
        for prefilter in (True, False):
            smp = _llama.Sampler(llm._model, params, n_ctx=256, prefilter=prefilter)
            try:
                got.append([smp.sample_logits(row) for _ in range(30)])
            finally:
                smp.free()
        assert got[0] == got[1], trial
