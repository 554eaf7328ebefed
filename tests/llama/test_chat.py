"""Chat templates (pyllama_so.chat_template) and Llama.create_chat_completion.

Most tests use the tiny synthetic model with CHAT_TEMPLATE written into its metadata; the expected prompts
(helpers.chat_prompts) are spelled out from what that template says. The real-model tests take the models from
the model cache (conftest: smollm2_model, gemma3_model; `python -m pyllama_so.models fetch`).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.chat_prompts import CHAT_TEMPLATE, CHATML, MESSAGES, RENDERED, SMOLLM2_PROMPT, SMOLLM2_QUESTION
from pyllama_so import Llama, _llama, chat_template as ct
from pyllama_so.generation.responses import chat_logprobs


@pytest.fixture(scope="module")
def llm(chat_model: Path) -> Iterator[Llama]:
    with Llama(chat_model, n_ctx=512, n_batch=128, n_threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> Iterator[Llama]:
    """The tiny model without a chat template."""
    with Llama(tiny_model, n_ctx=256, n_batch=128, n_threads=2) as llm:
        yield llm


def content(out: dict[str, Any]) -> str:
    return out["choices"][0]["message"]["content"]


# -- the template --

def test_the_models_jinja_template_renders_the_prompt(llm: Llama) -> None:
    """The GGUF's template, rendered by Jinja2: its default system prompt and its BOS are in the prompt, and
    tokenizing does not add a second BOS (as llama-cpp-python tokenizes a Jinja template's output)."""
    template = llm.chat_template
    assert isinstance(template, ct.JinjaTemplate) and "tokenizer.chat_template" in template.name
    assert template.render(MESSAGES) == RENDERED
    assert template.stops == ("</s>",)  # the end of an assistant turn, which is the EOS here
    out = llm.create_chat_completion(MESSAGES, max_tokens=4, temperature=0)
    want = llm.tokenize(RENDERED, add_bos=False, special=True)
    assert want[0] == llm.token_bos() and want.count(llm.token_bos()) == 1
    assert out["usage"]["prompt_tokens"] == len(want)
    assert out["choices"][0]["message"]["content"] == llm.create_completion(want, max_tokens=4, temperature=0,
                                                                              stop=["</s>"])["choices"][0]["text"]


def test_template_variables(llm: Llama) -> None:
    """add_generation_prompt, a system message replacing the default, tools through a tojson that keeps
    non-ASCII text and the key order, strftime_now and extra variables."""
    tools = [{"type": "function", "function": {"name": "météo", "parameters": {"z": 1, "a": 2}}}]
    text = llm.chat_template.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                    add_generation_prompt=False, tools=tools)
    assert text == ('<s><|tools|>[{"type": "function", "function": {"name": "météo", '
                    '"parameters": {"z": 1, "a": 2}}}]\n'
                    "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n")
    stamp = ct.JinjaTemplate("{{ strftime_now('%Y') }}-{{ flavour }}-{{ 'x' if tool_choice is none }}", name="t")
    assert stamp.render(MESSAGES, flavour="mint") == f"{datetime.date.today().year}-mint-x"
    with pytest.raises(ValueError, match="may not set bos_token, raise_exception"):
        stamp.render(MESSAGES, bos_token="<x>", raise_exception=None)


def test_trim_blocks_lstrip_blocks_loop_controls_and_generation_tags() -> None:
    """The environment transformers renders templates in: a block tag's newline and leading spaces go,
    {% break %} works and {% generation %} keeps its body."""
    text = ("{% for m in messages %}\n    {% if loop.index > 1 %}{% break %}{% endif %}\n"
            "{% generation %}[{{ m['content'] }}]{% endgeneration %}\n{% endfor %}")
    assert ct.JinjaTemplate(text, name="t").render([{"role": "user", "content": "a"},
                                                     {"role": "user", "content": "b"}]) == "[a]"


def test_the_sandbox_keeps_the_template_from_python(llm: Llama) -> None:
    escape = ct.JinjaTemplate("{{ messages.__class__.__mro__ }}", name="the escaping template")
    with pytest.raises(ValueError, match="the escaping template failed to render"):
        escape.render(MESSAGES)
    mutate = ct.JinjaTemplate("{{ messages.append(1) }}", name="the mutating template")
    with pytest.raises(ValueError, match="the mutating template failed to render: SecurityError"):
        mutate.render(MESSAGES)


# -- create_chat_completion --

def test_chat_completion_shape(llm: Llama) -> None:
    out = llm.create_chat_completion(MESSAGES, max_tokens=6, temperature=0, model="my-model")
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-") and out["model"] == "my-model"
    assert isinstance(out["created"], int)
    choice = out["choices"][0]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"} and choice["index"] == 0
    assert choice["message"]["role"] == "assistant" and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    usage = out["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


@pytest.mark.parametrize("max_tokens", [24, None])
def test_streamed_chunks_concatenate_to_the_text(llm: Llama, max_tokens: int | None) -> None:
    """Greedy: the streamed deltas make the non-streamed message; the role comes first, the finish reason
    last with an empty delta; every chunk has the same id."""
    want = llm.create_chat_completion(MESSAGES, max_tokens=max_tokens, temperature=0)
    chunks = list(llm.create_chat_completion(MESSAGES, max_tokens=max_tokens, temperature=0, stream=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == \
        want["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == content(want) and len(chunks) > 3


def test_seeded_sampling_reaches_the_sampler(llm: Llama) -> None:
    ask = [content(llm.create_chat_completion(MESSAGES, max_tokens=16, temperature=1.5, top_k=0, top_p=0.99,
                                              min_p=0.0, seed=seed)) for seed in (3, 3, 4)]
    assert ask[0] == ask[1] != ask[2]


def test_the_templates_end_of_turn_stops_the_generation(chat_model: Path, llm: Llama) -> None:
    """A template whose assistant turns end with a text that the greedy answer contains: the answer ends
    before it with finish_reason "stop" (the prompt itself is the same)."""
    full = content(llm.create_chat_completion(MESSAGES, max_tokens=32, temperature=0))
    marker = next(full[i:i + 2] for i in range(4, len(full) - 1) if full[i:i + 2].strip() == full[i:i + 2]
                  and full[i:i + 2].isprintable())
    template = CHAT_TEMPLATE.replace("{{ m['content'] }}{{ eos_token }}",
                                     "{{ m['content'] }}{{ '" + marker
                                     + "' if m['role'] == 'assistant' else eos_token }}")
    with Llama(chat_model, n_ctx=512, n_batch=128, n_threads=2, chat_template=template) as other:
        assert other.chat_template.stops == (marker, "</s>") and other.chat_template.render(MESSAGES) == RENDERED
        out = other.create_chat_completion(MESSAGES, max_tokens=32, temperature=0)
    assert content(out) == full[:full.index(marker)] and out["choices"][0]["finish_reason"] == "stop"


def test_user_stop_strings_add_to_the_templates(llm: Llama) -> None:
    full = content(llm.create_chat_completion(MESSAGES, max_tokens=32, temperature=0))
    stop = full[5:7]
    out = llm.create_chat_completion(MESSAGES, max_tokens=32, temperature=0, stop=stop)
    assert content(out) == full[:full.index(stop)]


def test_tools_and_functions_reach_the_template(llm: Llama) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    # the template writes the tools but no tool call: the chat layer finds no call format, and says so
    with pytest.warns(UserWarning, match="cannot express tool calls"):
        with_tools = llm.create_chat_completion(MESSAGES, tools=[tool], max_tokens=1, temperature=0)
    with pytest.warns(UserWarning, match="cannot express tool calls"):
        legacy = llm.create_chat_completion(MESSAGES, functions=[tool["function"]], max_tokens=1, temperature=0)
    plain = llm.create_chat_completion(MESSAGES, max_tokens=1, temperature=0)
    # with tools llama.cpp's chat layer renders the template (as llama-server's --jinja), the tool normalized
    # with an empty description
    added = len(llm.tokenize('<|tools|>[{"type": "function", "function": {"name": "lookup", "description": "", '
                             '"parameters": {}}}]\n', add_bos=False))
    assert with_tools["usage"]["prompt_tokens"] == legacy["usage"]["prompt_tokens"] == \
        plain["usage"]["prompt_tokens"] + added


def test_sampling_grammar_and_logprobs_reach_the_generation(llm: Llama) -> None:
    """What create_completion takes, create_chat_completion hands on: a grammar constrains the answer,
    logit_bias forces a token, logprobs come in the chat shape."""
    for seed in range(3):
        out = llm.create_chat_completion(MESSAGES, max_tokens=4, temperature=1.0, seed=seed,
                                         grammar='root ::= "yes" | "no"')
        assert out["choices"][0]["message"]["content"] in ("yes", "no")
    out = llm.create_chat_completion(MESSAGES, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] and all(len(c["top_logprobs"]) <= 3 for c in content)
    forced = llm.create_chat_completion(MESSAGES, max_tokens=3, logit_bias={77: 100.0})
    assert forced["choices"][0]["message"]["content"] == llm.detokenize([77] * 3).decode("utf-8", "replace")
    with pytest.raises(ValueError, match="top_logprobs"):
        llm.create_chat_completion(MESSAGES, max_tokens=1, top_logprobs=3)


def test_completion_logprobs_in_the_chat_shape() -> None:
    got = chat_logprobs({"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.0], "text_offset": [0, 1],
                         "top_logprobs": [{"a": -0.5, "x": -2.0}, {"b": -1.0}]})
    assert got == {"content": [
        {"token": "a", "logprob": -0.5, "bytes": None,
         "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": None},
                          {"token": "x", "logprob": -2.0, "bytes": None}]},
        {"token": "b", "logprob": -1.0, "bytes": None,
         "top_logprobs": [{"token": "b", "logprob": -1.0, "bytes": None}]},
    ], "refusal": None}
    assert chat_logprobs(None) is None


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty list"), ("hello", "non-empty list"), ([{"content": "no role"}], r"messages\[0\]"),
    ([MESSAGES[0], "text"], r"messages\[1\]"),
])
def test_bad_messages(llm: Llama, messages: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        llm.create_chat_completion(messages)


# -- overrides and fallbacks --

def test_a_model_without_template_gets_chatml(plain: Llama) -> None:
    assert isinstance(plain.chat_template, ct.BuiltinTemplate) and "chatml" in plain.chat_template.name
    assert plain.chat_template.render(MESSAGES) == CHATML
    assert plain.chat_template.stops == ("<|im_end|>", "</s>")
    out = plain.create_chat_completion(MESSAGES, max_tokens=3, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(plain.tokenize(CHATML, special=True))  # the tokenizer adds BOS


@pytest.mark.parametrize("kw, want", [
    ({"chat_format": "chatml"}, CHATML),
    ({"chat_template": "chatml"}, CHATML),
    ({"chat_format": "llama-2"}, _llama.chat_apply_template("llama2", MESSAGES)),  # llama-cpp-python's name
    ({"chat_format": "gemma"}, "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n"),
    ({"chat_format": "chat_template.default"}, RENDERED),
    ({"chat_template": "[{{ messages[0]['content'] }}]"}, "[Hello there]"),
])
def test_overrides_by_name_and_by_text(chat_model: Path, kw: dict[str, str], want: str) -> None:
    with Llama(chat_model, n_ctx=256, n_threads=2, **kw) as llm:  # type: ignore[arg-type]
        assert llm.chat_template.render(MESSAGES) == want
        out = llm.create_chat_completion(MESSAGES, max_tokens=1, temperature=0)
        tokens = llm.tokenize(want, add_bos=isinstance(llm.chat_template, ct.BuiltinTemplate), special=True)
        assert out["usage"]["prompt_tokens"] == len(tokens)


@pytest.mark.parametrize("kw, error, match", [
    ({"chat_format": "chatmll"}, ValueError, r"chat_format=: unknown chat template name 'chatmll'.*chatml, "),
    ({"chat_template": "{% for m in messages %}"}, ValueError,
     r"the chat template given as chat_template= is not a valid Jinja template: .*endfor"),
    ({"chat_format": "chat_template.tool_use"}, ValueError,
     r"tokenizer.chat_template.tool_use, which the model does not"),
    ({"chat_format": "chatml", "chat_template": "chatml"}, ValueError, "not both"),
])
def test_bad_overrides_fail_at_once(chat_model: Path, kw: dict[str, str], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Llama(chat_model, n_ctx=256, n_threads=2, **kw)  # type: ignore[arg-type]


def test_a_template_that_fails_to_render_is_an_error_naming_it(llm: Llama) -> None:
    with pytest.raises(ValueError, match=r"the model's chat template \(tokenizer.chat_template\) refused these "
                                         "messages: the role forbidden is not allowed"):
        llm.create_chat_completion([{"role": "forbidden", "content": "x"}])
    undefined = ct.JinjaTemplate("{{ nothing.attribute }}", name="the undefined template")
    with pytest.raises(ValueError, match="the undefined template failed to render: UndefinedError"):
        undefined.render(MESSAGES)


def test_a_models_broken_template_fails_the_chat_only(model_dir: Path) -> None:
    """A model whose own template is not valid Jinja loads and completes; its chats are a ValueError naming
    the template, never a silent fallback to another one."""
    from pyllama_so import synth

    path = synth.write_model(model_dir / "tiny-broken-chat.gguf", "tiny", quiet=True,
                             chat_template="{% if messages %}unclosed")
    with Llama(path, n_ctx=256, n_threads=2) as llm:
        assert llm.create_completion("Hi", max_tokens=2)["choices"][0]["finish_reason"]
        with pytest.raises(ValueError, match=r"the model's chat template \(tokenizer.chat_template\) is not a valid "
                                             "Jinja template"):
            llm.create_chat_completion(MESSAGES)


def test_tools_with_a_builtin_template_are_an_error(plain: Llama) -> None:
    with pytest.raises(ValueError, match="tools need a Jinja chat template"):
        plain.create_chat_completion(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}])


def test_without_jinja2(monkeypatch: pytest.MonkeyPatch, chat_model: Path, plain: Llama) -> None:
    """Without Jinja2, a model without a template still chats (llama.cpp's chatml); one with a Jinja template
    gets an ImportError naming the extra when it chats, and completes as before."""
    for name in [m for m in sys.modules if m == "jinja2" or m.startswith("jinja2.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 raises ImportError
    assert plain.create_chat_completion(MESSAGES, max_tokens=1)["object"] == "chat.completion"
    with Llama(chat_model, n_ctx=256, n_threads=2) as llm:
        assert llm.create_completion("Hi", max_tokens=1)["object"] == "text_completion"
        with pytest.raises(ImportError, match=r"tokenizer.chat_template\) is a Jinja template, and rendering it needs "
                                              r'Jinja2: pip install "pyllama_so\[chat\]"'):
            llm.create_chat_completion(MESSAGES)


# -- real models --

def test_smollm2_uses_its_own_template(smollm2_model: Path) -> None:
    """SmolLM2's template adds its default system prompt: 42 prompt tokens, the count llama-cpp-python 0.3.36
    gives (issue 22's trial), where llama.cpp's built-in chatml gives 21."""
    with Llama(smollm2_model, n_ctx=512, n_threads=2) as llm:
        assert llm.chat_template.render(SMOLLM2_QUESTION) == SMOLLM2_PROMPT
        assert llm.chat_template.stops == ("<|im_end|>",)
        out = llm.create_chat_completion(SMOLLM2_QUESTION, max_tokens=24, temperature=0)
        assert out["usage"]["prompt_tokens"] == 42
        builtin = llm.tokenize(_llama.chat_apply_template("chatml", SMOLLM2_QUESTION), add_bos=True, special=True)
        assert len(builtin) == 21
        assert "Paris" in content(out) and out["choices"][0]["finish_reason"] == "stop"  # ended by <|im_end|>
        assert out["usage"]["completion_tokens"] < 24
        chunks = llm.create_chat_completion(SMOLLM2_QUESTION, max_tokens=24, temperature=0, stream=True)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content(out)


def test_gemma3_has_no_template_and_takes_the_gemma_builtin(gemma3_model: Path) -> None:
    """The Gemma 3 270M GGUF of that package (the base model) has no tokenizer.chat_template: chatml by
    default; chat_format="gemma" gives Gemma's turns, tokenized with <start_of_turn> as one special token
    after the vocabulary's BOS."""
    with Llama(gemma3_model, n_ctx=512, n_threads=2) as llm:
        assert isinstance(llm.chat_template, ct.BuiltinTemplate) and "chatml" in llm.chat_template.name
    with Llama(gemma3_model, n_ctx=512, n_threads=2, chat_format="gemma") as llm:
        prompt = llm.chat_template.render(SMOLLM2_QUESTION)
        assert prompt == ("<start_of_turn>user\nWhat is the capital of France? Answer in one word.<end_of_turn>\n"
                          "<start_of_turn>model\n")
        assert llm.chat_template.stops == ("<end_of_turn>", "<eos>")
        tokens = llm.tokenize(prompt, add_bos=True, special=True)
        [turn] = llm.tokenize("<start_of_turn>", add_bos=False, special=True)
        assert tokens[0] == llm.token_bos() and tokens.count(turn) == 2
        out = llm.create_chat_completion(SMOLLM2_QUESTION, max_tokens=4, temperature=0)
        assert out["usage"]["prompt_tokens"] == len(tokens)
