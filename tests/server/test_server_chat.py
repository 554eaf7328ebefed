"""The server's chat templates: the model's Jinja template in /v1/chat/completions, llama-server's
/apply-template, --chat-template / --chat-template-file, and templates that fail.

The servers run the tiny synthetic model with CHAT_TEMPLATE (or none); Llama.create_chat_completion on the same
model is the reference. helpers.chat_prompts has the template and its expected renderings.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.chat_prompts import CHATML, MESSAGES, RENDERED, SMOLLM2_PROMPT, SMOLLM2_QUESTION
from helpers.server import N_BATCH, N_UBATCH, Server
from pyllama_so import Llama, _llama
from pyllama_so.server import chat

SLOT_CTX = 256
ARGS = ["-c", str(2 * SLOT_CTX), "-np", "2", "-b", str(N_BATCH), "-ub", str(N_UBATCH)]


@pytest.fixture(scope="module")
def chat_server(chat_model: Path) -> Iterator[Server]:
    with Server(["-m", str(chat_model), *ARGS]) as s:
        yield s


@pytest.fixture(scope="module")
def chat_llm(chat_model: Path) -> Iterator[Llama]:
    with Llama(chat_model, n_ctx=SLOT_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def server_without_template(tiny_model: Path) -> Iterator[Server]:
    with Server(["-m", str(tiny_model), "-c", "256", "-np", "1"]) as s:
        yield s


def apply(server: Server, body: dict[str, object]) -> httpx.Response:
    return server.post("/apply-template", body)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_renders_the_models_jinja_template(chat_server: Server, chat_llm: Llama, stream: bool) -> None:
    """The openai client against the server and Llama.create_chat_completion: the same prompt (the GGUF's
    template, one BOS), the same greedy text and finish reason."""
    want = chat_llm.create_chat_completion(MESSAGES, max_tokens=20, temperature=0)
    client = chat_server.client()
    if stream:
        parts, finish, usage = [], None, None
        for chunk in client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                                    max_tokens=20, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        assert usage is not None
        got = ("".join(parts), finish, usage.prompt_tokens)
    else:
        out = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                             max_tokens=20, temperature=0)
        assert out.usage is not None
        got = (out.choices[0].message.content, out.choices[0].finish_reason, out.usage.prompt_tokens)
    assert got == (want["choices"][0]["message"]["content"], want["choices"][0]["finish_reason"],
                   want["usage"]["prompt_tokens"])
    assert want["usage"]["prompt_tokens"] == len(chat_llm.tokenize(RENDERED, add_bos=False, special=True))


def test_apply_template(chat_server: Server, server_without_template: Server) -> None:
    """llama-server's /apply-template: {"prompt": ...}, with tools and add_generation_prompt reaching the
    template; the model without a template gets chatml."""
    assert apply(chat_server, {"messages": MESSAGES}).json() == {"prompt": RENDERED}
    tools = [{"type": "function", "function": {"name": "météo"}}]
    r = apply(chat_server, {"messages": MESSAGES, "tools": tools, "add_generation_prompt": False})
    # with tools, llama.cpp's chat layer renders it, as llama-server: the tool normalized, the BOS left to the
    # tokenizer (this vocabulary adds one)
    assert r.json() == {"prompt": '<|tools|>[{"type": "function", "function": {"name": "météo", "description": "", '
                                  '"parameters": {}}}]\n'
                                  + RENDERED.removeprefix("<s>").removesuffix("<|assistant|>\n")}
    assert apply(server_without_template, {"messages": MESSAGES}).json() == {"prompt": CHATML}


def test_models_names_the_template(chat_server: Server) -> None:
    meta = httpx.get(f"{chat_server.url}/v1/models").json()["data"][0]["meta"]
    assert meta["chat_template_source"] == "the model's chat template (tokenizer.chat_template)"
    assert meta["chat_template"].startswith("{{ bos_token }}")  # the template itself


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
def test_a_template_that_fails_is_a_400_naming_it(chat_server: Server, server_without_template: Server,
                                                  path: str) -> None:
    r = chat_server.post(path, {"messages": [{"role": "forbidden", "content": "x"}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == (
        "the model's chat template (tokenizer.chat_template) refused these messages: the role forbidden is not allowed")
    # OpenAI's error shape names the field; llama-server's (its /apply-template) has the status as its code
    assert error["param"] == "messages" if path.startswith("/v1") else error["code"] == 400
    r = server_without_template.post(path, {"messages": MESSAGES, "tools": [{"type": "function",
                                                                             "function": {"name": "f"}}]})
    assert r.status_code == 400 and "tools need a Jinja chat template" in r.json()["error"]["message"]
    assert chat_server.post(path, {"messages": MESSAGES, "max_tokens": 1}).status_code == 200  # it goes on


def test_chat_template_file(tiny_model: Path, tmp_path: Path) -> None:
    """--chat-template-file: the file's Jinja template replaces the model's chatml fallback."""
    template = tmp_path / "brackets.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}", encoding="utf-8")
    with Server(["-m", str(tiny_model), "-c", "256", "-np", "1", "--chat-template-file", str(template)]) as s:
        assert apply(s, {"messages": MESSAGES}).json() == {"prompt": "[user: Hello there]"}
        out = s.client().chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                                 max_tokens=2, temperature=0)
        with Llama(tiny_model, n_ctx=256, n_threads=2) as llm:  # a Jinja template's prompt gets no BOS added
            assert out.usage is not None and out.usage.prompt_tokens == len(llm.tokenize("[user: Hello there]",
                                                                                          add_bos=False))
        meta = httpx.get(f"{s.url}/v1/models").json()["data"][0]["meta"]
        assert meta["chat_template_source"] == f"the chat template of --chat-template-file {template}"


def test_chat_template_by_name_and_text(chat_model: Path) -> None:
    """chat.resolve, which the server calls with --chat-template: a built-in name, a model's variant name, a
    Jinja text; the model's own without one."""
    model = _llama.Model.load(chat_model, n_gpu_layers=0)
    try:
        assert chat.resolve(model, "chatml").render(MESSAGES) == CHATML
        assert chat.resolve(model, "chat_template.default").render(MESSAGES) == RENDERED
        assert chat.resolve(model, "<{{ messages | length }}>").render(MESSAGES) == "<1>"
        assert chat.resolve(model).render(MESSAGES) == RENDERED
    finally:
        model.free()


def run_server(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyllama_so.server", "--port", "0", *args], check=False,
                          capture_output=True, text=True, timeout=120)


def test_bad_chat_template_flags_stop_the_start(tiny_model: Path, tmp_path: Path) -> None:
    """A template that cannot be used stops the server before it listens, with the template's error."""
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if messages %}never closed", encoding="utf-8")
    res = run_server(["-m", str(tiny_model), "--chat-template-file", str(broken)])
    assert res.returncode == 1 and "listening" not in res.stderr
    assert f"server: error: the chat template of --chat-template-file {broken} is not a valid Jinja template" \
        in res.stderr
    res = run_server(["-m", str(tiny_model), "--chat-template", "chatmll"])
    assert res.returncode == 1 and "server: error: --chat-template: unknown chat template name 'chatmll'" in res.stderr
    res = run_server(["-m", str(tiny_model), "--chat-template-file", str(tmp_path / "missing.jinja")])
    assert res.returncode == 1 and "missing.jinja" in res.stderr
    res = run_server(["-m", "none.gguf", "--chat-template", "chatml", "--chat-template-file", str(broken)])
    assert res.returncode == 2 and "give --chat-template or --chat-template-file, not both" in res.stderr


def test_smollm2_server_uses_its_own_template(smollm2_model: Path) -> None:
    """SmolLM2's template with its default system prompt: 42 prompt tokens, as in Llama (test_chat.py)."""
    with Server(["-m", str(smollm2_model), "-c", "512", "-np", "1"]) as s:
        assert apply(s, {"messages": SMOLLM2_QUESTION}).json() == {"prompt": SMOLLM2_PROMPT}
        out = s.client().chat.completions.create(model="smollm2", messages=SMOLLM2_QUESTION,  # type: ignore[arg-type]
                                                 max_tokens=24, temperature=0)
        assert out.usage is not None and out.usage.prompt_tokens == 42
        assert "Paris" in (out.choices[0].message.content or "") and out.choices[0].finish_reason == "stop"
