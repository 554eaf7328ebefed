"""llama-server's own flags in our server: a llama-server command line runs unchanged where it can (-tb, -kvu,
--no-mmap, -sps, --log-disable set what they set there; --jinja, -cb, --no-webui, ... ask for what this server
always does; --threads-http, --timeout are accepted with a warning), and the rest exit 2 saying what is not
supported (never argparse's "unrecognized arguments", nor -cb read as -c b)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from pyllama_so import Llama
from pyllama_so.server.__main__ import parser as server_parser
from pyllama_so.server.engine import Engine
from server_process import ServerProcess  # scripts/server_process.py

LLAMA_SERVER_LINE = ["-m", "model.gguf", "--jinja", "-cb", "--no-webui", "--offline", "--no-context-shift",
                     "--no-warmup", "-tb", "4", "-kvu", "--no-mmap", "-sps", "0.5", "--log-disable",
                     "--reasoning-format", "none", "--threads-http", "8", "--timeout", "600", "-c", "4096", "-np", "4",
                     "-fa", "on", "-ngl", "99", "--top-k", "20", "--top-p", "0.8", "--port", "8081"]


def test_a_llama_server_command_line_parses() -> None:
    ns = server_parser().parse_args(LLAMA_SERVER_LINE)
    assert (ns.threads_batch, ns.kv_unified, ns.use_mmap, ns.slot_prompt_similarity) == (4, True, False, 0.5)
    assert (ns.ctx_size, ns.parallel, ns.log_disable, ns.ignored_timeout) == (4096, 4, True, "600")
    plain = server_parser().parse_args(["-m", "model.gguf"])
    assert ((plain.threads_batch, plain.kv_unified, plain.use_mmap, plain.slot_prompt_similarity)
            == (None, False, True, 0.1))
    cb = server_parser().parse_args(["-cb"])  # not -c b
    assert cb.same_cont_batching and cb.ctx_size == plain.ctx_size


@pytest.mark.parametrize(("argv", "says"), [
    (["--mlock"], "argument --mlock: not supported by this server (locking the model in RAM)"),
    (["-dev", "CUDA0"], "argument -dev: not supported by this server (choosing devices by name"),
    (["--cache-reuse", "256"], "argument --cache-reuse: not supported by this server"),
    (["-mu", "http://host/model.gguf"], "argument -mu: not supported by this server (downloading a model from a URL"),
    (["--no-jinja"], "argument --no-jinja: not supported by this server"),
    (["--rope-freq-base", "1e6"], "argument --rope-freq-base: not supported by this server (RoPE overrides)"),
    (["--reasoning-format", "deepseek"], "only 'none' is supported"),
    (["-sps", "2"], "expected a number in [0, 1]"),
])
def test_what_is_not_supported_exits_2_saying_so(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        server_parser().parse_args(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_hf_and_m_together_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from pyllama_so.server.__main__ import main as server_main
    assert server_main(["-m", "x.gguf", "-hf", "org/model"]) == 2
    assert "give -m or -hf, not both" in capsys.readouterr().err


def test_the_engine_checks_its_prefix_share(tiny_model: Path) -> None:
    from pyllama_so import _llama
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=512, n_seq_max=2, n_threads=2)
    try:
        with pytest.raises(ValueError, match="prefix_share"):
            Engine(ctx, prefix_share=1.5)
    finally:
        ctx.free()
        model.free()


def test_a_server_started_with_llama_server_flags_answers_as_llama(tiny_model: Path) -> None:
    """-kvu gives each slot all of -c (512, not 256 for 2 slots), --threads-http is logged as ignored, and the
    greedy answer is Llama's."""
    prompt = "The quick brown fox"
    with Llama(tiny_model, n_ctx=512, n_threads=2) as llm:
        want = llm.create_completion(prompt, max_tokens=10, temperature=0.0)["choices"][0]["text"]
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-tb", "2", "-c", "512", "-np", "2", "-kvu", "--no-mmap",
                        "-sps", "0", "--jinja", "-cb", "--no-webui", "--threads-http", "4"]) as s:
        props = httpx.get(f"{s.url}/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 2
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": prompt, "max_tokens": 10, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        assert "--threads-http is ignored" in s.log


def test_a_full_unified_cache_makes_requests_wait_not_fail(tiny_model: Path) -> None:
    """-kvu lets each of 2 slots use all of -c 256: two requests of 150 + 100 tokens together do not fit. The
    second prompt waits while the first generates, then takes the cache the first left (dropped from its idle
    slot): both get all their tokens, the same as each alone."""
    from concurrent.futures import ThreadPoolExecutor
    body = {"max_tokens": 100, "temperature": 1.0, "ignore_eos": True}
    args = ["-m", str(tiny_model), "-t", "2", "-c", "256", "-np", "2", "-kvu"]

    def ask(s: ServerProcess, seed: int) -> httpx.Response:  # prompts with no common prefix
        prompt = list(range(3 + 200 * seed, 153 + 200 * seed))
        return httpx.post(f"{s.url}/v1/completions", json={**body, "prompt": prompt, "seed": seed}, timeout=120)
    with ServerProcess(args) as s:
        alone = [ask(s, seed).json()["choices"][0]["text"] for seed in range(2)]
    with ServerProcess(args) as s:  # a fresh one: a prompt from a slot's cache may round its last logits apart
        with ThreadPoolExecutor(2) as ex:
            answers = list(ex.map(lambda seed: ask(s, seed), range(2)))
        assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
        assert [r.json()["usage"]["completion_tokens"] for r in answers] == [100, 100]
        assert [r.json()["choices"][0]["text"] for r in answers] == alone
        s.wait_for_log("dropped the cached prompts of idle slots")


def test_a_generation_that_fills_the_unified_cache_ends_with_length(tiny_model: Path) -> None:
    """A request without a limit (max_tokens 0: up to the end of the context) joins one that generates 200
    tokens in a unified cache of 256: when the cache is full, the one without a limit ends with "length" and
    its text, short of its slot's 256 tokens; the other gets all its tokens."""
    import json
    bounded = {"prompt": list(range(40, 60)), "max_tokens": 200, "temperature": 1.0, "seed": 2, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    endless = {"prompt": list(range(3, 23)), "max_tokens": 0, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-c", "256", "-np", "2", "-kvu"]) as s:
        n_bounded, a = 0, None
        with httpx.stream("POST", f"{s.url}/v1/completions", json=bounded, timeout=120) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: {"):
                    continue
                if a is None:  # the first token: the bounded request generates
                    a = httpx.post(f"{s.url}/v1/completions", json=endless, timeout=120)
                n_bounded = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", n_bounded)
        assert a is not None and a.status_code == 200, a and a.text
        assert a.json()["choices"][0]["finish_reason"] == "length"
        assert a.json()["usage"]["completion_tokens"] < 256 - 20
        assert n_bounded == 200
        s.wait_for_log("the KV cache is full: ends at")
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_prompt_cut_by_a_full_unified_cache_yields_to_the_generating_one(tiny_model: Path) -> None:
    """Two prompts of 150 tokens taken in one step of n_batch 256 fill a unified cache of 256: all of the first,
    106 tokens of the second. The first request's next token then finds no room: the second prompt's cells are
    given back (it is evaluated again later), not the first request cut to one token. Both get their 100."""
    import threading

    from pyllama_so import _llama
    from pyllama_so.sampling import SamplingParams
    from pyllama_so.server.engine import Done, Job

    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=256, n_batch=256, n_ubatch=256, n_seq_max=2, n_threads=2, kv_unified=True)
    ended: dict[str, Done] = {}
    done = threading.Event()

    def job(name: str, first: int) -> Job:
        def emit(ev: Any) -> None:
            if isinstance(ev, Done) or not hasattr(ev, "text"):
                ended[name] = ev
                if len(ended) == 2:
                    done.set()
        return Job(list(range(first, first + 150)), emit, max_tokens=100,
                   sampling=SamplingParams.from_kwargs(temperature=0.0), ignore_eos=True)

    engine = Engine(ctx)
    engine.start()
    try:
        with engine._lock:  # both queued before the engine looks: one step takes both prompts
            engine.submit(job("a", 3))
            engine.submit(job("b", 203))
        assert done.wait(120)
    finally:
        engine.stop()
        ctx.free()
        model.free()
    assert all(isinstance(ended[k], Done) for k in "ab"), ended
    assert [ended[k].usage.completion_tokens for k in "ab"] == [100, 100]
