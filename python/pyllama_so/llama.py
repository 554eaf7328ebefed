"""The high-level `Llama` class: a model and a context with llama-cpp-python's names.

    with Llama("model.gguf", split_mode="tensor") as llm:
        out = llm.create_completion("Hello", max_tokens=16)
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_so import _llama, chat_completion
from pyllama_so import chat_template as templates
from pyllama_so._llama import ContextFullError, ModelLoadError
from pyllama_so.chat_template import ChatTemplate
from pyllama_so.grammar import LlamaGrammar, grammar_text, resolve_grammar
from pyllama_so.logprobs import LogitsProcessor, LogprobRows, StoppingCriteria, completion_logprobs
from pyllama_so.sampling import SamplingParams
from pyllama_so.textstream import TextStream

_GGUF_MAGIC = b"GGUF"

def max_tokens_limit(max_tokens: int | None) -> int | None:
    """max_tokens as llama-cpp-python reads it: None, 0 or a negative count generate up to the end of the
    context (returned as None); a positive count at most that many tokens. The server follows the same
    rule. ValueError for anything but an integer or None."""
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
        raise ValueError(f"max_tokens must be an integer or None, got {max_tokens!r}")
    return int(max_tokens) if max_tokens > 0 else None


def _check_gguf_file(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"model path is a directory: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (magic {magic!r}): {path}")


def _constraint(grammar: str | LlamaGrammar | None, response_format: dict[str, Any] | None) -> LlamaGrammar | None:
    """The grammar a call's grammar= or response_format= asks for (a GrammarError for both, or a bad one)."""
    text, root = resolve_grammar(grammar, response_format)
    return None if text is None else LlamaGrammar(text, root)


class Llama:
    """A GGUF model and one context on it. Use as a context manager, or call close().

    n_ctx: llama.cpp rounds the context up to a multiple of 256 tokens, so it is at least 256
    (0: the model's training context); a request that changes is warned about (UserWarning), and
    n_ctx() is what the context holds.

    verbose: show llama.cpp's log from the info level on (default: warnings and errors). A level set
    with pyllama_so.set_log_level() before is kept: verbose=True only lowers it to info.

    split_overlap: with split_mode="tensor", consecutive ubatches of at least 64 tokens alternate
    between two lanes (each with its own scheduler, streams, AllReduce context and compute buffers),
    so one ubatch's AllReduces run while the next ubatch computes. It helps prompt processing where
    the AllReduces take a noticeable share of the time; n_ubatch is the size of each lane's ubatch, by
    default half of n_batch (else 512, as llama.cpp), so that every batch feeds both lanes.
    The logits are bitwise identical to those without it. Decoding (ubatches under 64 tokens) stays
    on lane 0. Each lane reserves its own compute buffers. Without split_mode="tensor" it is a
    ValueError; where the library keeps the lanes off (e.g. not every layer on the split devices),
    a UserWarning says why. split_overlap_stats() tells what ran; docs/multi-gpu.md has the details.

    rpc_servers: llama.cpp's RPC backend, devices of other machines ("host:port" of each
    `python -m pyllama_so.rpc_server`, a list or a comma-separated string as llama.cpp's --rpc). Their
    devices come first, then the local ones; tensor_split and main_gpu count them in that order. A server
    that cannot be reached is an RPCConnectionError (a ConnectionError) before the model loads; one that
    goes away later makes the next eval or generation step raise it (docs/multi-gpu.md, "More than one
    machine").

    backend_sampling: run the sampler chain inside the decode graph on the model's output device
    (llama.cpp's experimental backend sampling), so only the token leaves the GPU. Off by default; greedy
    tokens are the same either way. llama.cpp keeps it on the CPU under split_mode="tensor", for a
    grammar, logprobs, logits processors and stopping criteria.

    chat_format / chat_template: the template of create_chat_completion. By default it is the model's own
    (tokenizer.chat_template, a Jinja template rendered by Jinja2 as llama-cpp-python and transformers do;
    it needs the `chat` extra), else llama.cpp's built-in "chatml". chat_format names a template: one of
    llama.cpp's built-ins (pyllama_so.chat_template.builtin_names(): "chatml", "llama3", "gemma", ...;
    llama-cpp-python's "llama-2" and "llama-3" too), "chat_template.default" (the model's own) or
    "chat_template.NAME" (the model's tokenizer.chat_template.NAME). chat_template is a Jinja template text,
    or a name as chat_format. A template given here is checked at once (ValueError); the model's own is
    compiled at the first chat.
    """

    # defaults for close() and __del__ when __init__ never ran (a misspelled keyword)
    _model: _llama.Model | None = None
    _ctx: _llama.Context | None = None

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = -1,
        split_mode: str | int = "layer",
        tensor_split: Sequence[float] | None = None,
        attn_split: Sequence[float] | None = None,
        main_gpu: int = 0,
        n_ctx: int = 4096,
        n_batch: int = 2048,
        n_ubatch: int | None = None,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        flash_attn: str | bool | None = "auto",
        type_k: str | int = "f16",
        type_v: str | int = "f16",
        split_overlap: bool = False,
        rpc_servers: str | Sequence[str] | None = None,
        backend_sampling: bool = False,
        use_mmap: bool = True,
        seed: int | None = None,
        chat_format: str | None = None,
        chat_template: str | None = None,
        verbose: bool = False,
    ) -> None:
        path = Path(os.fspath(model_path))
        mode = _llama.split_mode_name(split_mode)
        fa = _llama.flash_attn_name(flash_attn)
        tk, tv = _llama.cache_type_name(type_k, "type_k"), _llama.cache_type_name(type_v, "type_v")
        servers = None if rpc_servers is None else _llama.rpc_endpoints(rpc_servers)
        if attn_split is not None and mode != "tensor":  # before its length: no device count makes it right
            raise ValueError(f'attn_split needs split_mode="tensor" (got split_mode={mode!r}): it splits the '
                             "attention heads of tensor split")
        # with RPC servers the device count is known once connected: Model.load checks the lengths then
        n_devices = None if servers is None else _llama.max_devices()
        split = None if tensor_split is None else _llama.check_tensor_split(tensor_split, n_devices)
        attn = None if attn_split is None else _llama.check_attn_split(attn_split, n_devices)
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_ubatch is None:
            n_ubatch = _llama.default_n_ubatch(n_batch, split_overlap)
        _llama.check_batch_sizes(n_batch, n_ubatch)
        n_gpus = _llama.gpu_device_count()
        if n_gpus and servers is None and not 0 <= main_gpu < n_gpus:
            raise ValueError(f"main_gpu {main_gpu} out of range: {n_gpus} GPU device(s)")
        if not isinstance(split_overlap, bool):
            raise TypeError("split_overlap must be a bool")
        if split_overlap and mode != "tensor":
            raise ValueError(f'split_overlap needs split_mode="tensor" (got split_mode={mode!r}): the two lanes '
                             "overlap the AllReduces of tensor split")
        if chat_format is not None and chat_template is not None:
            raise ValueError("give chat_format or chat_template, not both: both choose the chat template")
        _check_gguf_file(path)

        self.model_path = str(path)
        self.chat_format = chat_format
        self._chat: ChatTemplate | None = None  # the model's own is compiled at the first chat
        self.verbose = verbose
        self.split_overlap = split_overlap
        if not isinstance(backend_sampling, bool):
            raise TypeError("backend_sampling must be a bool")
        self.backend_sampling = backend_sampling
        self._rng = np.random.default_rng(seed)
        self._tokens: list[int] = []  # what the KV cache holds, in order
        _llama.set_verbose(verbose)

        self._model = _llama.Model.load(path, n_gpu_layers=n_gpu_layers, split_mode=mode, main_gpu=main_gpu,
                                        tensor_split=split, use_mmap=use_mmap, attn_split=attn,
                                        rpc_servers=servers)
        try:
            if chat_format is not None:  # before the context, whose KV cache may take long to allocate
                self._chat = templates.from_spec(self._model, chat_format, name="chat_format=")
            elif chat_template is not None:
                self._chat = templates.from_spec(self._model, chat_template, name="chat_template=")
            cpus = os.cpu_count() or 1  # llama-cpp-python's defaults: half the CPUs for generation, all for batches
            self._ctx = _llama.Context(self._model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                                       n_threads=n_threads or max(cpus // 2, 1),
                                       n_threads_batch=n_threads_batch or cpus,
                                       flash_attn=fa, type_k=tk, type_v=tv, split_overlap=split_overlap)
        except BaseException:
            self.close()
            raise
        if n_ctx and self._ctx.n_ctx != n_ctx:
            warnings.warn(f"n_ctx={n_ctx} became {self._ctx.n_ctx}: llama.cpp rounds the context up to a "
                          "multiple of 256 tokens", UserWarning, stacklevel=2)
        if split_overlap:
            stats = self._ctx.split_overlap_stats()
            if not stats["enabled"]:  # llama.cpp logs it too, but the log may be hidden
                warnings.warn(f"split_overlap stays off: {stats['reason']}", UserWarning, stacklevel=2)

    # -- lifetime --

    def close(self) -> None:
        """Free the context, then the model. Idempotent."""
        if self._ctx is not None:
            self._ctx.free()
            self._ctx = None
        if self._model is not None:
            self._model.free()
            self._model = None

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def _parts(self) -> tuple[_llama.Model, _llama.Context]:
        if self._model is None or self._ctx is None:
            raise ValueError("this Llama is closed")
        return self._model, self._ctx

    # -- model facts --

    def n_ctx(self) -> int:
        return self._parts()[1].n_ctx

    def n_vocab(self) -> int:
        return self._parts()[0].n_vocab

    def n_embd(self) -> int:
        return self._parts()[0].n_embd

    def token_bos(self) -> int:
        return self._parts()[0].token_bos

    def token_eos(self) -> int:
        return self._parts()[0].token_eos

    @property
    def n_tokens(self) -> int:
        """Tokens currently held in the context."""
        return len(self._tokens)

    def split_overlap_stats(self) -> dict[str, Any]:
        """What split overlap did: enabled, reason (why the lanes are off, or "on"), next_lane, and
        per lane [lane 0, lane 1]: ubatches, graph_builds, waits (on the other lane) and records."""
        return self._parts()[1].split_overlap_stats()

    @property
    def chat_template(self) -> ChatTemplate:
        """The template create_chat_completion renders: the one chosen with chat_format / chat_template, else
        the model's own (compiled now if it was not yet: ValueError when it is not valid Jinja, ImportError
        without Jinja2), else llama.cpp's chatml. render(messages) gives the prompt text."""
        if self._chat is None:
            self._chat = templates.model_template(self._parts()[0])
        return self._chat

    @property
    def model(self) -> _llama.Model:
        return self._parts()[0]

    @property
    def context(self) -> _llama.Context:
        return self._parts()[1]

    # -- text --

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._parts()[0].tokenize(text, add_special=add_bos, parse_special=special).tolist()

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return self._parts()[0].detokenize_bytes(list(tokens), unparse_special=special)

    # -- evaluation --

    def reset(self) -> None:
        """Forget everything in the context."""
        self._parts()[1].clear()
        self._tokens.clear()

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to the context; return their logits, shape (len(tokens), n_vocab)."""
        _, ctx = self._parts()
        tokens = [int(t) for t in tokens]
        if len(self._tokens) + len(tokens) > ctx.n_ctx:
            raise ContextFullError(f"{len(self._tokens)} cached + {len(tokens)} new tokens exceed "
                                   f"n_ctx={ctx.n_ctx}")
        logits = ctx.decode(tokens, all_logits=True)
        self._tokens.extend(tokens)
        return logits

    def _prefill(self, tokens: list[int]) -> int:
        """Bring the context to `tokens`, reusing the common cached prefix; the last token's logits stay in
        the context (output -1) for the sampler. Returns how many tokens were evaluated."""
        _, ctx = self._parts()
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) > ctx.n_ctx:
            raise ContextFullError(f"the prompt has {len(tokens)} tokens but n_ctx is {ctx.n_ctx}")
        keep = 0
        for a, b in zip(self._tokens, tokens):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(tokens) - 1)  # always evaluate at least one token to get logits
        if keep < len(self._tokens):
            try:
                ctx.truncate(keep)
                del self._tokens[keep:]
            except _llama.LlamaError:  # memories that cannot drop a suffix start over
                self.reset()
                keep = 0
        ctx.prefill(tokens[keep:])
        self._tokens.extend(tokens[keep:])
        return len(tokens) - keep

    def _seed(self, seed: int | None) -> int:
        """A call's seed: the one given, else the next from the Llama's generator (Llama(seed=...))."""
        if seed is None or seed == -1:
            return int(self._rng.integers(0, 2**32 - 1))
        return seed

    def sampler(self, *, seed: int | None = None, grammar: str | LlamaGrammar | None = None,
                **sampling: Any) -> _llama.Sampler:
        """A llama.cpp sampler chain for this model (SamplingParams' names; `temp` is an alias of
        `temperature`). The caller frees it, or lets it go."""
        model, ctx = self._parts()
        params = SamplingParams.from_kwargs(seed=self._seed(seed), **sampling)
        text, root = grammar_text(grammar)
        return _llama.Sampler(model, params, n_ctx=ctx.n_ctx, grammar=text, grammar_root=root)

    def generate(self, tokens: Sequence[int], *, max_tokens: int | None = None, seed: int | None = None,
                 stop_on_eog: bool = True, grammar: str | LlamaGrammar | None = None,
                 response_format: dict[str, Any] | None = None,
                 logits_processor: LogitsProcessor | None = None,
                 stopping_criteria: StoppingCriteria | None = None, **sampling: Any) -> Iterator[int]:
        """Yield new tokens after `tokens`. Sampling parameters by llama-cpp-python's names (SamplingParams:
        temperature/temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty, presence_penalty,
        penalty_last_n, mirostat_*, dry_*, xtc_*, top_n_sigma, logit_bias); temperature=0 is greedy. Stops at
        max_tokens (None, 0 or less: no limit, as in create_completion), the end of the context, or an
        end-of-generation token (which is not yielded).

        Each step decodes, samples and accepts in C with the GIL released; Python sees only token ids. A
        logits_processor(input_ids, scores) -> scores or stopping_criteria(input_ids, scores) -> bool is
        llama-cpp-python's slow path: the logits row of every step is copied into numpy for it.

        grammar (GBNF text or a LlamaGrammar) or response_format (create_completion's) constrain the tokens.
        """
        constraint = _constraint(grammar, response_format)
        for tok, _ in self._steps([int(t) for t in tokens], max_tokens_limit(max_tokens), seed, stop_on_eog, constraint, None,
                                  logits_processor, stopping_criteria, sampling):
            yield tok

    def _steps(self, tokens: list[int], max_tokens: int | None, seed: int | None, stop_on_eog: bool,
               grammar: str | LlamaGrammar | None, n_logprobs: int | None,
               logits_processor: LogitsProcessor | None, stopping_criteria: StoppingCriteria | None,
               sampling: dict[str, Any]) -> Iterator[tuple[int, tuple[float, list[tuple[int, float]]] | None]]:
        """(token, logprobs or None) per generated token: the one generation loop of Llama."""
        sampler = self.sampler(seed=seed, grammar=grammar, **sampling)  # bad parameters fail before any decode
        _llama.check_logprobs(n_logprobs)
        model, ctx = self._parts()
        slow = logits_processor is not None or stopping_criteria is not None
        if self.backend_sampling and n_logprobs is None and not slow:
            ctx.set_backend_sampler(0, sampler)  # llama.cpp may keep it on the CPU (split_mode="tensor")
        try:
            self._prefill(tokens)
            sampler.accept(tokens)  # penalties and DRY count the prompt, as in llama-cpp-python
            produced = 0
            tok = self._slow_sample(sampler, logits_processor) if slow else sampler.sample(ctx)
            while True:
                lp = None if n_logprobs is None else ctx.logprobs(tok, n_logprobs)
                if stop_on_eog and model.is_eog(tok):
                    return
                if stopping_criteria is not None and stopping_criteria(
                        np.array(self._tokens + [tok], dtype=np.intc), ctx.logits_view(-1)):
                    return
                yield tok, lp
                produced += 1
                if len(self._tokens) >= ctx.n_ctx or (max_tokens is not None and produced >= max_tokens):
                    return
                if slow:
                    ctx.prefill([tok])
                    self._tokens.append(tok)
                    tok = self._slow_sample(sampler, logits_processor)
                else:
                    nxt = ctx.decode_sample(sampler, tok)
                    self._tokens.append(tok)
                    tok = nxt
        finally:
            sampler.free()  # out of the graph too

    def _slow_sample(self, sampler: _llama.Sampler, logits_processor: LogitsProcessor | None) -> int:
        _, ctx = self._parts()
        if logits_processor is None:
            return sampler.sample(ctx)
        scores = logits_processor(np.array(self._tokens, dtype=np.intc), ctx.logits_view(-1).copy())
        return sampler.sample_logits(np.asarray(scores, dtype=np.float32))

    def create_completion(
        self,
        prompt: str | Sequence[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | Sequence[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: StoppingCriteria | None = None,
        logits_processor: LogitsProcessor | None = None,
        grammar: str | LlamaGrammar | None = None,
        logit_bias: dict[int, float] | None = None,
        *,
        response_format: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI-style text completion with llama-cpp-python's signature (positional order included).

        max_tokens None, 0 or less: up to the end of the context (llama-cpp-python's rule). logprobs=N (0..MAX_LOGPROBS): per generated
        token its text, offset, log-probability and the top N alternatives, in llama-cpp-python's format
        (log-softmax of the model's logits, computed in C). Further llama.cpp samplers by keyword
        (penalty_last_n, dry_*, xtc_*, top_n_sigma, min_keep). tfs_z is accepted and ignored (llama.cpp
        removed tail-free sampling); suffix is appended to the text; model names the response's model.

        Structured output: grammar= (GBNF text or a LlamaGrammar), or response_format=
        {"type": "json_object"} (any JSON object), {"type": "json_object", "schema": {...}} or
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (the schema through llama.cpp's
        JSON-schema-to-grammar converter), as llama-server reads it; one of the two at most. A grammar or
        schema that does not parse is a ValueError with llama.cpp's message. The grammar only allows what it
        describes: give max_tokens room for the text to end, or it is cut where max_tokens stops it.
        """
        if echo and logprobs is not None:
            raise ValueError("logprobs with echo=True (the prompt's log-probabilities) is not supported")
        sampling.update(temperature=temperature, top_p=top_p, min_p=min_p, typical_p=typical_p,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                        repeat_penalty=repeat_penalty, top_k=top_k, mirostat_mode=mirostat_mode,
                        mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logit_bias=logit_bias)
        SamplingParams.from_kwargs(**sampling)  # bad input fails here, also for a stream not yet iterated
        _llama.check_logprobs(logprobs)
        constraint = _constraint(grammar, response_format)
        if stream and constraint is not None:  # the stream's sampler is built at its first step
            _llama.check_grammar(self._parts()[0], constraint.grammar, constraint.root)
        # max_tokens checked now, not at the stream's first chunk
        chunks = self._completion(prompt, suffix, max_tokens_limit(max_tokens), logprobs, echo, stop, seed, model,
                                  stopping_criteria, logits_processor, constraint, sampling)
        if stream:
            return chunks
        text, finish, usage, cid, created, lps = "", None, {}, "", 0, None
        for chunk in chunks:
            cid, created = chunk["id"], chunk["created"]
            choice = chunk["choices"][0]
            text += choice["text"]
            finish = choice["finish_reason"] or finish
            usage = chunk.get("usage", usage)
            if choice["logprobs"] is not None:
                lps = {k: (lps[k] if lps else []) + v for k, v in choice["logprobs"].items()}
        if logprobs is not None and lps is None:
            lps = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
        return {"id": cid, "object": "text_completion", "created": created, "model": model or self.model_path,
                "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}], "usage": usage}

    __call__ = create_completion

    def _completion(self, prompt: str | Sequence[int], suffix: str | None, max_tokens: int | None,
                    n_logprobs: int | None, echo: bool, stop: str | Sequence[str] | None, seed: int | None,
                    model_name: str | None, stopping_criteria: StoppingCriteria | None,
                    logits_processor: LogitsProcessor | None, grammar: str | LlamaGrammar | None,
                    sampling: dict[str, Any]) -> Iterator[dict[str, Any]]:
        prompt_tokens = self.tokenize(prompt) if isinstance(prompt, (str, bytes)) else [int(t) for t in prompt]
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        prompt_len = len(prompt) if isinstance(prompt, str) else len(self.detokenize(prompt_tokens).decode("utf-8", "replace"))

        def chunk(text: str, finish: str | None, lps: dict[str, list[Any]] | None = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name or self.model_path,
                    "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}], **extra}

        if echo:
            yield chunk(self.detokenize(prompt_tokens).decode("utf-8", "replace"), None)
        text = TextStream(self.detokenize, stops)
        pending = LogprobRows(lambda tok: self.detokenize([tok]).decode("utf-8", "ignore"), prompt_len) \
            if n_logprobs is not None else None
        sent = 0
        for tok, lp in self._steps(prompt_tokens, max_tokens, seed, True, grammar, n_logprobs, logits_processor,
                                   stopping_criteria, sampling):
            if pending is not None:
                pending.add(tok, lp)
            ready = text.push(tok)
            if ready:
                sent += len(ready)
                rows = pending.take(sent) if pending is not None else []
                yield chunk(ready, None, completion_logprobs(rows) if rows else None)
            if text.stopped:
                break
        produced = text.tokens
        if text.stopped:
            finish = "stop"
        elif (max_tokens is not None and len(produced) >= max_tokens) or self.n_tokens >= self.n_ctx():
            finish = "length"
        else:
            finish = "stop"  # end-of-generation token
        tail = text.finish() + (suffix or "")
        usage = {"prompt_tokens": len(prompt_tokens), "completion_tokens": len(produced),
                 "total_tokens": len(prompt_tokens) + len(produced)}
        sent += len(tail)
        lps = completion_logprobs(pending.take(sent, final=True)) if pending is not None else None
        yield chunk(tail, finish, lps, usage=usage)

    def create_chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        functions: Sequence[Mapping[str, Any]] | None = None,
        function_call: str | Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI-style chat completion with llama-cpp-python's signature, defaults and result shapes.

        The messages (and tools / tool_choice, and functions / function_call as tools) go through the chat
        template (see the chat_template property); chat_template_kwargs are more variables for it. The
        prompt is tokenized with special tokens parsed, then generated from as create_completion does, with
        the template's stop strings (its end-of-turn text and the EOS token's text) added to `stop`.
        Returns a `chat.completion` dict, or with stream=True an iterator of `chat.completion.chunk` dicts
        whose contents concatenate to the same text. model: the name in the result (default: the path).

        Every sampling parameter, grammar, response_format and logprobs (top_logprobs alternatives) go to
        create_completion. A template that fails to render is a ValueError naming it.
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{i}] must be a mapping with a 'role' string, got {m!r}")
        if functions is not None or function_call is not None:
            legacy_tools, legacy_choice = chat_completion.tools_from_functions(functions, function_call)
            tools = tools if tools is not None else legacy_tools
            tool_choice = tool_choice if tool_choice is not None else legacy_choice
        if top_logprobs is not None and not logprobs:
            raise ValueError("top_logprobs needs logprobs=True")
        extra = dict(typical_p=typical_p, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                     repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                     mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logits_processor=logits_processor,
                     grammar=grammar, logit_bias=logit_bias, response_format=response_format,
                     logprobs=(top_logprobs or 0) if logprobs else None)
        template = self.chat_template
        prompt = template.render(messages, add_generation_prompt=True, tools=tools, tool_choice=tool_choice,
                                 **dict(chat_template_kwargs or {}))
        tokens = self.tokenize(prompt, add_bos=template.add_bos, special=True)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        out = self.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                     min_p=min_p, stop=stops + [s for s in template.stops if s not in stops],
                                     seed=seed, stream=stream, **extra)
        name = self.model_path if model is None else model
        if stream:
            return chat_completion.chat_chunks(out, name)  # type: ignore[arg-type]
        return chat_completion.chat_response(out, name)  # type: ignore[arg-type]
