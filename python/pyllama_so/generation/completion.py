"""Llama's text completion: the call's checks, then its chunks (the echoed prompt, scored when asked; the
generated text as it becomes final with its logprobs rows; the finish reason and usage), from the prompt cache
where it holds more of the prompt than the context does. The server's slots follow the same rules (limits.py,
stream.py) with their own event shapes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyllama_so import _llama
from pyllama_so.generation import limits, responses, sequence
from pyllama_so.generation.hooks import LogitsProcessor, StoppingCriteria
from pyllama_so.generation.logprobs import completion_logprobs
from pyllama_so.generation.stream import CompletionStream
from pyllama_so.generation.text import completion_text, piece_of
from pyllama_so.grammar import LlamaGrammar, ToolCallGrammar, resolve_grammar
from pyllama_so.sampling import SamplingParams

if TYPE_CHECKING:
    from pyllama_so.llama import Llama


def constraint(grammar: str | LlamaGrammar | None, response_format: dict[str, Any] | None) -> LlamaGrammar | None:
    """The grammar a call's grammar= or response_format= asks for (a GrammarError for both, or a bad one)."""
    if isinstance(grammar, ToolCallGrammar) and response_format is None:  # a chat with tools (chat.py)
        return grammar
    text, root = resolve_grammar(grammar, response_format)
    if isinstance(text, dict):  # a ToolCallGrammar, with a response_format that constrains nothing
        return ToolCallGrammar(text)
    return None if text is None else LlamaGrammar(text, root)


def create(llm: Llama, prompt: str | Sequence[int], suffix: str | None, max_tokens: int | None,
           logprobs: int | None, echo: bool, stop: str | Sequence[str] | None, seed: int | None, model: str | None,
           stopping_criteria: StoppingCriteria | None, logits_processor: LogitsProcessor | None,
           grammar: str | LlamaGrammar | None, response_format: dict[str, Any] | None, stream: bool,
           sampling: dict[str, Any]) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """Llama.create_completion's work (its docstring says what it does); sampling: SamplingParams' fields."""
    # bad input fails here, also for a stream not yet iterated: the one chain is built at the first step
    params = SamplingParams.from_kwargs(**sampling).checked(llm.n_vocab())
    _llama.check_logprobs(logprobs)
    grammar = constraint(grammar, response_format)
    if stream and grammar is not None:
        _llama.check_grammar(llm.model, grammar.grammar, grammar.root)
    # max_tokens checked now, not at the stream's first chunk
    out = chunks(llm, prompt, suffix, limits.max_tokens_limit(max_tokens), logprobs, echo, stop, seed,
                 responses.CompletionShape(model or llm.model_path), stopping_criteria, logits_processor, grammar,
                 params)
    if stream:
        return out
    return responses.merged_completion(out, model or llm.model_path, logprobs is not None)


def chunks(llm: Llama, prompt: str | Sequence[int], suffix: str | None, max_tokens: int | None,
           n_logprobs: int | None, echo: bool, stop: str | Sequence[str] | None, seed: int | None,
           shape: responses.CompletionShape, stopping_criteria: StoppingCriteria | None,
           logits_processor: LogitsProcessor | None, grammar: str | LlamaGrammar | None,
           params: SamplingParams) -> Iterator[dict[str, Any]]:
    """The `text_completion` chunks of a call, the last with the finish reason and usage."""
    model = llm.model
    # special-token text (e.g. "<|im_start|>") is parsed, as llama-cpp-python and llama-server do
    prompt_tokens = (llm.tokenize(prompt, special=True) if isinstance(prompt, (str, bytes))
                     else [int(t) for t in prompt])
    prompt_text = completion_text(model, prompt_tokens).decode("utf-8", "replace") \
        if echo or not isinstance(prompt, str) else prompt
    scored = echo and n_logprobs is not None
    if echo:
        scores = None if n_logprobs is None else prompt_logprobs(llm, prompt_tokens, n_logprobs)
        yield shape.chunk(prompt_text, None, scores)
    if llm.cache is not None and not scored:
        from_cache(llm, prompt_tokens)
    # a tool call's output keeps special tokens' text: a format's markers may be such
    out = CompletionStream(model, [stop] if isinstance(stop, str) else list(stop or []),
                           special=isinstance(grammar, ToolCallGrammar), logprobs=n_logprobs is not None,
                           prompt_len=len(prompt) if isinstance(prompt, str) else len(prompt_text))
    for tok, lp in llm._steps(prompt_tokens, max_tokens, seed, True, grammar, n_logprobs, logits_processor,
                              stopping_criteria, params, prefilled=scored):
        ready, rows = out.push(tok, lp)
        if ready:
            yield shape.chunk(ready, None, completion_logprobs(rows) if rows else None)
        if out.stopped:
            break
    n_out = len(out.tokens)
    # a stop string, else the limits (max_tokens, the context's end), else an end-of-generation token
    limited = not limits.goes_on(n_out, llm.n_tokens, max_tokens, llm.n_ctx())
    finish = "length" if limited and not out.stopped else "stop"
    tail, last = out.finish(suffix or "")
    usage = {"prompt_tokens": len(prompt_tokens), "completion_tokens": n_out,
             "total_tokens": len(prompt_tokens) + n_out}
    if llm.cache is not None:
        llm.cache[llm._tokens] = llm.save_state()
    yield shape.chunk(tail, finish, None if last is None else completion_logprobs(last), usage=usage)


def prompt_logprobs(llm: Llama, tokens: list[int], n_top: int) -> dict[str, list[Any]]:
    """echo=True with logprobs: the prompt evaluated from its start with an output at every token, each
    token scored from the row before it in C (Context.decode_logprobs), in llama-cpp-python's format."""
    return completion_logprobs(llm._seq().score_prompt(tokens, n_top, piece_of(llm.model)))


def from_cache(llm: Llama, prompt_tokens: Sequence[int]) -> None:
    """Load the cached state sharing the longest prefix with prompt_tokens, if longer than the context's."""
    try:
        state = llm.cache[prompt_tokens]
    except KeyError:
        return
    cached = sequence.common_prefix([int(t) for t in state.input_ids[: state.n_tokens]], prompt_tokens)
    if cached > sequence.common_prefix(llm._tokens, prompt_tokens):
        llm.load_state(state)
