"""llama-server's native API on our server: /completion (and /completions), /infill, /tokenize,
/detokenize, /props, /slots, /metrics, the aliases, X-Api-Key, CORS, the server-wide defaults (--temp,
--seed, -n), and llama-server's error shape on its routes.

Plain HTTP (httpx) against server subprocesses, as in test_server.py (whose main server and Llama fixtures
these tests share); the tiny synthetic model, one with fill-in-the-middle tokens for /infill, and SmolLM2
where the text matters. /metrics is read with prometheus-client's own text parser.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.cuda_devices import cuda_device_count
from helpers.logits_reference import generation_rows, log_softmax
from helpers.server import MAIN_ARGS, PROMPT, SLOT_CTX, Server, clear_slot_caches, reference, unique_tokens
from pyllama_so import Llama, _llama, synth
from pyllama_so.server.__main__ import main as server_main
from pyllama_so.server.engine import Delta, Done, Engine, Event, Job

SEEDED = {"temperature": 1.2, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 11}
LOGPROB_TOLERANCE = 2e-3 if cuda_device_count() else 1e-4  # CUDA: other kernels for other batch shapes
FIM = {"pre": 500, "suf": 501, "mid": 502, "rep": 503, "sep": 504}  # filler tokens of the tiny vocabulary


def native_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """llama-server's error object, with exactly its keys."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"code", "message", "type"} and error["code"] == status and error["type"] == kind, error
    return error


def events(r: httpx.Response) -> list[dict[str, Any]]:
    """The data of a native stream's events (llama-server's: no [DONE])."""
    lines = [line for line in r.text.splitlines() if line]
    assert all(line.startswith("data: ") for line in lines), r.text
    return [json.loads(line[len("data: "):]) for line in lines]


def metrics(s: Server, key: str) -> dict[str, float]:
    r = httpx.get(f"{s.url}/metrics", headers={"X-Api-Key": key})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {sample.name: sample.value for family in text_string_to_metric_families(r.text) for sample in family.samples}


# -- /completion --

@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_v1_completions(server: Server, stream: bool) -> None:
    """The same seeded request on both endpoints gives the same text; streamed, the pieces (each with its
    tokens) join to it and the last event is the final object, as llama-server's."""
    want = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 24, **SEEDED}).json()
    r = server.post("/completion", {"prompt": PROMPT, "n_predict": 24, "stream": stream, **SEEDED})
    assert r.status_code == 200, r.text
    if not stream:
        out = r.json()
        assert out["content"] == want["choices"][0]["text"] and out["stop"] is True
    else:
        assert r.headers["content-type"].startswith("text/event-stream") and "[DONE]" not in r.text
        *pieces, out = events(r)
        assert len(pieces) > 2 and not any(p["stop"] for p in pieces) and out["stop"] is True
        assert "".join(p["content"] for p in pieces) == want["choices"][0]["text"] and out["content"] == ""
        assert sum(len(p["tokens"]) for p in pieces) == out["tokens_predicted"]
        assert [p["tokens_predicted"] for p in pieces] == list(np.cumsum([len(p["tokens"]) for p in pieces]))
    assert out["tokens_predicted"] == want["usage"]["completion_tokens"] == 24
    assert out["tokens_evaluated"] == want["usage"]["prompt_tokens"]
    assert (out["stop_type"], out["stopping_word"], out["truncated"]) == ("limit", "", False)
    settings = out["generation_settings"]
    assert (settings["seed"], settings["temperature"], settings["top_k"], settings["n_predict"],
            settings["stream"]) == (11, 1.2, 0, 24, stream)
    assert out["timings"]["predicted_n"] == 24 and out["timings"]["prompt_n"] + out["timings"]["cache_n"] == \
        out["tokens_evaluated"]
    assert out["prompt"] == "<s>" + PROMPT  # the processed prompt, special tokens rendered
    assert out["tokens_cached"] == out["tokens_evaluated"] + 24 - 1  # the last token is sampled, not decoded


def test_greedy_completion_equals_llama(server: Server, llm: Llama) -> None:
    text, _, n_prompt, n_gen = reference(llm, PROMPT, 16)
    out = server.post("/completion",
                      {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "return_tokens": True}).json()
    assert (out["content"], out["tokens_evaluated"], out["tokens_predicted"]) == (text, n_prompt, n_gen)
    assert llm.detokenize(out["tokens"]).decode("utf-8", "replace") == text


def test_n_probs_are_the_log_softmax_of_the_logits(server: Server, llm: Llama) -> None:
    """completion_probabilities in llama-server's shape (id, token, bytes, logprob, top_logprobs of n_probs):
    the log-softmax of the model's logits at each generated position, streamed or not."""
    prompt = unique_tokens(100, 12)
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 3, "return_tokens": True}
    out = server.post("/completion", body).json()
    probs, tokens = out["completion_probabilities"], out["tokens"]
    assert len(probs) == len(tokens) == 6
    logits = generation_rows(llm, prompt, tokens)
    for p, tok, row in zip(probs, tokens, logits, strict=True):
        want = log_softmax(row)
        top = np.argsort(-want, kind="stable")[:3]
        assert p["id"] == tok and p["logprob"] == pytest.approx(want[tok], abs=LOGPROB_TOLERANCE)
        piece = llm.model.token_to_piece(tok, special=True)
        assert p["bytes"] == list(piece) and p["token"] == piece.decode("utf-8", "ignore")
        assert [t["id"] for t in p["top_logprobs"]] == top.tolist()
        assert [t["logprob"] for t in p["top_logprobs"]] == pytest.approx(want[top].tolist(), abs=LOGPROB_TOLERANCE)
        assert set(p["top_logprobs"][0]) == {"id", "token", "bytes", "logprob"}
    streamed = events(server.post("/completion", {**body, "stream": True}))
    again = [p for e in streamed for p in e.get("completion_probabilities", [])]
    # the same tokens and texts; the prompt now comes from the slot's cache with its last token evaluated alone
    # (on CUDA other kernels for that shape: equal to rounding, not to the bit)
    assert [(p["id"], p["token"], p["bytes"]) for p in again] == [(p["id"], p["token"], p["bytes"]) for p in probs]
    for a, p in zip(again, probs, strict=True):
        assert [t["id"] for t in a["top_logprobs"]] == [t["id"] for t in p["top_logprobs"]]
        assert [a["logprob"], *(t["logprob"] for t in a["top_logprobs"])] == pytest.approx(
            [p["logprob"], *(t["logprob"] for t in p["top_logprobs"])], abs=LOGPROB_TOLERANCE)
    assert "completion_probabilities" not in streamed[-1]  # as llama-server: in the pieces only


def test_n_predict_zero_and_minus_one(server: Server) -> None:
    """n_predict 0 evaluates the prompt into a slot's cache and generates nothing; -1 (and max_tokens, its
    alias) goes to the end of the slot's context, which is a truncation."""
    prompt = unique_tokens(101, 30)
    zero = server.post("/completion", {"prompt": prompt, "n_predict": 0, "id_slot": 2}).json()
    assert (zero["content"], zero["tokens_predicted"], zero["stop_type"], zero["truncated"]) == ("", 0, "limit", False)
    assert zero["tokens_evaluated"] == 30 and zero["tokens_cached"] == 30
    again = server.post("/completion", {"prompt": prompt, "n_predict": 2, "id_slot": 2, "temperature": 0}).json()
    assert again["timings"]["cache_n"] == 29 and again["tokens_predicted"] == 2  # the cache held the prompt
    full = server.post("/completion", {"prompt": unique_tokens(102, 200), "n_predict": -1, "temperature": 0,
                                       "ignore_eos": True}).json()
    assert (full["stop_type"], full["truncated"]) == ("limit", True)
    assert full["tokens_evaluated"] + full["tokens_predicted"] == SLOT_CTX  # as llama-server: they fill the slot
    alias = server.post("/completion", {"prompt": prompt, "max_tokens": 3, "ignore_eos": True}).json()
    assert alias["tokens_predicted"] == 3 and alias["generation_settings"]["n_predict"] == 3


def test_stop_word_and_eos(server: Server, llm: Llama) -> None:
    full = reference(llm, PROMPT, 32)[0]
    stop = next(full[i:i + 2] for i in range(4, len(full) - 1)
                if full[i:i + 2].isascii() and full[i:i + 2].isprintable())
    out = server.post("/completion",
                      {"prompt": PROMPT, "n_predict": 32, "temperature": 0, "stop": ["never", stop]}).json()
    assert (out["stop_type"], out["stopping_word"]) == ("word", stop) and out["content"] == full[:full.index(stop)]
    eos = server.post("/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                      "logit_bias": [[llm.token_eos(), 100.0]]}).json()
    assert (eos["stop_type"], eos["content"], eos["tokens_predicted"]) == ("eos", "", 0)


def test_logit_bias_forms(server: Server, llm: Llama) -> None:
    """llama-server's forms: [[id, bias]], {"id": bias}, a text for its tokens, false for never."""
    def text(bias: Any) -> str:
        return server.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "logit_bias": bias,
                                           "return_tokens": True}).json()["content"]
    forced = llm.detokenize([77] * 6).decode()
    assert text([[77, 100]]) == text({"77": 100}) == forced
    x = llm.tokenize(b"Q", add_bos=False)
    assert len(x) == 1 and text([["Q", 100]]) == text({"Q": 100}) == "Q" * 6
    greedy = server.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0,
                                         "return_tokens": True}).json()["tokens"]
    banned = server.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "return_tokens": True,
                                         "logit_bias": [[greedy[0], False]]}).json()
    assert banned["tokens"][0] != greedy[0]
    assert {"bias": None, "token": greedy[0]} in banned["generation_settings"]["logit_bias"]  # -inf: null in JSON


def test_id_slot_and_cache_prompt(server: Server) -> None:
    """id_slot runs a request in that slot, whose cache then serves the same prompt; cache_prompt false
    evaluates the whole prompt; another slot has nothing of it."""
    prompt = unique_tokens(103, 40)

    def ask(**kw: Any) -> dict[str, Any]:
        r = server.post("/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0, **kw})
        assert r.status_code == 200, r.text
        return r.json()
    first = ask(id_slot=3)
    assert first["id_slot"] == 3 and first["timings"]["cache_n"] <= 1
    assert ask(id_slot=3)["timings"]["cache_n"] == 39
    no_cache = ask(id_slot=3, cache_prompt=False)
    assert (no_cache["timings"]["cache_n"], no_cache["timings"]["prompt_n"]) == (0, 40)
    other = ask(id_slot=1)
    assert other["id_slot"] == 1 and other["timings"]["cache_n"] <= 1


def test_a_job_for_a_busy_slot_waits_without_holding_back_others(tiny_model: Path) -> None:
    """In the engine: with slot 0 busy, a job for slot 0 waits while a later job for any slot runs in slot 1
    and ends first."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=2 * SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
    ended: list[tuple[str, int]] = []
    done = threading.Semaphore(0)

    def sink(name: str) -> Any:
        def emit(ev: Event) -> None:
            if not isinstance(ev, Delta):
                assert isinstance(ev, Done), ev
                ended.append((name, ev.slot))
                done.release()
        return emit

    engine = Engine(ctx)
    engine.start()
    try:
        engine.submit(Job(unique_tokens(104, 8), sink("long"), max_tokens=120, id_slot=0, ignore_eos=True))
        engine.submit(Job(unique_tokens(105, 8), sink("pinned"), max_tokens=2, id_slot=0))
        engine.submit(Job(unique_tokens(106, 8), sink("any"), max_tokens=2))
        assert all(done.acquire(timeout=60) for _ in range(3))
        with pytest.raises(ValueError, match="id_slot 2 out of range"):
            engine.submit(Job([1, 2], sink("bad"), id_slot=2))
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert ended == [("any", 1), ("long", 0), ("pinned", 0)]


def test_n_cmpl_gives_an_array_of_the_requests_with_the_next_seeds(server: Server) -> None:
    """n_cmpl 3 (or OpenAI's n as its fallback): an array of three results, index 0..2, sampled with seed 11, 12
    and 13 (a request with seed 12 gives results 1 and 2 first: steps of the same shape, the same bits on any
    backend); streamed, each event names its completion's index."""
    body = {"prompt": PROMPT, "n_predict": 6, **SEEDED, "ignore_eos": True}

    def complete(clear: int, **kw: Any) -> Any:
        clear_slot_caches(server, clear)
        return server.post("/completion", {**body, **kw}).json()

    out = complete(420, n_cmpl=3)
    assert isinstance(out, list) and [x["index"] for x in out] == [0, 1, 2]
    got = [x["content"] for x in out]
    assert len(set(got)) > 1
    assert [x["content"] for x in complete(421, n_cmpl=3, seed=12)][:2] == got[1:]
    two = [x["content"] for x in complete(422, n_cmpl=2)]
    assert [x["content"] for x in complete(423, n=2)] == two
    assert isinstance(server.post("/completion", {**body, "n_cmpl": 1}).json(), dict)
    clear_slot_caches(server, 424)
    streamed = events(server.post("/completion", {**body, "n_cmpl": 2, "stream": True}))
    texts = {0: "", 1: ""}
    for e in streamed:
        texts[e["index"]] += e["content"]
    assert [texts[0], texts[1]] == two
    assert sorted(e["index"] for e in streamed if e["stop"]) == [0, 1]


def test_several_prompts_give_an_array_in_order(server: Server) -> None:
    """A list with no token id at its top level is several prompts (texts, id lists, mixed lists), as llama-server
    reads it: an array of results, completion c of prompt p at index p * n_cmpl + c, each what the prompt alone
    gets; streamed, each event names its index."""
    ids = server.post("/tokenize", {"content": "Once upon"}).json()["tokens"]
    prompts: list[Any] = [PROMPT, ids, [ids[0], " a time"]]
    body = {"n_predict": 5, **SEEDED, "seed": 3, "ignore_eos": True}
    alone = [server.post("/completion", {**body, "prompt": p}).json() for p in prompts]
    out = server.post("/completion", {**body, "prompt": prompts}).json()
    assert isinstance(out, list) and [x["index"] for x in out] == [0, 1, 2]
    assert [x["content"] for x in out] == [a["content"] for a in alone]
    assert [x["prompt"] for x in out] == [a["prompt"] for a in alone]
    assert [x["tokens_evaluated"] for x in out] == [a["tokens_evaluated"] for a in alone]
    two = server.post("/completion", {**body, "prompt": prompts[:2], "n_cmpl": 2}).json()
    assert [x["index"] for x in two] == [0, 1, 2, 3]
    assert [two[0]["content"], two[2]["content"]] == [alone[0]["content"], alone[1]["content"]]
    streamed = events(server.post("/completion", {**body, "prompt": prompts[:2], "stream": True}))
    texts = {0: "", 1: ""}
    for e in streamed:
        texts[e["index"]] += e["content"]
    assert [texts[0], texts[1]] == [alone[0]["content"], alone[1]["content"]]
    assert isinstance(server.post("/completion", {**body, "prompt": [PROMPT]}).json(), dict)


def test_response_fields(server: Server) -> None:
    out = server.post("/completion", {"prompt": PROMPT, "n_predict": 2, "response_fields": [
        "content", "generation_settings/n_predict", "missing"]}).json()
    assert set(out) == {"content", "generation_settings/n_predict"} and out["generation_settings/n_predict"] == 2


# -- /tokenize, /detokenize --

def test_tokenize_detokenize_round_trip(server: Server, llm: Llama) -> None:
    text = "Hello world, the quick fox."
    ids = server.post("/tokenize", {"content": text}).json()["tokens"]
    assert ids == llm.tokenize(text.encode(), add_bos=False)
    assert server.post("/detokenize", {"tokens": ids}).json() == {"content": text}
    assert server.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"] == [1, *ids]
    pieces = server.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == text
    # é is two byte tokens in the byte-fallback vocabulary: pieces that are not UTF-8 come as their bytes
    accent = server.post("/tokenize", {"content": "é", "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in accent] == [[0xC3], [0xA9]]
    assert server.post("/detokenize", {"tokens": [p["id"] for p in accent]}).json() == {"content": "é"}
    mixed = server.post("/tokenize", {"content": ["Hi", 77, " there"]}).json()["tokens"]
    assert mixed == llm.tokenize(b"Hi", add_bos=False) + [77] + llm.tokenize(b" there", add_bos=False)
    assert server.post("/tokenize", {}).json() == {"tokens": []}
    assert server.post("/detokenize", {}).json() == {"content": ""}


def test_smollm2_tokenizer_and_completion(smollm2_model: Path) -> None:
    """A real BPE vocabulary: pieces, special tokens parsed or not, the round trip, and /completion's greedy
    text equal to /v1/completions'."""
    text = "The capital of France is Paris. Its river: la Seine!"
    with Server(["-m", str(smollm2_model), "-c", "512", "-np", "1"]) as s:
        ids = s.post("/tokenize", {"content": text}).json()["tokens"]
        assert len(ids) < len(text) / 2  # merged pieces, not bytes
        assert s.post("/detokenize", {"tokens": ids}).json() == {"content": text}
        pieces = s.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
        assert "".join(p["piece"] for p in pieces) == text
        special = s.post("/tokenize", {"content": "<|im_start|>user"}).json()["tokens"]
        plain = s.post("/tokenize", {"content": "<|im_start|>user", "parse_special": False}).json()["tokens"]
        assert len(special) == 2 and len(plain) > 2
        want = s.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 8,
                                          "temperature": 0}).json()["choices"][0]["text"]
        got = s.post("/completion", {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}).json()
        assert got["content"] == want and "Paris" in want


# -- /props, /slots, aliases --

def test_props(server: Server, tiny_model: Path) -> None:
    props = httpx.get(f"{server.url}/props").json()
    defaults = props["default_generation_settings"]
    assert defaults["n_ctx"] == SLOT_CTX and props["total_slots"] == 4
    params = defaults["params"]
    assert (params["temperature"], params["n_predict"], params["top_k"]) == (0.8, -1, 40)
    assert props["model_path"] == str(tiny_model) and props["model_alias"] == tiny_model.name
    assert props["chat_template"] == "chatml" and props["build_info"].startswith("pyllama_so-")
    assert (props["bos_token"], props["eos_token"]) == ("<s>", "</s>")
    assert (props["endpoint_slots"], props["endpoint_metrics"]) == (True, False)
    native_error(server.post("/props", {}), 501, "not_supported_error")


def test_slots_in_llama_servers_shape(server: Server) -> None:
    prompt = unique_tokens(107, 20)
    out = server.post("/completion", {"prompt": prompt, "n_predict": 3, "id_slot": 0, "temperature": 0,
                                      "ignore_eos": True}).json()
    slots = httpx.get(f"{server.url}/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == SLOT_CTX and s["is_processing"] is False and s["speculative"] is False for s in slots)
    slot = slots[0]
    assert slot["n_prompt_tokens"] == 20 and slot["n_prompt_tokens_cache"] + slot["n_prompt_tokens_processed"] == 20
    assert slot["params"]["n_predict"] == 3 and slot["params"]["temperature"] == 0 and "stop" not in slot["params"]
    assert slot["next_token"] == [{"has_next_token": False, "has_new_line": "\n" in out["content"], "n_remain": 0,
                                   "n_decoded": 3}]
    assert httpx.get(f"{server.url}/slots?fail_on_no_slot=1").status_code == 200  # idle slots: no 503
    assert "steps_by_slots" in httpx.get(f"{server.url}/engine").json()  # our own view


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": PROMPT}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})])
def test_slots_show_the_params_of_openai_requests(server: Server, path: str, body: dict[str, Any]) -> None:
    """/slots fills params for every route, as llama-server does, not only for /completion."""
    out = server.post(path, {**body, "max_tokens": 3, "temperature": 0, "top_k": 7, "seed": 5}).json()
    slot = next(s for s in httpx.get(f"{server.url}/slots").json() if s.get("id_task") == out["id"])
    params = slot["params"]
    assert (params["n_predict"], params["temperature"], params["top_k"], params["seed"]) == (3, 0, 7, 5)
    assert params["stream"] is False and "stop" not in params


def test_aliases(server: Server) -> None:
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
    assert server.post("/completions", body).json()["content"] == server.post("/completion", body).json()["content"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    v1 = server.post("/v1/chat/completions", chat).json()
    alias = server.post("/chat/completions", chat).json()
    assert alias["choices"][0]["message"] == v1["choices"][0]["message"]
    assert (httpx.get(f"{server.url}/models").json()["data"][0]["id"]
            == httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"])
    assert httpx.get(f"{server.url}/v1/health").json() == {"status": "ok"}


def test_a_body_is_json_whatever_its_content_type(server: Server) -> None:
    """As llama-server: `curl -d` sends application/x-www-form-urlencoded."""
    body = json.dumps({"prompt": PROMPT, "n_predict": 2})
    for kind in ("application/x-www-form-urlencoded", "text/plain", None):
        r = httpx.post(f"{server.url}/completion", content=body, headers={"Content-Type": kind} if kind else {})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2, (kind, r.text)


# -- errors --

@pytest.mark.parametrize("path, body", [
    ("/completion", {"prompt": 5}),
    ("/completion", {"prompt": []}),
    ("/completion", {"prompt": ["one", []]}),  # one of several prompts empty
    ("/completion", {"prompt": [[1, 2], [3, 99999]]}),
    ("/completion", {"prompt": [1, [2, 3]]}),  # a list inside a prompt of token ids
    ("/completion", {"prompt": ["one", "two"], "id_slot": 0}),
    ("/completion", {}),
    ("/completion", {"prompt": "Hi", "n_predict": "ten"}),
    ("/completion", {"prompt": "Hi", "n_predict": -2}),
    ("/completion", {"prompt": "Hi", "temperature": "hot"}),
    ("/completion", {"prompt": "Hi", "temperature": -1}),
    ("/completion", {"prompt": "Hi", "top_p": 0}),
    ("/completion", {"prompt": "Hi", "mirostat": 3}),
    ("/completion", {"prompt": "Hi", "repeat_last_n": -5}),
    ("/completion", {"prompt": "Hi", "n_probs": 21}),
    ("/completion", {"prompt": "Hi", "n_probs": -1}),
    ("/completion", {"prompt": "Hi", "logit_bias": [[1]]}),
    ("/completion", {"prompt": "Hi", "logit_bias": [[1, True]]}),
    ("/completion", {"prompt": "Hi", "logit_bias": [[99999, 1]]}),
    ("/completion", {"prompt": "Hi", "id_slot": 4}),
    ("/completion", {"prompt": "Hi", "id_slot": -2}),
    ("/completion", {"prompt": "Hi", "samplers": ["top_k"]}),
    ("/completion", {"prompt": "Hi", "post_sampling_probs": True}),
    ("/completion", {"prompt": "Hi", "n_cmpl": 5}),  # more completions than the 4 slots
    ("/completion", {"prompt": "Hi", "n_cmpl": 2, "id_slot": 0}),
    ("/completion", {"prompt": "Hi", "grammar": "root ::= ("}),
    ("/completion", {"prompt": [1, 99999]}),
    ("/completion", b'{"prompt": "Hi"'),
    ("/tokenize", {"content": 5}),
    ("/detokenize", {"tokens": ["a"]}),
    ("/detokenize", {"tokens": [99999]}),
])
def test_bad_input_is_a_400_in_llama_servers_shape(server: Server, path: str, body: Any) -> None:
    r = server.post(path, content=body) if isinstance(body, bytes) else server.post(path, body)
    assert native_error(r, 400, "invalid_request_error")["message"]
    assert server.post("/completion", {"prompt": "Hi", "n_predict": 1}).status_code == 200


def test_a_prompt_longer_than_the_slot(server: Server) -> None:
    """As llama-server: a prompt of n_ctx tokens or more (no room for a completion) is a 400; n_predict 0 only
    evaluates the prompt, so a whole slot's worth is fine then."""
    for n in (SLOT_CTX + 1, SLOT_CTX):
        r = server.post("/completion", {"prompt": [1] * n})
        assert r.status_code == 400
        assert r.json()["error"] | {"message": ""} == {"code": 400, "message": "", "type": "exceed_context_size_error",
                                                       "n_prompt_tokens": n, "n_ctx": SLOT_CTX}
    r = server.post("/completion", {"prompt": [1] * SLOT_CTX, "n_predict": 0})
    assert r.status_code == 200 and r.json()["tokens_evaluated"] == SLOT_CTX


def test_infill_without_fim_tokens_and_metrics_off(server: Server) -> None:
    error = native_error(server.post("/infill", {"input_prefix": "def f(", "input_suffix": ")"}), 501,
                         "not_supported_error")
    assert error["message"] == ("Infill is not supported by this model: prefix token is missing. suffix token is "
                                "missing. middle token is missing.")
    assert "--metrics" in native_error(httpx.get(f"{server.url}/metrics"), 501, "not_supported_error")["message"]


# -- /infill on a model with FIM tokens --

@pytest.fixture(scope="module")
def fim_server(model_dir: Path) -> Iterator[Server]:
    model = synth.write_model(model_dir / "tiny-fim-f16.gguf", "tiny", "f16", quiet=True, extra_metadata={
        f"tokenizer.ggml.fim_{k}_token_id": v for k, v in FIM.items()})
    with Server(["-m", str(model), "-c", "1024", "-np", "1", "-b", "256", "-ub", "64"]) as s:
        yield s


def test_infill_prompt_layout(fim_server: Server, llm: Llama) -> None:
    """The repo-level FIM layout (the model has FIM_REP and FIM_SEP), written out here from llama-server's
    README and format_prompt_infill: the extra chunk, BOS, the prefix cut to its last 3/4 of -b, the prompt,
    the suffix, FIM_MID; the answer is /completion's on those tokens."""
    def tok(text: str) -> list[int]:  # the tiny model's tokenizer, the same vocabulary
        return llm.tokenize(text.encode(), add_bos=False)
    prefix = "def f(x):\n" + "    y = x\n" * 40  # 400 tokens: more than 3/4 of -b 256
    assert len(tok(prefix)) > 192
    body = {"input_prefix": prefix, "input_suffix": "    return y\n", "prompt": "  ", "n_predict": 6,
            "temperature": 0, "input_extra": [{"filename": "a.py", "text": "A = 1\n"}]}
    want = [FIM["rep"], *tok("myproject\n"), FIM["sep"], *tok("a.py\n"), *tok("A = 1\n"), FIM["sep"],
            *tok("filename\n"), 1, FIM["pre"], *tok(prefix)[-192:], *tok("  "), FIM["suf"], *tok("    return y\n"),
            FIM["mid"]]
    out = fim_server.post("/infill", body).json()
    assert out["tokens_evaluated"] == len(want), out
    assert out["prompt"] == llm.model.detokenize_bytes(want, unparse_special=True).decode()
    same = fim_server.post("/completion", {"prompt": want, "n_predict": 6, "temperature": 0}).json()
    assert out["content"] == same["content"]
    native_error(fim_server.post("/infill", {"input_prefix": "a"}), 400, "invalid_request_error")  # no input_suffix
    native_error(fim_server.post("/infill", {"input_prefix": "a", "input_suffix": 5}), 400, "invalid_request_error")


# -- the server-wide defaults, /metrics, X-Api-Key, CORS --

@pytest.mark.parametrize("flags, message", [
    (["--temp", "-1"], "temperature must be >= 0 (0 = greedy), got -1.0"),
    (["-n", "-5"], "-n/--n-predict must be >= -1 (-1 = until the end of the slot), got -5"),
    (["--seed", str(2**32)], "seed must be in [0, 2**32) or -1 / None (random), got 4294967296"),
    (["--cors-origins", ","], "--cors-origins: give origins, '*' or 'localhost'"),
])
def test_bad_default_flags_exit_2(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main(["-m", "unused.gguf", *flags]) == 2
    assert capsys.readouterr().err.splitlines() == [f"server: error: {message}"]


@pytest.fixture(scope="module")
def configured(tiny_model: Path) -> Iterator[Server]:
    """The main server's slots and batch sizes with --metrics, the defaults --temp, --seed, -n, and a key."""
    with Server(["-m", str(tiny_model), *MAIN_ARGS, "--metrics", "--temp", "1.5", "--seed", "7", "-n", "6",
                 "--api-key", "s3cret"], api_key="s3cret") as s:
        yield s


def test_temp_seed_and_n_predict_defaults(configured: Server, server: Server) -> None:
    """A request leaving temperature, seed and n_predict out gets --temp 1.5, --seed 7 and -n 6, on the native
    and the OpenAI endpoints; given, a request's own values win."""
    free = {"prompt": PROMPT, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}
    got = configured.post("/completion", free).json()
    assert got["tokens_predicted"] == 6
    assert (got["generation_settings"]["temperature"], got["generation_settings"]["seed"]) == (1.5, 7)
    same = server.post("/completion", {**free, "temperature": 1.5, "seed": 7, "n_predict": 6}).json()["content"]
    other = server.post("/completion", {**free, "seed": 7, "n_predict": 6}).json()["content"]  # the default 0.8
    assert got["content"] == same != other
    v1 = configured.post("/v1/completions", free).json()
    assert v1["choices"][0]["text"] == same and v1["usage"]["completion_tokens"] == 6  # not OpenAI's 16
    assert configured.post("/v1/completions", {**free, "max_tokens": 3}).json()["usage"]["completion_tokens"] == 3
    chat = configured.post("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
    assert chat.json()["usage"]["completion_tokens"] == 6
    params = httpx.get(f"{configured.url}/props", headers={"X-Api-Key": "s3cret"}).json()[
        "default_generation_settings"]["params"]
    assert (params["temperature"], params["seed"], params["n_predict"]) == (1.5, 7, 6)


def test_metrics_count_requests(configured: Server) -> None:
    """llama-server's metric names in Prometheus' text format; the counters grow by what a request did."""
    before = metrics(configured, "s3cret")
    assert {"llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
            "llamacpp:requests_deferred", "llamacpp:n_decode_total", "llamacpp:prompt_seconds_total",
            "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_busy_slots_per_decode",
            "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
            "llamacpp:n_tokens_max"} <= set(before)
    out = configured.post("/completion", {"prompt": unique_tokens(108, 25), "n_predict": 5, "ignore_eos": True}).json()
    after = metrics(configured, "s3cret")
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == out["timings"]["prompt_n"]
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 5
    assert after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"] >= 5
    assert after["llamacpp:prompt_seconds_total"] > before["llamacpp:prompt_seconds_total"]
    assert after["llamacpp:predicted_tokens_seconds"] > 0 and after["llamacpp:requests_processing"] == 0
    assert after["llamacpp:n_tokens_max"] >= 29 and after["llamacpp:requests_deferred"] == 0


def test_metrics_gauges_while_a_job_runs(tiny_model: Path) -> None:
    """In the engine (no HTTP, the tiny model is too fast to catch a request running): with one slot, a job
    paused in its emit callback (on the engine thread, after the step that admitted it was published) is a
    request processing, the one behind it a request deferred; afterwards neither, and the counters hold
    both jobs' tokens."""
    from pyllama_so.server.metrics import Metrics

    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=SLOT_CTX, n_batch=64, n_ubatch=16, n_seq_max=1, n_threads=2)
    paused, resume, ended = threading.Event(), threading.Event(), threading.Semaphore(0)
    deltas = []

    def emit(ev: Event) -> None:
        if isinstance(ev, Delta):
            deltas.append(ev)
            if len(deltas) == 2:
                paused.set()
                resume.wait(30)
        else:
            ended.release()

    def scrape() -> dict[str, float]:
        text = Metrics(engine.snapshot).render().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    engine = Engine(ctx)
    try:
        engine.start()
        for seed in (109, 110):
            engine.submit(Job(unique_tokens(seed, 10), emit, max_tokens=20, ignore_eos=True))
        assert paused.wait(30)
        during = scrape()
        resume.set()
        assert ended.acquire(timeout=30) and ended.acquire(timeout=30)
        after = scrape()
    finally:
        resume.set()
        engine.stop()
        ctx.free()
        model.free()
    assert (during["llamacpp:requests_processing"], during["llamacpp:requests_deferred"]) == (1, 1)
    assert (after["llamacpp:requests_processing"], after["llamacpp:requests_deferred"]) == (0, 0)
    assert after["llamacpp:tokens_predicted_total"] == 40
    assert after["llamacpp:prompt_tokens_total"] + after["llamacpp:prompt_tokens_cached_total"] == 20  # BOS is shared


def test_x_api_key(configured: Server) -> None:
    body = {"prompt": "Hi", "n_predict": 1}
    assert httpx.post(f"{configured.url}/completion", json=body, headers={"X-Api-Key": "s3cret"}).status_code == 200
    assert httpx.post(f"{configured.url}/completion", json=body,
                      headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.post(f"{configured.url}/v1/completions", json=body, headers={"X-Api-Key": "s3cret"}).status_code == 200
    bad = native_error(httpx.post(f"{configured.url}/completion", json=body, headers={"X-Api-Key": "nope"}), 401,
                       "authentication_error")
    assert bad["message"] == "Invalid API Key"
    assert httpx.post(f"{configured.url}/v1/completions", json=body).json()["error"]["code"] == "invalid_api_key"


def test_cors_preflight_reflects_any_origin_by_default(configured: Server) -> None:
    """llama-server's default: any Origin is echoed back with credentials allowed; a preflight needs no key."""
    origin = "https://app.example"
    pre = httpx.options(f"{configured.url}/completion", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-api-key, content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == origin
    assert pre.headers["access-control-allow-credentials"] == "true"
    methods = {m.strip() for m in pre.headers["access-control-allow-methods"].split(",")}
    assert {"GET", "POST", "DELETE", "OPTIONS"} <= methods
    assert pre.headers["access-control-allow-headers"] == "x-api-key, content-type"
    simple = httpx.post(f"{configured.url}/completion", json={"prompt": "Hi", "n_predict": 1},
                        headers={"Origin": origin, "X-Api-Key": "s3cret"})
    assert simple.status_code == 200 and simple.headers["access-control-allow-origin"] == origin


def test_no_slots_and_listed_cors_origins(tiny_model: Path) -> None:
    with Server(["-m", str(tiny_model), "-c", "256", "-np", "1", "--no-slots", "--cors-origins",
                 "http://good.example, http://other.example"]) as s:
        for path in ("/slots", "/engine"):
            r = httpx.get(f"{s.url}{path}")
            assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error", (path, r.text)
        assert "--slots" in native_error(httpx.get(f"{s.url}/slots"), 501, "not_supported_error")["message"]
        assert httpx.get(f"{s.url}/props").json()["endpoint_slots"] is False

        def preflight(origin: str) -> httpx.Response:
            return httpx.options(f"{s.url}/completion",
                                 headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert preflight("http://good.example").headers["access-control-allow-origin"] == "http://good.example"
        evil = preflight("http://evil.example")
        assert evil.status_code == 400 and "access-control-allow-origin" not in evil.headers
