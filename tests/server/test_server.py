"""python -m pyllama_so.server: the OpenAI endpoints against Llama, slots and batching, errors, load.

Servers run as subprocesses on 127.0.0.1 with the tiny synthetic model, on a port the server picks
(--port 0, read from its log); each is stopped when its tests end. The clients are the official openai
package and, for the error cases, raw HTTP (httpx).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from helpers.cuda_devices import cuda_device_count
from helpers.server import HANG_GUARD_S, PROMPT, SLOT_CTX, Server, clear_slot_caches, reference, unique_tokens
from pyllama_so import Llama, _llama, args as A, synth
from pyllama_so.bench.__main__ import parser as bench_parser
from pyllama_so.bench.runner import DEFAULTS
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.__main__ import main as server_main, parser as server_parser
from pyllama_so.server.engine import Delta, Done, Engine, Event, Job, Step, id_runs

CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
GREEDY = SamplingParams(temperature=0.0)


def wait_until(condition: Any, what: Any, timeout: float = HANG_GUARD_S) -> None:
    """Poll condition() until it is true; the deadline only guards against a hang (a busy machine is slow)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what() if callable(what) else what}"
        time.sleep(0.02)


# -- the shared flags --

def test_model_flags_come_from_one_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag of args.MODEL_FLAGS is in both tools, with the same variable: one value in the server,
    a list in the bench; the bench's parsed defaults are BenchParams' own."""
    for f in A.MODEL_FLAGS:
        monkeypatch.delenv(f"LLAMA_ARG_{f.env}", raising=False)
    server_ns, bench_ns = server_parser().parse_args([]), bench_parser().parse_args([])
    assert bench_ns.ubatch_size is DEFAULTS.n_ubatch is server_ns.ubatch_size is None  # 512, or -b / 2 with -so 1
    for attr, dest in [("n_batch", "batch_size"), ("n_gpu_layers", "n_gpu_layers"),
                       ("split_mode", "split_mode"), ("main_gpu", "main_gpu"), ("flash_attn", "flash_attn"),
                       ("type_k", "cache_type_k"), ("type_v", "cache_type_v"), ("split_overlap", "split_overlap")]:
        assert bench_ns.__dict__[dest] == getattr(DEFAULTS, attr) == [server_ns.__dict__[dest]], dest
    for text, one, listed in [("UBATCH=8", 8, [8]), ("SPLIT_MODE=tensor", "tensor", ["tensor"]),
                              ("SPLIT_OVERLAP=1", True, [True]), ("TENSOR_SPLIT=1", (1.0,), [(1.0,)]),
                              ("MODEL=x.gguf", "x.gguf", ["x.gguf"]), ("THREADS=3", 3, [3])]:
        name, value = text.split("=")
        monkeypatch.setenv(f"LLAMA_ARG_{name}", value)
        dest = next(f.dest for f in A.MODEL_FLAGS if f.env == name)
        assert server_parser().parse_args([]).__dict__[dest] == one, text
        assert bench_parser().parse_args([]).__dict__[dest] == listed, text
    assert server_parser().parse_args(["-ub", "16"]).ubatch_size == 16  # the flag wins over the variable
    assert bench_parser().parse_args(["-m", "a.gguf", "-m", "b.gguf,c.gguf"]).model == ["a.gguf", "b.gguf", "c.gguf"]


def test_tensor_split_takes_llama_servers_commas_and_slashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A llama-server command line runs unchanged: -ts 3,1 and 3/1 (and LLAMA_ARG_TENSOR_SPLIT=1,1) in the
    server and the perplexity tool; the bench keeps llama-bench's commas, a list of alternatives."""
    from pyllama_so.perplexity.__main__ import parser as perplexity_parser

    monkeypatch.delenv("LLAMA_ARG_TENSOR_SPLIT", raising=False)
    for tool in (server_parser, perplexity_parser):
        for text in ("3,1", "3/1"):
            assert tool().parse_args(["-ts", text]).tensor_split == (3.0, 1.0), (tool, text)
    assert bench_parser().parse_args(["-ts", "3/1,1/1"]).tensor_split == [(3.0, 1.0), (1.0, 1.0)]
    monkeypatch.setenv("LLAMA_ARG_TENSOR_SPLIT", "1,1")
    assert server_parser().parse_args([]).tensor_split == (1.0, 1.0)
    assert bench_parser().parse_args([]).tensor_split == [(1.0,), (1.0,)]


@pytest.mark.parametrize("bad", [["-ub", "0"], ["-sm", "diagonal"], ["-so", "maybe"], ["--port", "70000"],
                                 ["-np", "0"], ["--shutdown-grace", "-1"], ["--shutdown-grace", "nan"]])
def test_bad_server_flags_exit_2(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        server_parser().parse_args(bad)
    assert e.value.code == 2


def test_attn_split_without_tensor_split_says_it_needs_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    """-as with -sm layer is wrong whatever its length: the error is the split mode, not the device count
    (the split here is longer than this machine's devices)."""
    split = "/".join(["1"] * (max(1, _llama.gpu_device_count()) + 1))
    assert server_main(["-m", "unused.gguf", "-as", split]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "server: error: attn_split needs split_mode=\"tensor\" (got split_mode='layer'): it splits the attention "
        "heads of tensor split"]


def test_port_in_use_is_found_before_the_model(tmp_path: Path) -> None:
    """A port another program listens on: one line naming the address, status 1, and the synthetic model
    was not even written (the port is checked first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "pyllama_so.server", "--synthetic", "tiny", "--port", str(port)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYLLAMA_SO_CACHE": str(tmp_path)})
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [f"server: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert list(tmp_path.iterdir()) == []


def test_without_the_server_extra_names_it(tmp_path: Path) -> None:
    """A fastapi that cannot be imported: one line naming the extra, status 1, before any model loads."""
    (tmp_path / "fastapi").mkdir()
    (tmp_path / "fastapi" / "__init__.py").write_text("raise ImportError('no fastapi here')\n")
    # first on the path, ahead of any PYTHONPATH the package itself comes from (as on the GPU machines)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    res = subprocess.run([sys.executable, "-m", "pyllama_so.server", "-m", "missing.gguf"], capture_output=True,
                         text=True, timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": path})
    assert res.returncode == 1
    assert res.stderr.splitlines() == ['server: fastapi is not installed; the server needs the server extra: '
                                       'pip install "pyllama_so[server]"']


# -- the endpoints against Llama --

@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_llama(server: Server, llm: Llama, stream: bool) -> None:
    want = reference(llm, PROMPT, 24)
    client = server.client()
    if not stream:
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
        got = (out.choices[0].text, out.choices[0].finish_reason, out.usage.prompt_tokens, out.usage.completion_tokens)
    else:
        texts, finish, usage = [], None, None
        for chunk in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                               stream_options={"include_usage": True}):
            if chunk.choices:
                texts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        assert len(texts) > 2  # pieces as they came
        assert usage is not None
        got = ("".join(texts), finish, usage.prompt_tokens, usage.completion_tokens)
    assert got == want


def test_completion_parses_special_tokens_in_the_prompt(server: Server, llm: Llama) -> None:
    """Special-token text in a prompt is that token, as llama-server and llama-cpp-python's create_completion
    tokenize it: "</s>" is the EOS id here, not four characters."""
    prompt = "x</s>y"
    special = llm.tokenize(prompt.encode(), special=True)
    assert llm.token_eos() in special and len(special) < len(llm.tokenize(prompt.encode()))
    out = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    assert out.usage.prompt_tokens == len(special)
    assert llm.create_completion(prompt, max_tokens=2, temperature=0)["usage"]["prompt_tokens"] == len(special)


@pytest.mark.parametrize("max_tokens", [None, 0, -1])
def test_completion_to_the_end_of_the_slot_equals_llama(server: Server, llm: Llama, max_tokens: int | None) -> None:
    """max_tokens null, 0 or negative: until the slot's context is full, as Llama (and llama-cpp-python's
    Llama, llama_cpp/llama.py of 0.3.36: `if max_tokens is None or max_tokens <= 0`) stops at the end of
    its context."""
    prompt = unique_tokens(1, 200)
    r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    got = (body["choices"][0]["text"], body["choices"][0]["finish_reason"], body["usage"]["prompt_tokens"],
           body["usage"]["completion_tokens"])
    assert got == reference(llm, prompt, max_tokens) == reference(llm, prompt, None)
    assert got[1] == "length" and got[2] + got[3] == SLOT_CTX  # prompt and completion fill the slot


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_llama_on_the_chatml_prompt(server: Server, llm: Llama, stream: bool) -> None:
    """The synthetic model has no template: chatml formats the messages (llama.cpp's own code)."""
    assert _llama.chat_apply_template("chatml", MESSAGES) == CHATML
    want = reference(llm, llm.tokenize(CHATML, special=True), 20)
    client = server.client()
    if not stream:
        out = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                             max_tokens=20, temperature=0)
        assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
        got = (out.choices[0].message.content, out.choices[0].finish_reason, out.usage.prompt_tokens,
               out.usage.completion_tokens)
    else:
        texts, finish, usage, roles = [], None, None, []
        for chunk in client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                                    max_tokens=20, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices:
                delta = chunk.choices[0].delta
                roles += [delta.role] if delta.role else []
                texts.append(delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        assert roles == ["assistant"] and usage is not None
        got = ("".join(texts), finish, usage.prompt_tokens, usage.completion_tokens)
    assert got == want


def test_echo(server: Server, llm: Llama) -> None:
    want = llm.create_completion(PROMPT, max_tokens=6, temperature=0.0, echo=True)["choices"][0]["text"]
    out = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    assert out.choices[0].text == want and want.startswith(PROMPT)



@pytest.mark.parametrize("stream", [False, True])
def test_echo_logprobs_score_the_prompt_as_llama_does(server: Server, llm: Llama, stream: bool) -> None:
    """echo with logprobs (e.g. a prompt's log-likelihood, max_tokens 1): every prompt token's logprob
    (a leading BOS left out, the first null), then the generated tokens', as Llama's."""
    want = llm.create_completion(PROMPT, max_tokens=3, temperature=0.0, echo=True, logprobs=2)["choices"][0]
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2, "stream": stream}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=HANG_GUARD_S) as r:
        assert r.status_code == 200
        if stream:
            events = [json.loads(line[5:]) for line in r.iter_lines()
                      if line.startswith("data:") and "[DONE]" not in line]
            choices = [e["choices"][0] for e in events if e["choices"]]
            text = "".join(c["text"] for c in choices)
            lps = {k: [v for c in choices if c["logprobs"] for v in c["logprobs"][k]]
                   for k in ("tokens", "text_offset", "token_logprobs", "top_logprobs")}
        else:
            r.read()
            got = r.json()["choices"][0]
            text, lps = got["text"], got["logprobs"]
    assert text == want["text"]
    assert lps["tokens"] == want["logprobs"]["tokens"] and lps["text_offset"] == want["logprobs"]["text_offset"]
    assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    assert lps["token_logprobs"][1:] == pytest.approx(want["logprobs"]["token_logprobs"][1:], abs=1e-3)
    n_prompt = len(want["logprobs"]["tokens"]) - 3
    assert n_prompt > 3 and all(lp <= 0 for lp in lps["token_logprobs"][1:])
    # several prompts, n choices each: every choice starts with its own prompt's rows
    r = httpx.post(f"{server.url}/v1/completions",
                   json={**body, "prompt": [PROMPT, "abc abc"], "n": 2, "stream": False}, timeout=HANG_GUARD_S)
    assert r.status_code == 200, r.text
    rows = [c["logprobs"]["token_logprobs"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    n_abc = len(llm.tokenize("abc abc")) - (llm.tokenize("abc abc")[0] == llm.token_bos())
    # the prompt's rows alike bit for bit (each scored alone); the generated ones to rounding (two rows in a step)
    assert rows[0][:n_prompt] == rows[1][:n_prompt] and rows[2][:n_abc] == rows[3][:n_abc]
    assert rows[0][n_prompt:] == pytest.approx(rows[1][n_prompt:], abs=1e-3)
    assert rows[0][1:] == pytest.approx(lps["token_logprobs"][1:], abs=1e-3) and len(rows[2]) == n_abc + 3
    # a log-likelihood request as evaluation harnesses send it: one token after the prompt's rows
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 1, "stream": False},
                   timeout=HANG_GUARD_S)
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["logprobs"]
    assert len(got["tokens"]) == n_prompt + 1
    assert got["token_logprobs"][1:n_prompt] == pytest.approx(want["logprobs"]["token_logprobs"][1:n_prompt], abs=1e-3)


def test_stop_string_equals_llama(server: Server, llm: Llama) -> None:
    """A stop string met in the middle of the output: the text ends before it, finish_reason "stop",
    streamed or not, as Llama's."""
    full = reference(llm, PROMPT, 32)[0]
    stop = next(full[i:i + 2] for i in range(4, len(full) - 1)
                if full[i:i + 2].isascii() and full[i:i + 2].isprintable())
    want = llm.create_completion(PROMPT, max_tokens=32, temperature=0.0, stop=[stop, "never"])["choices"][0]
    assert want["finish_reason"] == "stop" and len(want["text"]) < len(full)
    client = server.client()
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop, "never"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (want["text"], "stop")
    streamed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want["text"]


def test_seeded_sampling_equals_llama(server: Server, llm: Llama) -> None:
    """temperature, top_k, top_p, min_p and seed reach the sampler: the same seed gives Llama's tokens,
    another seed other tokens."""
    want = llm.create_completion(PROMPT, max_tokens=24, temperature=1.5, top_k=0, top_p=0.98, min_p=0.01,
                                 seed=7)["choices"][0]["text"]
    client = server.client()
    got = [client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=1.5, top_p=0.98, seed=seed,
                                     extra_body={"top_k": 0, "min_p": 0.01}).choices[0].text  # not in OpenAI's API
           for seed in (7, 7, 8)]
    assert got[0] == got[1] == want and got[2] != want


def test_ignore_eos_generates_max_tokens(server: Server) -> None:
    """ignore_eos (llama-server's extension): a request that ends at an end-of-generation token without it
    (finish "stop" with no stop strings, before max_tokens) generates all max_tokens with it."""
    body = {"prompt": unique_tokens(50, 4), "max_tokens": 64, "temperature": 50.0, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0}  # about uniform over the 512 tokens: an end-of-generation token in ~1 of 8 requests
    seed = next((seed for seed in range(60) if server.post("/v1/completions", {**body, "seed": seed}).json()
                 ["choices"][0]["finish_reason"] == "stop"), None)
    assert seed is not None, "no request ended at an end-of-generation token"
    plain = server.post("/v1/completions", {**body, "seed": seed}).json()
    assert plain["usage"]["completion_tokens"] < 64
    forced = server.post("/v1/completions", {**body, "seed": seed, "ignore_eos": True}).json()
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == 64
    assert server.post("/v1/completions", {**body, "ignore_eos": "yes"}).status_code == 400


def test_models_and_health(server: Server, tiny_model: Path) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [tiny_model.name]
    meta = httpx.get(f"{server.url}/v1/models").json()["data"][0]["meta"]
    assert meta["n_ctx_slot"] == SLOT_CTX and meta["n_slots"] == 4
    assert (meta["chat_template"], meta["chat_template_source"]) == (
        "chatml", "the built-in chat template 'chatml' (the model has no tokenizer.chat_template)")
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


# -- slots and batching --

@pytest.mark.skipif(cuda_device_count() > 0, reason="CUDA kernels are not batch-invariant: a sequence decoded "
                    "beside another rounds differently, and the random model's greedy text then diverges (seen on "
                    "one H200 after about 60 characters); the CPU's are")
def test_concurrent_requests_equal_sequential(server: Server) -> None:
    """Two greedy requests decoded in the same steps give what each gives alone. The server's step counter
    by slot count shows that they shared steps (retried, at most 5 times, until they overlapped)."""
    client = server.client()
    prompts = ["Once upon a time", "In a galaxy far, far away, " * 3]

    def ask(prompt: str) -> str:
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=160, temperature=0).choices[0].text

    def together(prompt: str, barrier: threading.Barrier) -> str:
        barrier.wait()
        return ask(prompt)

    alone = [ask(p) for p in prompts]
    for _ in range(5):
        before = server.slots()["steps_by_slots"].get("2", 0)
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(together, prompts, [threading.Barrier(2)] * 2))
        assert both == alone
        if server.slots()["steps_by_slots"].get("2", 0) > before:
            return
    pytest.fail("the two requests never shared a step")


def test_continuation_evaluates_only_the_new_tokens(server: Server, llm: Llama) -> None:
    """A prompt that extends what a slot holds: only the new tokens are evaluated, and the answer is
    the one from scratch."""
    first = unique_tokens(2, 60)
    r1 = server.post("/v1/completions", {"prompt": first, "max_tokens": 1, "temperature": 0}).json()
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] <= 1  # at most BOS
    evaluated_before = sum(s["totals"]["prompt_evaluated"] for s in server.slots()["slots"])
    more = unique_tokens(3, 25)[1:]
    r2 = server.post("/v1/completions", {"prompt": first + more, "max_tokens": 8, "temperature": 0}).json()
    assert r2["usage"]["prompt_tokens"] == 84
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == 60  # the slot held the first prompt
    assert r2["timings"]["cache_n"] == 60 and r2["timings"]["prompt_n"] == 24
    assert sum(s["totals"]["prompt_evaluated"] for s in server.slots()["slots"]) - evaluated_before == 24
    assert r2["choices"][0]["text"] == reference(llm, first + more, 8)[0]


def test_chat_continuation_reuses_the_conversation(server: Server) -> None:
    client = server.client()
    turn1 = [{"role": "user", "content": "Tell me about continuation number 4711."}]
    a = client.chat.completions.create(model="tiny", messages=turn1,  # type: ignore[arg-type]
                                       max_tokens=12, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": a.choices[0].message.content or ""},
                     {"role": "user", "content": "And then?"}]
    b = client.chat.completions.create(model="tiny", messages=turn2,  # type: ignore[arg-type]
                                       max_tokens=4, temperature=0)
    assert b.usage is not None and a.usage is not None
    cached = b.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached >= a.usage.prompt_tokens  # the first turn's prompt (and what was generated after it)
    assert b.model_extra and b.model_extra["timings"]["prompt_n"] == b.usage.prompt_tokens - cached


def test_a_long_prompt_does_not_stall_a_generation(tiny_model: Path) -> None:
    """In the engine (no HTTP): a 200-token prompt arriving while another slot generates is prefilled
    n_ubatch tokens per step, each step also decoding the generating slot's next token; alone, a prompt
    goes n_batch tokens per step. Both answers equal Llama's with the same batch sizes."""
    a_prompt, b_prompt = unique_tokens(5, 20), unique_tokens(4, 200)
    with Llama(tiny_model, n_ctx=SLOT_CTX, n_batch=64, n_ubatch=16, n_threads=2) as ref:
        want_a, want_b = reference(ref, a_prompt, 40), reference(ref, b_prompt, 4)
    assert want_a[3] == 40  # no end-of-generation token cuts a short
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=2 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    steps: list[Step] = []
    texts: dict[str, list[str]] = {"a": [], "b": []}
    ended = {"a": threading.Event(), "b": threading.Event()}

    def sink(name: str) -> Any:
        def emit(ev: Event) -> None:
            if isinstance(ev, (Delta, Done)):
                texts[name].append(ev.text)
            if not isinstance(ev, Delta):
                ended[name].set()
        return emit

    def on_step(step: Step) -> None:  # on the engine thread, once the next step runs
        steps.append(step)
        if len(steps) == 2:  # a is generating (the third step runs): b arrives
            engine.submit(Job(b_prompt, sink("b"), max_tokens=4, sampling=GREEDY))

    engine = Engine(ctx, on_step=on_step)
    engine.start()
    try:
        engine.submit(Job(a_prompt, sink("a"), max_tokens=40, sampling=GREEDY))
        assert ended["a"].wait(60) and ended["b"].wait(60)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert steps[0].items == ((0, 20, "prefill"),)  # alone: the whole prompt in one step
    assert steps[1].items == steps[2].items == ((0, 1, "generate"),)
    prefill = [dict((slot, (n, kind)) for slot, n, kind in s.items) for s in steps[3:3 + 13]]
    assert prefill == [{0: (1, "generate"), 1: (16, "prefill")}] * 12 + [{0: (1, "generate"), 1: (8, "prefill")}]
    assert "".join(texts["a"]) == want_a[0] and "".join(texts["b"]) == want_b[0]


@pytest.mark.parametrize("chunk", [8, 40])
def test_prefill_chunk_sets_the_prompt_tokens_of_a_step_while_slots_generate(tiny_model: Path, chunk: int) -> None:
    """prefill_chunk (--prefill-chunk) replaces n_ubatch as the prompt budget of a step with generating slots,
    below or above it; the answers stay Llama's."""
    a_prompt, b_prompt = unique_tokens(5, 20), unique_tokens(4, 200)
    with Llama(tiny_model, n_ctx=SLOT_CTX, n_batch=64, n_ubatch=16, n_threads=2) as ref:
        want_b = reference(ref, b_prompt, 4)
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=2 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    steps: list[Step] = []
    texts: list[str] = []
    ended = threading.Semaphore(0)

    def on_step(step: Step) -> None:
        steps.append(step)
        if len(steps) == 2:
            engine.submit(Job(b_prompt, lambda ev: (texts.append(ev.text) if isinstance(ev, (Delta, Done)) else None,
                                                    None if isinstance(ev, Delta) else ended.release()),
                              max_tokens=4, sampling=GREEDY))

    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(ctx, prefill_chunk=0)
    engine = Engine(ctx, on_step=on_step, prefill_chunk=chunk)
    engine.start()
    try:
        engine.submit(Job(a_prompt, lambda ev: None if isinstance(ev, Delta) else ended.release(), max_tokens=40,
                          sampling=GREEDY))
        assert ended.acquire(timeout=HANG_GUARD_S) and ended.acquire(timeout=HANG_GUARD_S)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    pieces = [n for st in steps for slot, n, kind in st.items if slot == 1 and kind == "prefill"]
    assert pieces == [chunk] * (200 // chunk) + ([200 % chunk] if 200 % chunk else [])
    assert "".join(texts) == want_b[0]


def test_step_log_has_a_line_per_step_with_its_tokens(tiny_model: Path, tmp_path: Path) -> None:
    """--step-log FILE: one JSON line per decode step; the prompt tokens of its lines add up to the prompt's, the
    generating slots to the tokens generated after the first (sampled at the prompt's end), in step order and
    time, each step's phases within its time. A path that cannot be written stops the start."""
    log_path = tmp_path / "steps.jsonl"
    prompt = unique_tokens(21, 40)
    with Server(["-m", str(tiny_model), "-c", "512", "-np", "2", "-b", "64", "-ub", "16",
                 "--step-log", str(log_path)]) as s:
        r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(len(lines)))
    assert sum(x["prompt_tokens"] for x in lines) == len(prompt)
    assert sum(x["generating"] for x in lines) == 5
    assert all(a["t_start_s"] < b["t_start_s"] for a, b in itertools.pairwise(lines))
    for x in lines:
        assert x["ms"] > 0 and x["issue_ms"] + x["stream_ms"] + x["wait_ms"] <= x["ms"] + 1e-3, x
    bad = server_main(["-m", str(tiny_model), "--step-log", str(tmp_path / "no" / "such" / "dir" / "steps.jsonl")])
    assert bad == 1


def test_a_request_takes_a_free_slot_next_to_the_busy_ones(tiny_model: Path) -> None:
    """Four slots: a, b and c take slots 0, 1 and 2; c ends, then a. d, whose prompt no slot holds, takes slot 2
    (next to b's slot 1, the least recently used of 0 and 2) rather than slot 3, never used but apart from b:
    llama.cpp would cut each step of b and d into two ubatches. A slot holding a prefix of the prompt still
    comes first: e takes slot 0, which holds a's prompt. id_runs counts the runs of consecutive ids."""
    assert [id_runs(ids) for ids in ([], [3], [0, 1, 2], [1, 3], [0, 1, 3, 5, 6], [2, 2, 3])] == [0, 1, 1, 2, 3, 1]
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=4 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=4, n_threads=2)
    ended: dict[str, Done] = {}
    done = {k: threading.Event() for k in "abcde"}
    # random tokens with no BOS, as a load's: no two prompts share their first token
    prompts = {k: [100 * i + 3, *np.random.default_rng(30 + i).integers(3, 500, 11).tolist()]
               for i, k in enumerate("abcd")}
    prompts["e"] = prompts["a"] + [7, 8, 9]

    def job(name: str, max_tokens: int) -> Job:
        def emit(ev: Event) -> None:
            if not isinstance(ev, Delta):
                assert isinstance(ev, Done), ev
                ended[name] = ev
                done[name].set()
        return Job(prompts[name], emit, max_tokens=max_tokens, sampling=GREEDY, ignore_eos=True)

    engine = Engine(ctx)
    engine.start()
    try:
        for name, n in (("a", 6), ("b", 200), ("c", 2)):
            engine.submit(job(name, n))
        assert done["c"].wait(60) and done["a"].wait(60)
        assert not done["b"].is_set()
        engine.submit(job("d", 4))
        assert done["d"].wait(60)
        engine.submit(job("e", 2))  # slots 0, 2 (d's, now free) and 3 are free
        assert done["e"].wait(60) and done["b"].wait(60)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert [ended[k].slot for k in "abcde"] == [0, 1, 2, 2, 0]
    assert ended["e"].usage.prompt_tokens == len(prompts["e"])


def test_closed_loop_streams_keep_their_slots_in_one_run(tiny_model: Path) -> None:
    """A load as scripts/server-load makes it: one warm-up request, then 8 streams of 32 requests in 32 slots, each
    stream sending its next request when one ends, random prompts of 24 tokens (a slot may hold a prompt with the
    same first token: a prefix too short to pick the slot for). Every step of 8 generating slots holds one run of
    consecutive slot ids, so llama.cpp takes it as one ubatch (with the least recently used free slot alone, the
    warm-up's slot 0 joined the last round's slots 25-31: two ubatches a step; with any prefix first, a request
    whose first token matched went apart from the others)."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=32 * 128, n_batch=512, n_ubatch=512, n_seq_max=32, n_threads=2)
    steps: list[Step] = []
    rng = np.random.default_rng(7)
    lock = threading.Lock()
    ended = threading.Semaphore(0)
    to_send = [32]
    engine = Engine(ctx)

    def send() -> None:
        def emit(ev: Event) -> None:
            if isinstance(ev, Delta):
                return
            with lock:
                if to_send[0] > 0:
                    to_send[0] -= 1
                    send()
            ended.release()
        engine.submit(Job(rng.integers(3, 500, 24).tolist(), emit, max_tokens=40, sampling=GREEDY, ignore_eos=True))

    engine.start()
    try:
        warm = threading.Event()
        engine.submit(Job(rng.integers(3, 500, 24).tolist(), lambda ev: None if isinstance(ev, Delta) else warm.set(),
                          max_tokens=4, sampling=GREEDY))
        assert warm.wait(60)
        engine.on_step = steps.append
        with lock:
            for _ in range(8):
                to_send[0] -= 1
                send()
        for _ in range(32):
            assert ended.acquire(timeout=120)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    full = [[slot for slot, _, kind in st.items if kind == "generate"] for st in steps]
    split = [id_runs(ids) > 1 for ids in full if len(ids) == 8]
    assert len(split) > 100
    assert sum(split) == 0


def waits_for_work(engine: Engine) -> bool:
    """The engine's thread is blocked in its condition's wait (for a job), seen from its current frame."""
    frame = sys._current_frames().get(engine._thread.ident or -1)
    return (frame is not None and frame.f_code.co_name == "wait" and frame.f_back is not None
            and frame.f_back.f_code.co_filename == sys.modules[Engine.__module__].__file__)


def test_idle_time_is_not_host_time(tiny_model: Path) -> None:
    """In the engine (no HTTP): a step after the engine waited for work counts its host time from the job's
    arrival, not from the step before the wait (the devices waited for work, not for the host): it is at
    most the time from the job's creation to the step's start, however slow the machine."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=1, n_threads=2)
    steps: list[Step] = []
    ended = threading.Semaphore(0)
    engine = Engine(ctx, on_step=steps.append)
    engine.start()
    try:
        for seed in (21, 22):
            wait_until(lambda: waits_for_work(engine), "the engine waiting for work")  # idle
            n_before = len(steps)
            job = Job(unique_tokens(seed, 12), lambda ev: None if isinstance(ev, Delta) else ended.release(),
                      max_tokens=4, sampling=GREEDY)
            engine.submit(job)
            assert ended.acquire(timeout=HANG_GUARD_S)
        first_after_idle = steps[n_before]
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert first_after_idle.items[0][2] == "prefill"
    assert first_after_idle.host_seconds <= first_after_idle.t_start - job.submitted, first_after_idle


def test_a_snapshot_shows_whole_steps(tiny_model: Path) -> None:
    """In the engine (no HTTP): snapshot() read in the middle of a step (from a job's emit callback, which
    runs on the engine thread after a slot sampled) is the one published at the end of the step before,
    for both slots; each step's host time (the step without its llama_decode call) is in the snapshot."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=2 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    published: list[dict[str, Any]] = []  # after each step
    mid_step: list[tuple[int, dict[str, Any]]] = []
    ended = threading.Semaphore(0)

    def view(snapshot: Any) -> dict[str, Any]:  # what the engine publishes (not the queue, read when asked)
        d = snapshot.as_dict()
        return {k: d[k] for k in ("slots", "steps", "steps_by_slots", "last_step", "step_host_ms")}

    def emit(event: Event) -> None:
        if isinstance(event, Delta):
            mid_step.append((len(published), view(engine.snapshot())))
        else:
            ended.release()

    engine = Engine(ctx, on_step=lambda step: published.append(view(engine.snapshot())))
    published.append(view(engine.snapshot()))
    engine.start()
    try:
        for seed in (9, 10):
            engine.submit(Job(unique_tokens(seed, 12), emit, max_tokens=24, sampling=GREEDY))
        assert ended.acquire(timeout=HANG_GUARD_S) and ended.acquire(timeout=HANG_GUARD_S)
        final = engine.snapshot().as_dict()
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert len(mid_step) > 10
    for n, seen in mid_step:
        assert seen == published[n - 1], n
    assert final["steps"] == len(published) - 1
    # steps that follow one another start in C (no host gap to speak of); those that admit a job do not
    assert final["last_step"]["host_ms"] == final["step_host_ms"]["last"] >= 0
    assert 0 < final["steps_chained"] < final["steps"] and final["step_host_ms"]["mean"] >= 0
    phases = final["step_phase_ms"]
    assert list(phases) == ["host", "issue", "stream", "wait"] and phases["host"] == final["step_host_ms"]["mean"]
    step = final["last_step"]
    assert step["ms"] == pytest.approx(sum(step[k] for k in ("issue_ms", "stream_ms", "wait_ms")), abs=2e-3)


def test_load_64_requests_from_8_clients(server: Server, llm: Llama) -> None:
    """64 requests over 8 prompts (each with its own max_tokens), half streamed, from 8 threads: every
    answer is its own prompt's, none missing; the server is alive afterwards."""
    prompts = [f"Request number {i}: please count {'and count ' * i}" for i in range(8)]
    want = [reference(llm, p, 4 + i)[:2] for i, p in enumerate(prompts)]
    client = server.client()

    def ask(n: int) -> tuple[int, tuple[str, str]]:
        i = n % 8
        if n % 2:
            out = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=4 + i, temperature=0)
            return n, (out.choices[0].text, out.choices[0].finish_reason)
        text, finish = "", None
        for chunk in client.completions.create(model="tiny", prompt=prompts[i], max_tokens=4 + i, temperature=0,
                                               stream=True):
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return n, (text, finish)

    with ThreadPoolExecutor(8) as pool:
        answers = dict(pool.map(ask, range(64)))
    assert sorted(answers) == list(range(64))
    assert [answers[n] for n in range(64)] == [want[n % 8] for n in range(64)]
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert server.slots()["queue"]["waiting"] == 0


# -- errors --

@pytest.mark.parametrize("path, body, param, code", [
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": 4', None, None),  # not JSON
    ("/v1/completions", b'["a list"]', None, None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "ten"}, "max_tokens", None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": "5"}, "max_tokens", None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2.5}, "max_tokens", None),
    ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, "temperature", None),
    ("/v1/completions", {"prompt": "Hi", "top_p": 0}, "top_p", None),
    ("/v1/completions", {"prompt": "Hi", "stop": 3}, "stop", None),
    ("/v1/completions", {"prompt": "Hi", "n": 5}, "n", None),  # more choices than the 4 slots
    ("/v1/completions", {"prompt": "Hi", "n": 0}, "n", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 5}, "n", None),
    ("/v1/completions", {"prompt": 12}, "prompt", None),
    ("/v1/completions", {"max_tokens": 3}, "prompt", None),
    ("/v1/completions", {"prompt": ""}, "prompt", None),
    ("/v1/completions", {"prompt": [""]}, "prompt", None),
    ("/v1/completions", {"prompt": []}, "prompt", None),
    ("/v1/completions", rb'{"prompt": "a \ud800 b"}', "prompt", None),  # a lone surrogate: no text encodes it
    ("/v1/completions", rb'{"prompt": "Hi", "stop": ["\udc00"]}', "stop", None),
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a \ud800 b"}]}', "messages", None),
    ("/v1/completions", {"prompt": ["one", ""]}, "prompt", None),  # one of several prompts empty
    ("/v1/completions", {"prompt": [[1, 2], [1, 99999]]}, "prompt", None),
    ("/v1/completions", {"prompt": [1, 99999]}, "prompt", None),
    ("/v1/completions", {"prompt": [1] * (SLOT_CTX + 1)}, "prompt", "context_length_exceeded"),
    ("/v1/completions", {"prompt": [1] * SLOT_CTX}, "prompt", "context_length_exceeded"),  # no room for a token
    ("/v1/chat/completions", {"messages": "hello"}, "messages", None),
    ("/v1/chat/completions", {"messages": []}, "messages", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2 * SLOT_CTX}]}, "messages",
     "context_length_exceeded"),
])
def test_bad_request_is_400_and_the_server_goes_on(server: Server, path: str, body: Any, param: str | None,
                                                   code: str | None) -> None:
    r = server.post(path, content=body) if isinstance(body, bytes) else server.post(path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param and error["code"] == code, error
    ok = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2


def test_n_choices_are_the_requests_with_the_next_seeds(server: Server) -> None:
    """n: 3 gives three choices, index 0..2, sampled with seed, seed + 1, seed + 2 (a request with seed + 1 gives
    choices 1 and 2 first: steps of the same shape, so the same bits on any backend); the usage counts the prompt
    once and every choice's tokens. Streamed, the chunks name their choice, and each choice's text is the same;
    chat likewise."""
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
            "seed": 40, "ignore_eos": True}
    clear_slot_caches(server, 400)
    r = server.post("/v1/completions", {**body, "n": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [c["text"] for c in out["choices"]]
    assert len(set(alone)) > 1  # the seeds make different texts, or the checks would not tell
    clear_slot_caches(server, 401)
    later = server.post("/v1/completions", {**body, "n": 3, "seed": 41}).json()
    assert [c["text"] for c in later["choices"]][:2] == alone[1:]
    assert out["usage"]["completion_tokens"] == 24
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 24

    clear_slot_caches(server, 402)
    texts: dict[int, str] = {0: "", 1: "", 2: ""}
    finished: set[int] = set()
    usage = None
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "n": 3, "stream": True,
                                                                    "stream_options": {"include_usage": True}},
                      headers={"Authorization": "Bearer none"}, timeout=HANG_GUARD_S) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for c in event["choices"]:
                texts[c["index"]] += c["text"]
                if c["finish_reason"]:
                    finished.add(c["index"])
    assert [texts[i] for i in range(3)] == alone and finished == {0, 1, 2}
    assert usage is not None and usage["completion_tokens"] == 24

    chat = {"messages": MESSAGES, "max_tokens": 6, "temperature": 1.0, "top_k": 0, "seed": 7, "ignore_eos": True}
    clear_slot_caches(server, 403)
    both = server.post("/v1/chat/completions", {**chat, "n": 2}).json()
    assert [c["index"] for c in both["choices"]] == [0, 1]
    clear_slot_caches(server, 404)
    later = server.post("/v1/chat/completions", {**chat, "n": 2, "seed": 8}).json()
    assert both["choices"][1]["message"]["content"] == later["choices"][0]["message"]["content"]
    assert both["choices"][0]["message"]["content"] != both["choices"][1]["message"]["content"]


def test_several_prompts_give_their_choices_in_order(server: Server) -> None:
    """A list of prompts (texts, or token id lists) with n 2: choices 2p and 2p + 1 are prompt p's (the list
    reversed gives them reversed), each what that prompt alone gets with n 2; the usage counts each prompt once."""
    body = {"max_tokens": 6, "temperature": 1.0, "top_k": 0, "seed": 11, "ignore_eos": True}
    texts = ["The quick brown fox", "Hello there, how are"]

    def complete(prompt: str | list[str] | list[list[int]], clear: int) -> dict[str, Any]:
        clear_slot_caches(server, clear)
        return server.post("/v1/completions", {**body, "prompt": prompt, "n": 2}).json()

    out = complete(texts, 410)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    got = [c["text"] for c in out["choices"]]
    assert len(set(got)) == 4  # two prompts, two seeds each
    back = complete(texts[::-1], 411)
    if not cuda_device_count():
        # the prompts' rows swap places in each step: the CPU's kernels give such a row the same bits, CUDA's do not
        # (seen on one H200: texts that differ from their first or a later sampled token)
        assert [c["text"] for c in back["choices"]] == got[2:] + got[:2]
    echoed = server.post("/v1/completions", {**body, "prompt": texts[::-1], "n": 2, "echo": True}).json()
    assert [c["text"][:len(texts[0])] for c in echoed["choices"]] == [texts[1][:len(texts[0])]] * 2 + [texts[0]] * 2
    alone = [complete(t, 412 + i) for i, t in enumerate(texts)]
    if not cuda_device_count():
        # steps of two tokens instead of four: the CPU's kernels give the same bits (one token would not, on some
        # CPUs), CUDA's do not (other kernels by batch size), and a sampled text then drifts
        assert got == [c["text"] for a in alone for c in a["choices"]]
    assert out["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert out["usage"]["completion_tokens"] == 24
    # as the text path
    ids = [server.post("/tokenize", {"content": t, "add_special": True}).json()["tokens"] for t in texts]
    assert [c["text"] for c in complete(ids, 414)["choices"]] == got


def test_openai_client_raises_bad_request(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        server.client().completions.create(model="tiny", prompt="Hi", temperature=-1)


def test_unknown_route_is_a_404_in_openai_shape(server: Server) -> None:
    r = httpx.get(f"{server.url}/v1/engines")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One slot, a queue of one, an API key; no -m: the synthetic tiny model, written to a fresh cache."""
    cache = tmp_path_factory.mktemp("cache")
    with Server(["--synthetic", "tiny", "-np", "1", "-c", "4096", "--queue-size", "1", "--api-key", "s3cret",
                 "--chat-template", "llama3"], env={"PYLLAMA_SO_CACHE": str(cache)}, api_key="s3cret") as s:
        yield s


def test_default_model_is_the_synthetic_one(keyed: Server) -> None:
    models = keyed.client().models.list().data
    assert [m.id for m in models] == [f"tiny-f16-v{synth.CACHE_VERSION}.gguf"]
    meta = (models[0].model_extra or {})["meta"]
    assert ((meta["chat_template"], meta["chat_template_source"])
            == ("llama3", "the built-in chat template 'llama3' (--chat-template)"))


@pytest.mark.parametrize("key", [None, "wrong", "s3cret2"])
def test_wrong_api_key_is_401(keyed: Server, key: str | None) -> None:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    for method, path in [("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/engine"), ("GET", "/slots")]:
        r = httpx.request(method, f"{keyed.url}{path}", headers=headers, json={"prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 401, (path, r.text)
        if path == "/slots":  # llama-server's route: its error shape
            assert r.json()["error"] == {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
        else:
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{keyed.url}/health").status_code == 200  # public
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=key or "x", max_retries=0).models.list()
    assert keyed.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_full_queue_is_503_and_a_disconnect_frees_the_slot(keyed: Server) -> None:
    """One slot: a long streamed generation holds it, a second request waits, a third is refused (503).
    Closing the stream frees the slot and the waiting request is answered."""
    with httpx.Client(base_url=keyed.url, headers={"Authorization": "Bearer s3cret"}, timeout=HANG_GUARD_S) as http:
        with http.stream("POST", "/v1/completions", json={"prompt": "Tell a long story", "max_tokens": None,
                                                          "temperature": 0, "stream": True}) as long:
            lines = long.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # generating
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(keyed.post, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
                deadline = time.monotonic() + 30
                while keyed.slots()["queue"]["waiting"] != 1:
                    assert time.monotonic() < deadline and not waiting.done()
                    time.sleep(0.01)
                refused = keyed.post("/v1/completions", {"prompt": "Hi", "max_tokens": 3})
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"] | {"message": ""} == {
                    "message": "", "type": "unavailable_error", "param": None, "code": "queue_full"}
                long.close()  # the client leaves mid-stream
                answered = waiting.result(timeout=HANG_GUARD_S)
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 3
    slot = keyed.slots()["slots"][0]
    assert slot["state"] == "idle" and slot["totals"]["generated"] < 4000  # the long one did not run to its end
    keyed.wait_for_log(r"slot 0: cancelled after \d+ prompt tokens and \d+ generated")


def abandoned_post(server: Server, path: str, body: Any) -> socket.socket:
    """A POST sent over a plain socket whose answer is never read: closing the socket is the client leaving."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=HANG_GUARD_S)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {server.api_key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def test_a_client_gone_from_a_non_streamed_request_cancels_it(keyed: Server) -> None:
    """A non-streamed request whose client leaves while it generates is cancelled, not generated to its end
    (the end of the 4096-token slot), and the slot is free for the next request."""
    def cancellations() -> list[str]:
        return re.findall(r"slot 0: cancelled after .*", keyed.log)

    before = len(cancellations())
    body = {"prompt": unique_tokens(8, 20), "max_tokens": None, "temperature": 0}
    client = abandoned_post(keyed, "/v1/completions", body)
    try:
        wait_until(lambda: (keyed.slots()["slots"][0]["generated"] or 0) >= 1, keyed.slots)  # admitted, generating
    finally:
        client.close()  # the client leaves
    wait_until(lambda: keyed.slots()["slots"][0]["state"] == "idle", keyed.slots)
    wait_until(lambda: len(cancellations()) > before, lambda: keyed.log)  # the log line comes through a pipe
    assert re.fullmatch(r"slot 0: cancelled after 20 prompt tokens and \d+ generated", cancellations()[before])
    assert keyed.slots()["queue"]["waiting"] == 0
    answered = keyed.post("/v1/completions", {"prompt": "Hi", "max_tokens": 3})
    assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 3


# -- tensor split with and without split overlap --

def answers_with_and_without_split_overlap(model: Path, env: dict[str, str]) -> None:
    """-sm tensor with -so 1 answers as -so 0: a prompt of several 64-token ubatches (which alternate
    lanes), its continuation, and a chat. The lanes ran."""
    prompt = unique_tokens(6, 150)
    requests = [("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0}),
                ("/v1/completions", {"prompt": prompt + unique_tokens(7, 90)[1:], "max_tokens": 16, "temperature": 0}),
                ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 16, "temperature": 0})]
    results, lanes = [], []
    for so in ("0", "1"):
        with Server(["-m", str(model), "-sm", "tensor", "-fa", "on", "-so", so, "-ub", "64", "-b", "256",
                     "-c", "1024", "-np", "2"], env=env) as s:
            answers = []
            for path, body in requests:
                r = s.post(path, body)
                assert r.status_code == 200, r.text
                choice = r.json()["choices"][0]
                answers.append((choice.get("text", choice.get("message", {}).get("content")), r.json()["usage"]))
            results.append(answers)
            lanes.append(s.slots()["split_overlap"])
            # while slots generate a step takes one ubatch of prompt, with the lanes one a lane
            assert f"n_ubatch 64, prompt pieces of {64 * (1 + int(so))} while slots generate" in s.log, s.log
    assert results[0] == results[1]
    assert results[0][1][1]["prompt_tokens_details"]["cached_tokens"] == 150
    assert lanes[0]["enabled"] is False
    assert lanes[1]["enabled"] is True and lanes[1]["ubatches"][1] > 0, lanes[1]


def test_tensor_split_overlap_gives_the_same_tokens(tiny_model: Path) -> None:
    """Over CPUV0 and CPUV1."""
    answers_with_and_without_split_overlap(tiny_model, {"GGML_CPU_VIRTUAL_DEVICES": "2"})


@pytest.mark.gpu
def test_gpu_tensor_split_overlap_gives_the_same_tokens(tiny_model: Path) -> None:
    """Over two CUDA devices (two GPUs, else two devices of one), the copy-engine AllReduce forced."""
    env = {"GGML_CUDA_AR_CE": "1"}
    if cuda_device_count() < 2:
        env["GGML_CUDA_DEVICES"] = "2"
    answers_with_and_without_split_overlap(tiny_model, env)


def test_port_rule_is_shared_by_the_server_and_the_rpc_server() -> None:
    """args.tcp_port: the server allows 0 (any free port), the RPC server starts at 1; both stop at 65535."""
    import argparse

    assert A.tcp_port(0)("0") == 0 and A.tcp_port(1)("65535") == 65535
    for low, text in ((1, "0"), (0, "65536"), (0, "x")):
        with pytest.raises(argparse.ArgumentTypeError):
            A.tcp_port(low)(text)
