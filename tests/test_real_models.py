"""The real models of pyllama_so.models on the CPU: they are fetched and checked, they answer factual prompts
greedily, and the OpenAI server answers a chat request on SmolLM2 with its own chat template."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyllama_so import Llama, models
from real_models import real_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from server_process import ServerProcess  # noqa: E402  (scripts/server_process.py)

# Prompts and answers: each prompt was tried by greedy decoding on the CPU and kept where the model's continuation
# starts with the answer (pyllama_so at the commit of this file). Gemma 3 270M is a base model that continues
# "The capital of France is" with " the capital of the country of France", so it gets the question form, which
# it answers " Paris\nQuestion: ...". SmolLM2 answers "The capital of France is" with " Paris.".
ANSWERS = {
    "smollm2-135m": [("The capital of France is", " Paris"), ("1, 2, 3, 4,", " 5, 6, 7"),
                     ("The chemical symbol of gold is", " Au")],
    "gemma3-270m": [("Question: What is the capital of France?\nAnswer:", " Paris"), ("1, 2, 3, 4,", " 5, 6, 7"),
                    ("The chemical symbol of gold is", " Au")],
}


@pytest.fixture(scope="module", params=list(ANSWERS))
def llm(request: pytest.FixtureRequest) -> Iterator[tuple[str, Llama]]:
    """Each model loaded once for the module, on the CPU."""
    with Llama(real_model(request.param), n_gpu_layers=0, split_mode="none", n_ctx=256, n_threads=2,
               n_threads_batch=2) as model:
        yield request.param, model


def test_cached_files_match_the_pinned_sha256() -> None:
    for name, m in models.MODELS.items():
        path = real_model(name)
        assert path == models.cache_path(name) and path.stat().st_size == m.size
        assert models.sha256_file(path) == m.sha256


def test_greedy_continuations_answer(llm: tuple[str, Llama]) -> None:
    name, model = llm
    for prompt, answer in ANSWERS[name]:
        text = model.create_completion(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert text.startswith(answer), (name, prompt, text)


def test_server_answers_a_chat_request_on_smollm2() -> None:
    """SmolLM2's GGUF has a ChatML template; the server formats the chat with it and the model answers."""
    openai = pytest.importorskip("openai")
    path = real_model("smollm2-135m")
    with ServerProcess(["-m", str(path), "-c", "512", "--parallel", "1", "-t", "2"]) as server:
        assert "chat template the model's" in server.log
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=path.name, messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=24)
    choice = reply.choices[0]
    assert "Paris" in (choice.message.content or ""), choice
    assert choice.finish_reason == "stop" and reply.usage.completion_tokens < 24, reply
