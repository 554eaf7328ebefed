"""Tool calls as llama-server makes them with --jinja: llama.cpp's chat layer finds the format of a chat
template, its grammar keeps a call well formed, and the generated text is parsed into content and tool calls,
whole or as OpenAI's stream deltas. The server's /v1/chat/completions answers OpenAI's tools with tool_calls.

The template (tests/data/tool-call-template.jinja) is written for these tests in the Hermes style many models
use: the tools in the system turn, each call a JSON object inside <tool_call></tool_call>."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from helpers.paths import DATA
from pyllama_so import _llama
from pyllama_so.tool_calls import ToolCallStream, ToolChoiceError, parse_message, tool_chat, uses_tools
from server_process import ServerProcess  # scripts/server_process.py

TEMPLATE = DATA / "tool-call-template.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def call(i: int, city: str) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


# two earlier turns that called the tool: SmolLM2-135M follows them with a call of its own
FEW_SHOT = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call(1, "Rome")]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    {"role": "assistant", "content": "It is 21 degrees in Rome."},
    {"role": "user", "content": "What is the weather in Berlin?"},
    {"role": "assistant", "content": "", "tool_calls": [call(2, "Berlin")]},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temperature": 15}'},
    {"role": "assistant", "content": "It is 15 degrees in Berlin."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    m = _llama.Model.load(tiny_model, n_gpu_layers=0)
    yield m
    m.free()


def test_the_chat_layer_finds_the_format_and_its_grammar(model: Any) -> None:
    tc = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Weather in Paris?"}], [WEATHER])
    assert '"name": "get_weather"' in tc.prompt and tc.prompt.endswith("<|im_start|>assistant\n")
    assert tc.grammar is not None and tc.grammar["lazy"]  # "auto": free text until a call starts
    assert any("<tool_call>" in p for p in tc.grammar["trigger_patterns"])
    assert "get_weather" in tc.grammar["grammar"]
    required = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER], "required")
    # "required": from the first token on, and its root is the call (the chat layer's own lets text come first)
    assert required.grammar is not None and not required.grammar["lazy"] and not required.grammar["prefill"]
    assert "\nroot ::= tool-calls\n" in required.grammar["grammar"] and required.warning is None
    # the tools' schemas reach the grammar: a second tool adds its own rule
    both = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER, TIME])
    assert "get_time" in both.grammar["grammar"] and "get_time" not in tc.grammar["grammar"]
    # a function named in tool_choice is the only one offered, and required
    named = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER, TIME],
                      {"type": "function", "function": {"name": "get_time"}})
    assert "get_time" in named.grammar["grammar"] and "get_weather" not in named.grammar["grammar"]
    assert not named.grammar["lazy"]


@pytest.mark.parametrize("choice, message", [
    ("sometimes", "tool_choice must be"),
    ({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    ({"type": "function"}, "tool_choice must be"),
])
def test_a_bad_tool_choice_is_a_value_error(model: Any, choice: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER], choice)
    assert uses_tools([WEATHER], "auto") and not uses_tools([WEATHER], "none") and not uses_tools([], "auto")


def test_a_required_call_comes_first_and_unwritable_tools_are_never_silent(model: Any, smollm2_model: Path) -> None:
    """A named function's grammar starts with that function's call alone; a template that cannot write calls
    (SmolLM2's own) refuses a required call and warns under "auto"; one that leaves the tools out of the prompt
    warns naming them."""
    named = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER, TIME],
                      {"type": "function", "function": {"name": "get_time"}}, template_name="the test template")
    assert "\nroot ::= tool-calls\n" in named.grammar["grammar"] and "get_weather" not in named.grammar["grammar"]
    own = _llama.Model.load(smollm2_model, n_gpu_layers=0)
    try:
        plain = tool_chat(own, "", [{"role": "user", "content": "Hi"}], [WEATHER], "auto", template_name="SmolLM2's")
        assert plain.grammar is None and "get_weather" not in plain.prompt
        assert plain.warning is not None and plain.warning.startswith("SmolLM2's cannot express tool calls")
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with pytest.raises(ToolChoiceError, match="needs a tool call, and SmolLM2's cannot express one"):
                tool_chat(own, "", [{"role": "user", "content": "Hi"}], [WEATHER], choice, template_name="SmolLM2's")
    finally:
        own.free()
    silent = TEMPLATE.read_text().replace("{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}", "")
    quiet = tool_chat(model, silent, [{"role": "user", "content": "Hi"}], [WEATHER], "required", template_name="T")
    assert quiet.warning == ("T does not write these tools into the prompt: get_weather; the model knows them only "
                             "through the grammar of a call")
    assert "\nroot ::= tool-calls\n" in quiet.grammar["grammar"]


def test_generated_text_parses_into_content_and_calls(model: Any) -> None:
    tc = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER],
                   parallel_tool_calls=True)
    got = parse_message(tc.parser, CALL)
    assert got["content"] is None and len(got["tool_calls"]) == 1
    assert got["tool_calls"][0]["id"].startswith("call_") and got["tool_calls"][0]["type"] == "function"
    assert got["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(got["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert parse_message(tc.parser, "Hello there.") == {"role": "assistant", "content": "Hello there."}
    two = parse_message(tc.parser, "Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Lyon"))
    assert two["content"].strip() == "Let me look."
    assert [json.loads(c["function"]["arguments"])["city"] for c in two["tool_calls"]] == ["Paris", "Lyon"]
    assert len({c["id"] for c in two["tool_calls"]}) == 2


def test_a_stream_of_pieces_gives_the_whole_message(model: Any) -> None:
    """Fed a character at a time, the deltas add up to the whole parse: the content, then each call's id,
    type and name once and its arguments in pieces."""
    tc = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER],
                   parallel_tool_calls=True)
    text = "Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Lyon")
    s = ToolCallStream(tc.parser)
    deltas = [d for d in (s.feed(ch) for ch in text[:-3]) if d] + [s.finish(text[-3:]) or {}]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                assert c["index"] not in calls and c["function"]["name"] == "get_weather"
                calls[c["index"]] = {"id": c["id"], "arguments": ""}
            else:
                assert "name" not in c["function"]
            calls[c["index"]]["arguments"] += c["function"]["arguments"]
    assert content.strip() == "Let me look." and s.called
    assert [json.loads(calls[i]["arguments"]) for i in sorted(calls)] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert len(deltas) > 10  # it streamed, not all at the end
    plain = ToolCallStream(tc.parser)
    assert "".join((plain.feed(ch) or {}).get("content", "") for ch in "No call here.") + \
        ((plain.finish("") or {}).get("content", "")) == "No call here." and not plain.called


def test_the_grammar_of_a_call_is_a_sampler_grammar(model: Any) -> None:
    """A tool call's grammar (a dict) builds a Sampler, lazy or prefilled; a broken one is a ValueError."""
    from pyllama_so.sampling import SamplingParams
    params = SamplingParams.from_kwargs(temperature=0.0)
    for choice in ("auto", "required"):
        tc = tool_chat(model, TEMPLATE.read_text(), [{"role": "user", "content": "Hi"}], [WEATHER], choice)
        smp = _llama.Sampler(model, params, grammar=tc.grammar)
        assert smp.has_grammar
        smp.free()
    with pytest.raises(ValueError, match="invalid grammar"):
        _llama.Sampler(model, params, grammar={"grammar": "root ::= (", "lazy": True, "trigger_patterns": ["<x>"]})
    with pytest.raises(ValueError, match="does not accept the generation prompt"):
        _llama.Sampler(model, params, grammar={"grammar": 'root ::= "a"', "prefill": model.tokenize("zzz").tolist()})


@pytest.fixture(scope="module")
def server(smollm2_model: Path) -> Any:
    with ServerProcess(["-m", str(smollm2_model), "-t", "2", "-c", "4096", "-np", "2",
                        "--chat-template-file", str(TEMPLATE)]) as s:
        yield s


def chat(server: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json={"max_tokens": 48, "temperature": 0, **body},
                      timeout=600)  # a hang guard: a busy CPU may take minutes


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_server_answers_tools_with_a_tool_call(server: Any, choice: Any) -> None:
    r = chat(server, messages=FEW_SHOT, tools=[WEATHER], tool_choice=choice)
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    (tc,) = out["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather"
    args = json.loads(tc["function"]["arguments"])
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert args == {"city": "Paris"}


def test_the_stream_of_a_call_through_the_openai_client(server: Any) -> None:
    import openai
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=600)
    whole = client.chat.completions.create(model="m", messages=FEW_SHOT, tools=[WEATHER], max_tokens=48, temperature=0)
    assert whole.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = [c for c in client.chat.completions.create(model="m", messages=FEW_SHOT, tools=[WEATHER], max_tokens=48,
                                                        temperature=0, stream=True) if c.choices]
    pieces = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].id and pieces[0].function.name == "get_weather" and all(p.index == 0 for p in pieces)
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_or_with_none_the_answer_is_text(server: Any) -> None:
    plain = chat(server, messages=FEW_SHOT).json()["choices"][0]
    assert plain["message"]["content"] and "tool_calls" not in plain["message"]
    assert plain["finish_reason"] != "tool_calls"
    none = chat(server, messages=FEW_SHOT, tools=[WEATHER], tool_choice="none").json()["choices"][0]
    assert "tool_calls" not in none["message"] and none["finish_reason"] != "tool_calls"


@pytest.mark.parametrize("extra, message", [
    ({"response_format": {"type": "json_object"}}, "cannot go with tools"),
    ({"tool_choice": "sometimes"}, "tool_choice must be"),
])
def test_bad_tool_requests_are_400s(server: Any, extra: dict[str, Any], message: str) -> None:
    r = chat(server, messages=FEW_SHOT, tools=[WEATHER], **extra)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_tools_need_a_jinja_template(tiny_model: Path) -> None:
    """A model without a template gets llama.cpp's built-in chatml, which cannot render tools: a 400 naming it."""
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-c", "512", "-np", "1"]) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                              "tools": [WEATHER], "max_tokens": 4}, timeout=60)
        assert r.status_code == 400 and "Jinja" in r.json()["error"]["message"], r.text


@pytest.fixture(scope="module")
def llm(smollm2_model: Path) -> Any:
    from pyllama_so import Llama
    with Llama(smollm2_model, n_ctx=2048, n_threads=2, chat_template=TEMPLATE.read_text(), verbose=False) as m:
        yield m


def test_llama_answers_tools_with_a_tool_call_as_the_server(llm: Any, server: Any) -> None:
    """Llama.create_chat_completion(tools=...) (llama-cpp-python's signature) takes the same path: the same call
    as the server's, streamed as the same deltas, and the openai types of create_chat_completion_openai_v1."""
    out = llm.create_chat_completion(FEW_SHOT, tools=[WEATHER], temperature=0, max_tokens=48)["choices"][0]
    want = chat(server, messages=FEW_SHOT, tools=[WEATHER]).json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    assert ([c["function"] for c in out["message"]["tool_calls"]]
            == [c["function"] for c in want["message"]["tool_calls"]])
    chunks = list(llm.create_chat_completion(FEW_SHOT, tools=[WEATHER], temperature=0, max_tokens=48, stream=True))
    pieces = [c for ch in chunks for c in ch["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather"
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert arguments == out["message"]["tool_calls"][0]["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    typed = llm.create_chat_completion_openai_v1(FEW_SHOT, tools=[WEATHER], temperature=0, max_tokens=48)
    assert typed.choices[0].message.tool_calls[0].function.name == "get_weather"
    # without tools the same messages give text, as before
    plain = llm.create_chat_completion(FEW_SHOT, temperature=0, max_tokens=8)["choices"][0]
    assert "tool_calls" not in plain["message"] and plain["message"]["content"]


def test_llama_refuses_tools_it_cannot_do(llm: Any, tiny_model: Path) -> None:
    from pyllama_so import Llama
    with pytest.raises(ValueError, match="cannot go with tools"):
        llm.create_chat_completion(FEW_SHOT, tools=[WEATHER], response_format={"type": "json_object"})
    with Llama(tiny_model, n_ctx=256, n_threads=2, verbose=False) as plain:  # llama.cpp's built-in chatml
        with pytest.raises(ValueError, match="Jinja chat template"):
            plain.create_chat_completion([{"role": "user", "content": "Hi"}], tools=[WEATHER], max_tokens=2)


def test_a_streamed_call_keeps_every_tokens_logprob(server: Any) -> None:
    """Pieces that make nothing certain yet give no delta, but their tokens' logprobs still go out."""
    r = chat(server, messages=FEW_SHOT, tools=[WEATHER], stream=True, logprobs=True,
             stream_options={"include_usage": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    n_logprobs = sum(len((e["choices"][0].get("logprobs") or {}).get("content") or []) for e in events if e["choices"])
    assert n_logprobs == events[-1]["usage"]["completion_tokens"] > 5
    assert any("tool_calls" in e["choices"][0]["delta"] for e in events if e["choices"])


def test_apply_template_with_tools_gives_the_chat_layers_prompt(server: Any, llm: Any) -> None:
    """/apply-template renders tools as a chat completion would generate from them: the chat layer's prompt."""
    r = httpx.post(f"{server.url}/apply-template", json={"messages": FEW_SHOT, "tools": [WEATHER]}, timeout=60)
    assert r.status_code == 200, r.text
    want = tool_chat(llm._parts()[0], TEMPLATE.read_text(), FEW_SHOT, [WEATHER]).prompt
    assert r.json()["prompt"] == want and '"name": "get_weather"' in want
    none = httpx.post(f"{server.url}/apply-template", json={"messages": FEW_SHOT, "tools": [WEATHER],
                                                            "tool_choice": "none"}, timeout=60)
    assert none.status_code == 200 and none.json()["prompt"] != want  # the Jinja2 rendering


# SmolLM2-135M answers this in prose under "auto", and so it did under "required" while the grammar let text come
# first (llama.cpp's, as llama-server at the pin has it)
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
GET_TIME = {"type": "function", "function": {"name": "get_time"}}


def test_llama_required_or_named_answers_with_a_call(llm: Any) -> None:
    prose = llm.create_chat_completion(PARIS, tools=[WEATHER, TIME], temperature=0, max_tokens=16)["choices"][0]
    assert "tool_calls" not in prose["message"] and prose["message"]["content"]
    out = llm.create_chat_completion(PARIS, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
                                     max_tokens=48)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    (call,) = out["message"]["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    chunks = list(llm.create_chat_completion(PARIS, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
                                             max_tokens=48, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any(d.get("content") for d in deltas) and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert deltas[1]["tool_calls"][0]["function"]["name"] == call["function"]["name"]
    named = llm.create_chat_completion(PARIS, tools=[WEATHER, TIME], tool_choice=GET_TIME, temperature=0,
                                       max_tokens=24)["choices"][0]
    assert named["message"]["content"] is None and named["message"]["tool_calls"]  # a call of get_time, and more
    assert {c["function"]["name"] for c in named["message"]["tool_calls"]} == {"get_time"}


def test_llama_with_a_template_that_cannot_write_calls(smollm2_model: Path) -> None:
    """SmolLM2's own template has no tool-call format: "auto" warns and answers in text, a required call is a
    ValueError naming the template."""
    from pyllama_so import Llama
    with Llama(smollm2_model, n_ctx=512, n_threads=2, verbose=False) as own:
        with pytest.warns(UserWarning, match=r"tokenizer\.chat_template\) cannot express tool calls"):
            out = own.create_chat_completion(PARIS, tools=[WEATHER], temperature=0, max_tokens=4)["choices"][0]
        assert out["message"]["content"] and "tool_calls" not in out["message"]
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with pytest.raises(ValueError, match=r"needs a tool call, and the model's chat template .* cannot express"):
                own.create_chat_completion(PARIS, tools=[WEATHER], tool_choice=choice, max_tokens=4)


def server_message(r: httpx.Response) -> tuple[str | None, list[dict[str, Any]], str]:
    """(content, tool calls as {"name", "arguments"}, finish_reason) of a chat completion, whole or streamed."""
    assert r.status_code == 200, r.text
    if not r.text.startswith("data: "):
        out = r.json()["choices"][0]
        calls = [dict(c["function"]) for c in out["message"].get("tool_calls", [])]
        return out["message"]["content"], calls, out["finish_reason"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    calls = []
    for piece in (c for d in deltas for c in d.get("tool_calls", [])):
        if "id" in piece:
            calls.append({"name": piece["function"]["name"], "arguments": ""})
        calls[piece["index"]]["arguments"] += piece["function"]["arguments"]
    return "".join(d.get("content") or "" for d in deltas) or None, calls, events[-1]["choices"][0]["finish_reason"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_required_or_named_answers_with_a_call(server: Any, stream: bool) -> None:
    content, calls, finish = server_message(chat(server, messages=PARIS, tools=[WEATHER, TIME], tool_choice="required",
                                                 stream=stream))
    assert content is None and finish == "tool_calls" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])
    # SmolLM2 calls get_time again and again until max_tokens: each call is the named one
    content, calls, _ = server_message(chat(server, messages=PARIS, tools=[WEATHER, TIME], tool_choice=GET_TIME,
                                            stream=stream))
    assert content is None and calls and {c["name"] for c in calls} == {"get_time"}


def test_the_server_with_a_template_that_cannot_write_calls(smollm2_model: Path) -> None:
    """SmolLM2's own template: a required call is a 400 on tool_choice; "auto" answers in text and logs why."""
    with ServerProcess(["-m", str(smollm2_model), "-t", "2", "-c", "512", "-np", "1"]) as s:
        for choice in ("required", GET_TIME):
            r = chat(s, messages=PARIS, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=4)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "tool_choice" and err["type"] == "invalid_request_error"
            assert "needs a tool call, and the model's chat template" in err["message"]
        r = chat(s, messages=PARIS, tools=[WEATHER], max_tokens=4)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        s.wait_for_log(r"the model's chat template \(tokenizer\.chat_template\) cannot express tool calls")


def test_a_call_cut_by_max_tokens_finishes_with_length(llm: Any, server: Any) -> None:
    """As llama-server: "tool_calls" only when the generation ended by itself; a call cut short stays "length"
    (its start still parsed into tool_calls), in Llama and the server, streamed and not."""
    ask: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": GET_TIME, "max_tokens": 16}
    whole = llm.create_chat_completion(PARIS, temperature=0, **ask)["choices"][0]
    assert whole["message"]["tool_calls"][0]["function"]["name"] == "get_time" and whole["finish_reason"] == "length"
    chunks = list(llm.create_chat_completion(PARIS, temperature=0, stream=True, **ask))
    assert any("tool_calls" in c["choices"][0]["delta"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    out = chat(server, messages=PARIS, **ask).json()["choices"][0]
    assert out["message"]["tool_calls"][0]["function"]["name"] == "get_time" and out["finish_reason"] == "length"
    r = chat(server, messages=PARIS, stream=True, **ask)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert any("tool_calls" in e["choices"][0]["delta"] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
