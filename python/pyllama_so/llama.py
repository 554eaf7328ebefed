"""The high-level `Llama` class: a model and a context with llama-cpp-python's names.

    with Llama("model.gguf", split_mode="tensor") as llm:
        out = llm.create_completion("Hello", max_tokens=16)
"""

from __future__ import annotations

import functools
import math
import os
import time
import uuid
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pyllama_so import _llama, chat_completion
from pyllama_so import chat_template as templates
from pyllama_so._llama import ContextFullError, ModelLoadError, PromptTooLongError
from pyllama_so.chat_template import ChatTemplate
from pyllama_so.config import ContextParams, ModelParams, check_combination, create_context, load_model
from pyllama_so.embeddings import embed_tokens, embedding_sequences, normalize as normalize_embedding
from pyllama_so.grammar import LlamaGrammar, ToolCallGrammar, grammar_text, resolve_grammar
from pyllama_so.logprobs import (LogitsProcessor, LogprobRows, StoppingCriteria, completion_logprobs,
                                 prompt_logprob_rows)
from pyllama_so.prefix import common_prefix
from pyllama_so.sampling import SamplingParams
from pyllama_so.textstream import TextStream
from pyllama_so.tool_calls import ToolCallStream, finish_reason, parse_message, tool_chat, uses_tools

if TYPE_CHECKING:
    from pyllama_so.tokenizer import LlamaTokenizer

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
    if isinstance(grammar, ToolCallGrammar) and response_format is None:  # a chat with tools (_chat_with_tools)
        return grammar
    text, root = resolve_grammar(grammar, response_format)
    return None if text is None else LlamaGrammar(text, root)


def seed_in_use(seed: int | None) -> int:
    """The seed of a Llama's generator: the one given, or for None or -1 (random, as llama.cpp's
    LLAMA_DEFAULT_SEED) one drawn now, so that save_state() can say which seed a run used."""
    if seed is None or seed == -1:
        return int(np.random.default_rng().integers(0, 2**32 - 1))
    return int(seed)


class LlamaState:
    """A snapshot of a Llama (save_state / load_state), with llama-cpp-python's attributes: the tokens held
    (input_ids, n_tokens), their logits rows when the Llama keeps them (scores, logits_all=True; else 0
    rows), llama.cpp's context state (llama_state, llama_state_size bytes: KV cache, last logits) and the
    seed. rng_state is the Llama's random generator, so that sampling goes on exactly as after the save."""

    def __init__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single], n_tokens: int,
                 llama_state: bytes, llama_state_size: int, seed: int,
                 rng_state: dict[str, Any] | None = None) -> None:
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed
        self.rng_state = rng_state


class Llama:
    """A GGUF model and one context on it. Use as a context manager, or call close().

    n_ctx: llama.cpp rounds the context up to a multiple of 256 tokens, so it is at least 256
    (0: the model's training context); a request that changes is warned about (UserWarning), and
    n_ctx() is what the context holds.

    verbose: show llama.cpp's log from the info level on. False (the default) shows its error lines only,
    and none while the model loads or the context is made, as llama-cpp-python: a failed load's exception
    carries them. A level set with pyllama_so.set_log_level() before is kept: verbose=True only lowers it
    to info.

    split_overlap: with split_mode="tensor", consecutive ubatches alternate between two lanes (each
    with its own scheduler, streams, AllReduce context and compute buffers), so one ubatch's
    AllReduces run while the next ubatch computes. It helps prompt processing where the AllReduces
    take a noticeable share of the time; n_ubatch is the size of each lane's ubatch, by default half
    of n_batch (else 512, as llama.cpp), so that every batch feeds both lanes.
    The logits are bitwise identical to those without it. A decode call of one ubatch under 64 tokens
    (decoding) stays on lane 0. Each lane reserves its own compute buffers. Without split_mode="tensor" it is a
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
    As llama-cpp-python's Llama: vocab_only=True loads the vocabulary and metadata only (tokenize,
    detokenize, metadata; eval, generation and embeddings raise). kv_overrides replaces GGUF metadata
    values while loading (key -> bool/int/float/str). embedding=True makes embed() / create_embedding()
    work, with pooling_type ("none", "mean", "cls", "last", "rank", or llama.cpp's -1..4; None: the
    model's own, "none" when it has none); an embedding batch is one ubatch, so n_ubatch defaults to
    n_batch then. lora_path applies a LoRA adapter GGUF with lora_scale (lora_base is accepted and unused,
    as in llama-cpp-python; not under split_mode="tensor", whose Meta backend cannot split the adapter). logits_all=True keeps every evaluated token's logits row in scores /
    eval_logits (also during generation), as llama-cpp-python.

    The model and context arguments become pyllama_so.config's ModelParams and ContextParams (model_params,
    context_params), the objects the bench, the server and the perplexity tool make from their flags: the
    same rules and messages everywhere.
    """

    # defaults for close() and __del__ when __init__ never ran (a misspelled keyword)
    _model: _llama.Model | None = None
    _ctx: _llama.Context | None = None
    _lora: _llama.LoraAdapter | None = None
    _init_args: dict[str, Any] | None = None
    cache: Any = None  # set_cache()'s (a pyllama_so.cache.LlamaRAMCache), or None

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
        vocab_only: bool = False,
        kv_overrides: dict[str, bool | int | float | str] | None = None,
        embedding: bool = False,
        pooling_type: str | int | None = None,
        logits_all: bool = False,
        lora_path: str | os.PathLike[str] | None = None,
        lora_scale: float = 1.0,
        lora_base: str | None = None,
        verbose: bool = False,
    ) -> None:
        # what pickling gives back to __init__ (llama-cpp-python's __getstate__): the arguments, not the state
        self._init_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        path = Path(os.fspath(model_path))
        for name, flag in (("embedding", embedding), ("logits_all", logits_all)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool")
        model_params = ModelParams(n_gpu_layers=n_gpu_layers, split_mode=split_mode, main_gpu=main_gpu,
                                   tensor_split=tensor_split, attn_split=attn_split, rpc_servers=rpc_servers,
                                   use_mmap=use_mmap, vocab_only=vocab_only, kv_overrides=kv_overrides)
        if isinstance(lora_scale, bool) or not isinstance(lora_scale, (int, float)) or not math.isfinite(lora_scale):
            raise ValueError(f"lora_scale must be a finite number, got {lora_scale!r}")
        if vocab_only and lora_path is not None:
            raise ValueError("lora_path needs the model's weights, which vocab_only=True does not load")
        if lora_path is not None and model_params.split_mode == "tensor":  # ggml's Meta backend cannot split it
            raise ValueError('lora_path is not supported with split_mode="tensor": llama.cpp\'s tensor split cannot '
                             "split a LoRA adapter's tensors (it aborts); use split_mode=\"layer\"")
        if lora_path is not None and not Path(os.fspath(lora_path)).is_file():
            raise FileNotFoundError(f"LoRA adapter not found: {os.fspath(lora_path)}")
        cpus = os.cpu_count() or 1  # llama-cpp-python's defaults: half the CPUs for generation, all for batches
        context_params = ContextParams(
            n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads or max(cpus // 2, 1),
            n_threads_batch=n_threads_batch or cpus, flash_attn=flash_attn, type_k=type_k, type_v=type_v,
            split_overlap=split_overlap, embeddings=embedding, pooling_type=pooling_type,
            # embedding: one sequence per input of a batch, all sharing the KV cache (as llama-cpp-python)
            n_seq_max=embedding_sequences(n_batch, model_params.split_mode) if embedding else 1,
            kv_unified=embedding)
        check_combination(model_params, context_params)
        if chat_format is not None and chat_template is not None:
            raise ValueError("give chat_format or chat_template, not both: both choose the chat template")
        _check_gguf_file(path)

        self.model_path = str(path)
        self.model_params = model_params  # the configuration, checked (pyllama_so.config)
        self.context_params = context_params
        self.chat_format = chat_format
        self._chat: ChatTemplate | None = None  # the model's own is compiled at the first chat
        self.verbose = verbose
        self.split_overlap = split_overlap
        if not isinstance(backend_sampling, bool):
            raise TypeError("backend_sampling must be a bool")
        self.backend_sampling = backend_sampling
        self.vocab_only = vocab_only
        self.kv_overrides = kv_overrides
        self.embedding = embedding
        self.lora_path = None if lora_path is None else os.fspath(lora_path)
        self.lora_scale = float(lora_scale)
        self.lora_base = lora_base
        self._logits_all = logits_all
        self._seed_value = seed_in_use(seed)
        self._rng = np.random.default_rng(self._seed_value)
        self._tokens: list[int] = []  # what the KV cache holds, in order
        self._scores: np.ndarray | None = None  # logits_all: (n_ctx, n_vocab), rows [0, n_tokens) valid
        _llama.set_verbose(verbose)

        self._model = load_model(path, model_params)
        self.metadata: dict[str, str] = self._model.metadata()
        if vocab_only:
            return
        try:
            if chat_format is not None:  # before the context, whose KV cache may take long to allocate
                self._chat = templates.from_spec(self._model, chat_format, name="chat_format=")
            elif chat_template is not None:
                self._chat = templates.from_spec(self._model, chat_template, name="chat_template=")
            self._ctx = create_context(self._model, context_params)
            self._ctx.set_embeddings(False)  # generation outputs logits only; embed() turns embeddings on
            if self.lora_path is not None:
                self._lora = _llama.LoraAdapter(self._model, self.lora_path)
                _llama.set_lora_adapters(self._ctx, [(self._lora, self.lora_scale)])
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

    def __getstate__(self) -> dict[str, Any]:
        """llama-cpp-python's pickling: the constructor's arguments (a copy loads the model again; the KV cache
        and the tokens evaluated are not carried: save_state() / load_state() do that)."""
        if self._init_args is None:
            raise TypeError("a Llama whose __init__ did not run cannot be pickled")
        return dict(self._init_args)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, additional_files: Sequence[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """llama-cpp-python's: a Llama of the one GGUF file of Hugging Face repository repo_id whose path matches
        filename (a glob, e.g. "*Q4_K_M.gguf"), downloaded with huggingface_hub into its cache or local_dir,
        with the rest of its shards when it is a split model and the files matching additional_files; kwargs
        go to Llama(). ValueError when no file or several match; ImportError without huggingface_hub (the
        hub extra). local_dir_use_symlinks is accepted for llama-cpp-python's signature (huggingface_hub no
        longer has it)."""
        from pyllama_so import hub

        path = hub.download(repo_id, filename, additional_files=additional_files, local_dir=local_dir,
                            cache_dir=cache_dir)
        return cls(path, **kwargs)

    def close(self) -> None:
        """Free the context, then the LoRA adapter and the model. Idempotent."""
        if self._ctx is not None:
            self._ctx.free()
            self._ctx = None
        if self._lora is not None:
            self._lora.free()
            self._lora = None
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
        return self._model is None

    def _model_part(self) -> _llama.Model:
        if self._model is None:
            raise ValueError("this Llama is closed")
        return self._model

    def _parts(self) -> tuple[_llama.Model, _llama.Context]:
        model = self._model_part()
        if self._ctx is None:
            raise RuntimeError("this Llama was loaded with vocab_only=True: it has the vocabulary and metadata "
                               "but no weights, so only tokenize, detokenize and metadata work")
        return model, self._ctx

    def _generative(self) -> tuple[_llama.Model, _llama.Context]:
        model, ctx = self._parts()
        if not ctx.has_memory:
            raise RuntimeError(f"this model ({model.meta('general.architecture')}) keeps no KV cache: an "
                               "embedding-only architecture cannot evaluate or generate; use embed()")
        return model, ctx

    # -- model facts --

    def n_ctx(self) -> int:
        return self._parts()[1].n_ctx

    def n_vocab(self) -> int:
        return self._model_part().n_vocab

    def n_embd(self) -> int:
        return self._model_part().n_embd

    def token_bos(self) -> int:
        return self._model_part().token_bos

    def token_eos(self) -> int:
        return self._model_part().token_eos

    def token_nl(self) -> int:
        return self._model_part().token_nl

    def pooling_type(self) -> int:
        """llama.cpp's pooling type of the context (LLAMA_POOLING_TYPE_*: 0 none, 1 mean, 2 cls, 3 last,
        4 rank), an int as llama-cpp-python's pooling_type()."""
        return int(_llama.POOLING_TYPES[self._parts()[1].pooling_type])

    @property
    def n_tokens(self) -> int:
        """Tokens currently held in the context. Setting a smaller number drops the tokens after it (as
        llama-cpp-python's `llm.n_tokens = k` before an eval)."""
        return len(self._tokens)

    @n_tokens.setter
    def n_tokens(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= len(self._tokens):
            raise ValueError(f"n_tokens must be an int in [0, {len(self._tokens)}] (the tokens held), got {value!r}")
        if value == len(self._tokens):
            return
        _, ctx = self._parts()
        try:
            ctx.truncate(int(value))
            del self._tokens[int(value):]
        except _llama.LlamaError:  # memories that cannot drop a suffix start over
            self.reset()
            raise ValueError(f"this model's memory cannot keep only the first {value} tokens: the context "
                             "was cleared") from None

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        """The tokens held in the context (n_tokens of them), as llama-cpp-python's input_ids[:n_tokens]."""
        return np.array(self._tokens, dtype=np.intc)

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self._tokens, maxlen=self.n_ctx())

    def _scores_rows(self) -> np.ndarray:
        if not self._logits_all:
            raise RuntimeError("the logits of evaluated tokens are kept only with Llama(logits_all=True)")
        if self._scores is None:  # np.empty: the OS commits pages as rows are written
            self._scores = np.empty((self.n_ctx(), self.n_vocab()), dtype=np.single)
        return self._scores

    @property
    def scores(self) -> npt.NDArray[np.single]:
        """logits_all=True: the logits rows of the context's positions, shape (n_ctx, n_vocab); rows
        [0, n_tokens) are those of the tokens held (as llama-cpp-python's scores)."""
        return self._scores_rows()

    @property
    def eval_logits(self) -> deque[list[float]]:
        """logits_all=True: the logits row of each token held, as lists (llama-cpp-python's eval_logits)."""
        return deque(self._scores_rows()[: len(self._tokens)].tolist(), maxlen=self.n_ctx())

    def _keep_rows(self, start: int, rows: np.ndarray) -> None:
        """logits_all: store the logits rows of positions start, start + 1, ..."""
        if self._logits_all:
            self._scores_rows()[start:start + len(rows)] = rows

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
        """UTF-8 bytes (llama-cpp-python's type) or a str to token ids; add_bos adds the model's special
        tokens (BOS where the model wants one), special parses special-token text such as "<|im_end|>"."""
        return self._model_part().tokenize(text, add_special=add_bos, parse_special=special).tolist()

    def tokenizer(self) -> LlamaTokenizer:
        """llama-cpp-python's: this model's tokenizer as a LlamaTokenizer (encode / decode, tokenize / detokenize)."""
        from pyllama_so.tokenizer import LlamaTokenizer

        self._model_part()
        return LlamaTokenizer(self)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """Token ids to bytes as llama-cpp-python 0.3.x: each token's piece joined (special: also the text
        of special tokens), and one leading space dropped when the first token is BOS. prev_tokens is
        accepted and unused, as in llama-cpp-python's own tokenizer."""
        model = self._model_part()
        tokens = [int(t) for t in tokens]
        text = model.detokenize_pieces(tokens, special=special)
        if tokens and tokens[0] == model.token_bos and text.startswith(b" "):
            return text[1:]
        return text

    def _text(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """Completion text of tokens: llama_detokenize, as the server's (the same text for the same tokens)."""
        return self._model_part().detokenize_bytes(list(tokens), unparse_special=special)

    # -- seeds and state --

    def set_seed(self, seed: int) -> None:
        """Restart the generator that gives calls without a seed theirs, as Llama(seed=seed) does."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self._seed_value = seed_in_use(int(seed))
        self._rng = np.random.default_rng(self._seed_value)

    def set_cache(self, cache: Any) -> None:
        """llama-cpp-python's: completions start from the cached state (pyllama_so.cache.LlamaRAMCache) sharing
        the longest prefix with their prompt, where it is longer than what the context holds, and leave their
        own state in the cache; None turns it off."""
        self.cache = cache

    def save_state(self) -> LlamaState:
        """The context's state (llama_state_get_data) with the tokens, kept logits rows and seed."""
        _, ctx = self._generative()
        data = _llama.context_state(ctx)
        n = len(self._tokens)
        scores = (self._scores_rows()[:n].copy() if self._logits_all
                  else np.empty((0, self.n_vocab()), dtype=np.single))
        return LlamaState(input_ids=self.input_ids, scores=scores, n_tokens=n, llama_state=data,
                          llama_state_size=len(data), seed=self._seed_value,
                          rng_state=self._rng.bit_generator.state)

    def load_state(self, state: LlamaState) -> None:
        """Restore a save_state() of a Llama on the same model and context size (llama_state_set_data); a
        state that does not fit is a LlamaError and leaves the context empty."""
        _, ctx = self._generative()
        n = int(state.n_tokens)
        ids = np.asarray(state.input_ids).reshape(-1)
        if not 0 <= n <= min(len(ids), ctx.n_ctx):
            raise ValueError(f"state.n_tokens {n} does not fit its input_ids ({len(ids)}) or n_ctx ({ctx.n_ctx})")
        tokens = [int(t) for t in ids[:n]]
        if any(not 0 <= t < self.n_vocab() for t in tokens):
            raise ValueError(f"state.input_ids has token ids outside [0, {self.n_vocab()})")
        data = bytes(state.llama_state)[: int(state.llama_state_size)]
        try:
            _llama.set_context_state(ctx, data)
        except BaseException:
            self._tokens.clear()
            raise
        self._tokens = tokens
        rows = np.asarray(state.scores)
        if self._logits_all and rows.ndim == 2 and rows.shape[0] >= n and rows.shape[1] == self.n_vocab():
            self._keep_rows(0, rows[:n])
        self._seed_value = state.seed
        if getattr(state, "rng_state", None) is not None:
            self._rng.bit_generator.state = state.rng_state
        else:
            self._rng = np.random.default_rng(state.seed)

    # -- embeddings --

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """Embeddings as llama-cpp-python 0.3.x: per input a list of floats (pooled), or with pooling "none"
        a list per token; a list for a str input, a list of those for a list. normalize: divide each
        vector by its Euclidean norm (default off, as llama-cpp-python). truncate: cut an input to the
        batch limit (min(n_batch, n_ubatch, n_ctx) tokens), else such an input is a ValueError.
        return_count: also return the number of tokens embedded."""
        _, ctx = self._parts()
        if not self.embedding:
            raise RuntimeError("Llama.embed needs a Llama created with embedding=True")
        if isinstance(input, str):
            inputs = [input]
        elif isinstance(input, list) and all(isinstance(t, str) for t in input):
            inputs = input
        else:
            raise ValueError("input must be a str or a list of str")
        limit = min(ctx.n_batch, ctx.n_ubatch, ctx.n_ctx)
        tokens = [self.tokenize(text.encode("utf-8")) for text in inputs]
        if truncate:
            tokens = [t[:limit] for t in tokens]
        self._tokens.clear()  # embedding clears the KV cache
        arrays = embed_tokens(ctx, tokens)
        data = []
        for emb in arrays:
            if normalize:
                emb = np.stack([normalize_embedding(r) for r in emb]) if emb.ndim == 2 else normalize_embedding(emb)
            data.append(emb.tolist())
        output = data[0] if isinstance(input, str) else data
        if return_count:
            return output, sum(len(t) for t in tokens)
        return output

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """OpenAI's embedding response as llama-cpp-python builds it (embed() without normalisation)."""
        embeds, total = self.embed(input, return_count=True)
        if isinstance(input, str):
            embeds = [embeds]
        return {"object": "list",
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
                "model": model if model is not None else self.model_path,
                "usage": {"prompt_tokens": total, "total_tokens": total}}

    # -- evaluation --

    def reset(self) -> None:
        """Forget everything in the context."""
        self._parts()[1].clear()
        self._tokens.clear()

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to the context; return their logits, shape (len(tokens), n_vocab) (with
        logits_all=True also kept in scores)."""
        _, ctx = self._generative()
        tokens = [int(t) for t in tokens]
        if len(self._tokens) + len(tokens) > ctx.n_ctx:
            raise ContextFullError(f"{len(self._tokens)} cached + {len(tokens)} new tokens exceed "
                                   f"n_ctx={ctx.n_ctx}")
        logits = ctx.decode(tokens, all_logits=True)
        self._keep_rows(len(self._tokens), logits)
        self._tokens.extend(tokens)
        return logits

    def _prompt_context(self, tokens: list[int]) -> _llama.Context:
        """The generative context, once the prompt is known to be non-empty and to leave room for a token."""
        _, ctx = self._generative()
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) >= ctx.n_ctx:  # llama-cpp-python's check and words (a ValueError there)
            raise PromptTooLongError(f"Requested tokens ({len(tokens)}) exceed context window of {ctx.n_ctx}")
        return ctx

    def _at_context_end(self, ctx: _llama.Context) -> bool:
        """After a generated token (yielded, not yet decoded): prompt and completion fill the context, the most
        they may (llama-cpp-python's cap); the last token is never decoded."""
        return len(self._tokens) + 1 >= ctx.n_ctx

    def _piece(self, tok: int) -> str:
        """A token's text in a logprobs row (invalid UTF-8 dropped, as llama-cpp-python does)."""
        return self._text([tok]).decode("utf-8", "ignore")

    def _prefill(self, tokens: list[int]) -> int:
        """Bring the context to `tokens`, reusing the common cached prefix; the last token's logits stay in
        the context (output -1) for the sampler. Returns how many tokens were evaluated."""
        ctx = self._prompt_context(tokens)
        keep = min(common_prefix(self._tokens, tokens), len(tokens) - 1)  # always evaluate one token: its logits
        if keep < len(self._tokens):
            try:
                ctx.truncate(keep)
                del self._tokens[keep:]
            except _llama.LlamaError:  # memories that cannot drop a suffix start over
                self.reset()
                keep = 0
        if self._logits_all:  # every row, as llama-cpp-python's eval; the last stays for the sampler
            self._keep_rows(keep, ctx.decode(tokens[keep:], all_logits=True))
        else:
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
               sampling: dict[str, Any], prefilled: bool = False
               ) -> Iterator[tuple[int, tuple[float, list[tuple[int, float]]] | None]]:
        """(token, logprobs or None) per generated token: the one generation loop of Llama. prefilled: the
        context holds `tokens` already, the last one's logits its last output (_prompt_logprobs)."""
        sampler = self.sampler(seed=seed, grammar=grammar, **sampling)  # bad parameters fail before any decode
        _llama.check_logprobs(n_logprobs)
        model, ctx = self._parts()
        slow = logits_processor is not None or stopping_criteria is not None
        if self.backend_sampling and n_logprobs is None and not slow:
            ctx.set_backend_sampler(0, sampler)  # llama.cpp may keep it on the CPU (split_mode="tensor")
        try:
            if not prefilled:
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
                if self._at_context_end(ctx) or (max_tokens is not None and produced >= max_tokens):
                    return
                if slow:
                    ctx.prefill([tok])
                    self._tokens.append(tok)
                    tok = self._slow_sample(sampler, logits_processor)
                else:
                    nxt = ctx.decode_sample(sampler, tok)
                    self._tokens.append(tok)
                    tok = nxt
                if self._logits_all:  # the row of the token just decoded (the context's last output)
                    self._keep_rows(len(self._tokens) - 1, ctx.logits_view(-1)[None, :])
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
        (log-softmax of the model's logits, computed in C); with echo=True the prompt's tokens come first, each
        scored given the ones before it (a leading BOS left out, the first listed token's entries None, as
        there), the prompt then evaluated again from its start. Further llama.cpp samplers by keyword
        (penalty_last_n, dry_*, xtc_*, top_n_sigma, min_keep). tfs_z is accepted and ignored (llama.cpp
        removed tail-free sampling); suffix is appended to the text; model names the response's model.

        Structured output: grammar= (GBNF text or a LlamaGrammar), or response_format=
        {"type": "json_object"} (any JSON object), {"type": "json_object", "schema": {...}} or
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (the schema through llama.cpp's
        JSON-schema-to-grammar converter), as llama-server reads it; one of the two at most. A grammar or
        schema that does not parse is a ValueError with llama.cpp's message. The grammar only allows what it
        describes: give max_tokens room for the text to end, or it is cut where max_tokens stops it.
        """
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
        # special-token text (e.g. "<|im_start|>") is parsed, as llama-cpp-python and llama-server do
        prompt_tokens = (self.tokenize(prompt, special=True) if isinstance(prompt, (str, bytes))
                         else [int(t) for t in prompt])
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        prompt_len = len(prompt) if isinstance(prompt, str) else len(self._text(prompt_tokens).decode("utf-8", "replace"))

        def chunk(text: str, finish: str | None, lps: dict[str, list[Any]] | None = None, **extra: Any) -> dict[str, Any]:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name or self.model_path,
                    "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}], **extra}

        scored = echo and n_logprobs is not None
        if echo:
            lps = self._prompt_logprobs(prompt_tokens, n_logprobs) if scored else None
            yield chunk(self._text(prompt_tokens).decode("utf-8", "replace"), None, lps)
        if self.cache is not None and not scored:
            self._from_cache(prompt_tokens)
        # a tool call's output keeps special tokens' text: a format's markers may be such
        text = TextStream(functools.partial(self._text, special=isinstance(grammar, ToolCallGrammar)), stops)
        pending = LogprobRows(self._piece, prompt_len) \
            if n_logprobs is not None else None
        sent = 0
        for tok, lp in self._steps(prompt_tokens, max_tokens, seed, True, grammar, n_logprobs, logits_processor,
                                   stopping_criteria, sampling, prefilled=scored):
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
        elif (max_tokens is not None and len(produced) >= max_tokens) or self._at_context_end(self._parts()[1]):
            finish = "length"
        else:
            finish = "stop"  # end-of-generation token
        tail = text.finish() + (suffix or "")
        usage = {"prompt_tokens": len(prompt_tokens), "completion_tokens": len(produced),
                 "total_tokens": len(prompt_tokens) + len(produced)}
        sent += len(tail)
        lps = completion_logprobs(pending.take(sent, final=True)) if pending is not None else None
        if self.cache is not None:
            self.cache[self._tokens] = self.save_state()
        yield chunk(tail, finish, lps, usage=usage)

    def _prompt_logprobs(self, tokens: list[int], n_top: int) -> dict[str, list[Any]]:
        """echo=True with logprobs: the prompt evaluated from its start with an output at every token, each
        token scored from the row before it in C (Context.decode_logprobs), in llama-cpp-python's format."""
        ctx = self._prompt_context(tokens)
        self.reset()
        scored = ctx.decode_logprobs(tokens, n_top, rows=self._scores_rows()[:len(tokens)] if self._logits_all else None)
        self._tokens.extend(tokens)
        rows = prompt_logprob_rows(tokens, scored, self._piece, self.token_bos())
        return completion_logprobs(rows)

    def _from_cache(self, prompt_tokens: Sequence[int]) -> None:
        """Load the cached state sharing the longest prefix with prompt_tokens, if longer than the context's."""
        try:
            state = self.cache[prompt_tokens]
        except KeyError:
            return
        cached = common_prefix([int(t) for t in state.input_ids[: state.n_tokens]], prompt_tokens)
        if cached > common_prefix(self._tokens, prompt_tokens):
            self.load_state(state)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """llama-cpp-python's: create_chat_completion's answer as the openai package's ChatCompletion (an
        iterator of ChatCompletionChunk with stream=True). ImportError without the openai package."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package: pip install openai") from None
        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream"):
            return (ChatCompletionChunk(**chunk) for chunk in out)
        return ChatCompletion(**out)

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
        name = self.model_path if model is None else model
        if uses_tools(tools, tool_choice):
            if grammar is not None or response_format is not None:
                raise ValueError("grammar or response_format cannot go with tools")
            return self._chat_with_tools(template, messages, tools or [], tool_choice, chat_template_kwargs, name,
                                         max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                         min_p=min_p, stop=stop, seed=seed, stream=stream, extra=extra)
        prompt = template.render(messages, add_generation_prompt=True, tools=tools, tool_choice=tool_choice,
                                 **dict(chat_template_kwargs or {}))
        tokens = self.tokenize(prompt, add_bos=template.add_bos, special=True)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        out = self.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                     min_p=min_p, stop=stops + [s for s in template.stops if s not in stops],
                                     seed=seed, stream=stream, **extra)
        if stream:
            return chat_completion.chat_chunks(out, name)  # type: ignore[arg-type]
        return chat_completion.chat_response(out, name)  # type: ignore[arg-type]

    def _chat_with_tools(self, template: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                         tool_choice: Any, template_kwargs: Mapping[str, Any] | None, name: str, *,
                         max_tokens: int | None, temperature: float, top_p: float, top_k: int, min_p: float,
                         stop: str | Sequence[str] | None, seed: int | None, stream: bool,
                         extra: dict[str, Any]) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """create_chat_completion with tools, as llama-server's --jinja: llama.cpp's chat layer renders the
        messages and tools in the model's format, its grammar keeps a call well formed, and the text is parsed
        into the message's content and tool_calls (finish_reason "tool_calls"). A template that cannot express the
        tools is a UserWarning, or with a call required a ValueError (tool_calls.ToolChoiceError)."""
        text = getattr(template, "text", None)
        if text is None:
            raise ValueError(f"tools need a Jinja chat template; {template.name} (a llama.cpp built-in) cannot "
                             "render them (give chat_template= a Jinja text)")
        tc = tool_chat(self._parts()[0], text, [dict(m) for m in messages], tools, tool_choice,
                       template_kwargs=template_kwargs, template_name=template.name)
        if tc.warning:
            warnings.warn(tc.warning, UserWarning, stacklevel=3)
        # the chat layer takes the template's BOS off where the vocabulary adds one: the tokenizer adds it
        tokens = self.tokenize(tc.prompt, add_bos=True, special=True)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stops += [s for s in (*template.stops, *tc.stops) if s not in stops]
        grammar = ToolCallGrammar(tc.grammar) if tc.grammar else None
        out = self.create_completion(tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                     min_p=min_p, stop=stops, seed=seed, stream=stream, **{**extra, "grammar": grammar})
        if stream:
            return chat_completion.tool_call_chunks(chat_completion.chat_chunks(out, name),  # type: ignore[arg-type]
                                                    ToolCallStream(tc.parser))
        out = chat_completion.chat_response(out, name)  # type: ignore[arg-type]
        choice = out["choices"][0]
        choice["message"] = parse_message(tc.parser, choice["message"]["content"])
        choice["finish_reason"] = finish_reason("tool_calls" in choice["message"], choice["finish_reason"])
        return out
