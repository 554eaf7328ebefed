"""The server's embedding routes with --embeddings, as llama-server's (tools/server/README.md of the pin):
OpenAI's /v1/embeddings through the openai client, and the native /embedding and /embeddings over HTTP,
compared with Llama.embed on the same tiny model; without --embeddings they are 501."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from pyllama_so import Llama
from pyllama_so.embeddings import normalize
from server_process import ServerProcess  # scripts/server_process.py

TEXTS = ["hello world", "The quick brown fox", "0123456789"]
ARGS = ["-t", "2", "-c", "512", "-np", "2", "-b", "64", "-ub", "64"]


def post(server: ServerProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


@pytest.fixture(scope="module")
def mean_server(tiny_model: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["-m", str(tiny_model), *ARGS, "--embeddings", "--pooling", "mean"]) as s:
        yield s


@pytest.fixture(scope="module")
def none_server(tiny_model: Path) -> Iterator[ServerProcess]:
    with ServerProcess(["-m", str(tiny_model), *ARGS, "--embedding"]) as s:  # the model's pooling: none
        yield s


def llama_embed(model: Path, texts: list[str], pooling: str) -> list[np.ndarray]:
    with Llama(model, n_ctx=256, n_batch=64, embedding=True, pooling_type=pooling, n_threads=2) as llm:
        return [np.array(e) for e in llm.embed(texts)]


def test_v1_embeddings_equal_llamas_normalised(mean_server: ServerProcess, tiny_model: Path) -> None:
    client = openai.OpenAI(base_url=f"{mean_server.url}/v1", api_key="none", max_retries=0)
    res = client.embeddings.create(model="any", input=TEXTS)  # the client asks for base64 and decodes it
    want = [normalize(e) for e in llama_embed(tiny_model, TEXTS, "mean")]
    assert [d.index for d in res.data] == [0, 1, 2] and res.model == "any"
    for d, w in zip(res.data, want, strict=True):
        np.testing.assert_allclose(d.embedding, w, rtol=1e-4, atol=1e-5)
        assert np.linalg.norm(d.embedding) == pytest.approx(1.0, abs=1e-5)
    with Llama(tiny_model, vocab_only=True) as vocab:
        n = sum(len(vocab.tokenize(t, special=True)) for t in TEXTS)
    assert res.usage.prompt_tokens == res.usage.total_tokens == n


def test_v1_embeddings_float_base64_and_token_input(mean_server: ServerProcess, tiny_model: Path) -> None:
    floats = post(mean_server, "/v1/embeddings", {"input": "hello world", "encoding_format": "float"}).json()
    assert floats["object"] == "list" and floats["model"] == tiny_model.name
    entry = floats["data"][0]
    assert entry["object"] == "embedding" and len(entry["embedding"]) == 128
    b64 = post(mean_server, "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert b64["data"][0]["encoding_format"] == "base64"
    np.testing.assert_array_equal(decoded, np.array(entry["embedding"], dtype=np.float32))
    with Llama(tiny_model, vocab_only=True) as vocab:
        ids = vocab.tokenize("hello world")
    by_ids = post(mean_server, "/v1/embeddings", {"input": ids}).json()
    np.testing.assert_allclose(by_ids["data"][0]["embedding"], entry["embedding"], rtol=1e-6)
    raw = post(mean_server, "/v1/embeddings", {"input": "hello world", "embd_normalize": -1}).json()
    np.testing.assert_allclose(raw["data"][0]["embedding"], llama_embed(tiny_model, ["hello world"], "mean")[0],
                               rtol=1e-4, atol=1e-5)


def test_native_embedding_routes(mean_server: ServerProcess, tiny_model: Path) -> None:
    want = [normalize(e) for e in llama_embed(tiny_model, TEXTS, "mean")]
    for path, body in (("/embedding", {"content": TEXTS[0]}), ("/embeddings", {"input": TEXTS[0]})):
        res = post(mean_server, path, body).json()
        assert isinstance(res, list) and res[0]["index"] == 0
        assert len(res[0]["embedding"]) == 1  # one pooled vector, in a list
        np.testing.assert_allclose(res[0]["embedding"][0], want[0], rtol=1e-4, atol=1e-5)
    many = post(mean_server, "/embeddings", {"input": TEXTS}).json()
    assert [e["index"] for e in many] == [0, 1, 2]
    # "content" on the OpenAI route: llama-server answers in its native shape
    assert isinstance(post(mean_server, "/v1/embeddings", {"content": "hello"}).json(), list)


def test_pooling_none_per_token_and_not_openai(none_server: ServerProcess, tiny_model: Path) -> None:
    res = post(none_server, "/embeddings", {"input": "hello world"}).json()
    want = llama_embed(tiny_model, ["hello world"], "none")[0]  # unnormalised, one vector per token
    np.testing.assert_allclose(np.array(res[0]["embedding"]), want, rtol=1e-4, atol=1e-5)
    bad = post(none_server, "/v1/embeddings", {"input": "hello"})
    assert bad.status_code == 400 and "not OAI compatible" in bad.json()["error"]["message"]


@pytest.mark.parametrize("body,param,match", [
    ({"input": []}, "input", "must not be empty"),
    ({"model": "x"}, "input", '"input" or "content"'),
    ({"input": [100000]}, "input", "out of range"),
    ({"input": "w " * 200}, "input", "too large to process"),
    ({"input": "x", "encoding_format": "xml"}, "encoding_format", "encoding_format"),
    ({"input": "x", "embd_normalize": -5}, "embd_normalize", "embd_normalize"),
    ({"input": 5}, "input", "input"),
])
def test_bad_embedding_requests_are_400(mean_server: ServerProcess, body: dict, param: str, match: str) -> None:
    res = post(mean_server, "/v1/embeddings", body)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert match in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"
    assert post(mean_server, "/embedding", {"content": "still fine"}).status_code == 200


def test_the_embeddings_server_still_completes(mean_server: ServerProcess) -> None:
    res = post(mean_server, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
    assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 4


def test_without_embeddings_the_routes_are_501(tiny_model: Path) -> None:
    with ServerProcess(["-m", str(tiny_model), "-t", "2", "-c", "256", "-np", "1"]) as s:
        for path in ("/v1/embeddings", "/embedding", "/embeddings"):
            res = post(s, path, {"input": "hello"})
            assert res.status_code == 501
            assert res.json()["error"]["type"] == "not_supported_error"
            assert "--embeddings" in res.json()["error"]["message"]
