"""The real models of pyllama_so.models on the CPU: they are fetched and checked, and they answer factual prompts
greedily (the server's chat on SmolLM2 with its own template: tests/server/test_server_chat.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.real_models import real_model
from pyllama_so import Llama, models

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
