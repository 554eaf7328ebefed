"""llama-server's own flags in our server: a llama-server command line runs unchanged where it can (-tb, -kvu,
--no-mmap, -sps, --log-disable set what they set there; --jinja, -cb, --no-webui, ... ask for what this server
always does; --threads-http, --timeout are accepted with a warning), and the rest exit 2 saying what is not
supported (never argparse's "unrecognized arguments", nor -cb read as -c b)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from pyllama_so import Llama
from pyllama_so.server.__main__ import parser as server_parser
from pyllama_so.server.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from server_process import ServerProcess  # noqa: E402

LLAMA_SERVER_LINE = ["-m", "model.gguf", "--jinja", "-cb", "--no-webui", "--offline", "--no-context-shift",
                     "--no-warmup", "-tb", "4", "-kvu", "--no-mmap", "-sps", "0.5", "--log-disable",
                     "--reasoning-format", "none", "--threads-http", "8", "--timeout", "600", "-c", "4096", "-np", "4",
                     "-fa", "on", "-ngl", "99", "--top-k", "20", "--top-p", "0.8", "--port", "8081"]


def test_a_llama_server_command_line_parses() -> None:
    ns = server_parser().parse_args(LLAMA_SERVER_LINE)
    assert (ns.threads_batch, ns.kv_unified, ns.use_mmap, ns.slot_prompt_similarity) == (4, True, False, 0.5)
    assert (ns.ctx_size, ns.parallel, ns.log_disable, ns.ignored_timeout) == (4096, 4, True, "600")
    plain = server_parser().parse_args(["-m", "model.gguf"])
    assert (plain.threads_batch, plain.kv_unified, plain.use_mmap, plain.slot_prompt_similarity) == (None, False, True, 0.1)
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
def test_what_is_not_supported_exits_2_saying_so(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
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
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": prompt, "max_tokens": 10, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
        assert "--threads-http is ignored" in s.log


def test_a_full_unified_cache_fails_its_requests_not_the_server(tiny_model: Path) -> None:
    """-kvu lets each of 2 slots use all of -c 256: two requests of 150 + 100 tokens together do not fit. The
    step whose llama_decode finds no room ends those requests with a 500 that says so; the engine goes on."""
    from concurrent.futures import ThreadPoolExecutor
    body = {"prompt": list(range(3, 153)), "max_tokens": 100, "temperature": 1.0, "ignore_eos": True}
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-c", "256", "-np", "2", "-kvu"]) as s:
        with ThreadPoolExecutor(2) as ex:
            answers = list(ex.map(lambda seed: httpx.post(f"{s.url}/v1/completions", json={**body, "seed": seed},
                                                          timeout=120), range(2)))
        failed = [r for r in answers if r.status_code != 200]
        assert failed, [r.status_code for r in answers]
        assert all(r.status_code == 500 and "context is full" in r.json()["error"]["message"] for r in failed)
        assert httpx.get(f"{s.url}/health").status_code == 200
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
