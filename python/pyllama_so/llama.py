"""The high-level `Llama` class: a model and a context with llama-cpp-python's names.

    with Llama("model.gguf", split_mode="tensor") as llm:
        out = llm.create_completion("Hello", max_tokens=16)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pyllama_so import _llama, chat_template as templates
from pyllama_so.allreduce import AllReduceRouting, context_routing
from pyllama_so.chat_template import ChatTemplate
from pyllama_so.config import AllReduceParams, ContextParams, ModelParams, check_combination, create_context, load_model
from pyllama_so.embeddings import batch_limit, embed_tokens, embedding_inputs, embedding_lists, embedding_sequences
from pyllama_so.generation import chat, completion, responses, sampler as chains, sequence, state as states
from pyllama_so.generation.hooks import LogitsProcessor, StoppingCriteria
from pyllama_so.generation.limits import max_tokens_limit as max_tokens_limit  # the server's schemas import it here
from pyllama_so.generation.session import Logprobs, Session
from pyllama_so.generation.state import LlamaState as LlamaState  # its home is generation.state
from pyllama_so.generation.text import pieces_text
from pyllama_so.grammar import LlamaGrammar, grammar_text
from pyllama_so.model_files import check_gguf_file, check_lora
from pyllama_so.sampling import SamplingParams

if TYPE_CHECKING:
    from pyllama_so.tokenizer import LlamaTokenizer

class Llama:
    """A GGUF model and one context on it, with llama-cpp-python's API. Use as a context manager, or call close().

    n_ctx: llama.cpp rounds the context up to a multiple of 256 tokens (0: the model's training context); a
    request that changes is warned about (UserWarning), and n_ctx() is what the context holds.
    verbose: show llama.cpp's log from the info level on. False (the default) shows its error lines only, and none
    while the model loads or the context is made, as llama-cpp-python: a failed load's exception carries them. A
    level set with pyllama_so.set_log_level() before is kept: verbose=True only lowers it to info.
    split_overlap (split_mode="tensor" only, else a ValueError): consecutive ubatches alternate between two lanes,
    each with its own scheduler, streams, AllReduce context and compute buffers, so one ubatch's AllReduces run
    while the next computes; n_ubatch (each lane's ubatch) defaults to half of n_batch. The logits are bitwise the
    same; a decode of one ubatch under 64 tokens stays on lane 0. Where the library keeps the lanes off, a
    UserWarning says why; split_overlap_stats() tells what ran (docs/multi-gpu.md).
    allreduce (split_mode="tensor" only): this context's AllReduce settings (pyllama_so.allreduce.AllReduceParams);
    a knob left None takes its GGML_CUDA_AR_* variable, else the default; allreduce_routing() reports them.
    rpc_servers: devices of other machines through llama.cpp's RPC backend ("host:port" of each
    `python -m pyllama_so.rpc_server`, a list or a comma-separated string); they come first in tensor_split and
    main_gpu. One that cannot be reached is an RPCConnectionError before the model loads; one that goes away
    later makes the next eval or generation step raise it (docs/multi-gpu.md, "More than one machine").
    backend_sampling: the sampler chain runs inside the decode graph on the output device (llama.cpp's
    experimental backend sampling); greedy tokens are the same. llama.cpp keeps it on the CPU under
    split_mode="tensor", for a grammar, logprobs, logits processors and stopping criteria.
    chat_format / chat_template: the template of create_chat_completion; by default the model's own
    (tokenizer.chat_template, Jinja rendered by Jinja2 as llama-cpp-python and transformers do: the `chat` extra),
    else llama.cpp's "chatml". chat_format names one of llama.cpp's built-ins
    (pyllama_so.chat_template.builtin_names(); llama-cpp-python's "llama-2" and "llama-3" too),
    "chat_template.default" or "chat_template.NAME" (the model's tokenizer.chat_template.NAME); chat_template is
    a Jinja text or such a name. One given here is checked at once (ValueError); the model's own at the first chat.
    As llama-cpp-python's Llama: vocab_only=True loads the vocabulary and metadata only; kv_overrides replaces
    GGUF metadata values while loading (key -> bool/int/float/str); embedding=True makes embed() /
    create_embedding() work, with pooling_type ("none", "mean", "cls", "last", "rank", or -1..4; None: the
    model's own), n_ubatch then defaulting to n_batch (an embedding batch is one ubatch); lora_path applies a
    LoRA adapter GGUF with lora_scale (lora_base is unused; not under split_mode="tensor", whose Meta backend
    cannot split it); logits_all=True keeps every evaluated token's logits row in scores / eval_logits.

    The model and context arguments become pyllama_so.config's ModelParams and ContextParams (model_params,
    context_params), which the bench, the server and the perplexity tool make from their flags. Generation goes
    through pyllama_so.generation, the layer the server's engine uses too.
    """

    # defaults for close() and __del__ when __init__ never ran (a misspelled keyword)
    _model: _llama.Model | None = None
    _ctx: _llama.Context | None = None
    _lora: _llama.LoraAdapter | None = None
    _session: Session | None = None  # the context's sequence (none with vocab_only)
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
        allreduce: AllReduceParams | None = None,
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
        check_lora(lora_path, lora_scale, model_params)
        cpus = os.cpu_count() or 1  # llama-cpp-python's defaults: half the CPUs for generation, all for batches
        context_params = ContextParams(
            n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads or max(cpus // 2, 1),
            n_threads_batch=n_threads_batch or cpus, flash_attn=flash_attn, type_k=type_k, type_v=type_v,
            split_overlap=split_overlap, embeddings=embedding, pooling_type=pooling_type,
            # embedding: one sequence per input of a batch, all sharing the KV cache (as llama-cpp-python)
            n_seq_max=embedding_sequences(n_batch, model_params) if embedding else 1,
            kv_unified=embedding, allreduce=allreduce)
        check_combination(model_params, context_params)
        if chat_format is not None and chat_template is not None:
            raise ValueError("give chat_format or chat_template, not both: both choose the chat template")
        check_gguf_file(path)

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
        self._seeds = states.CallSeeds(seed)
        _llama.set_verbose(verbose)
        self._load(path, n_ctx, chat_template)

    def _load(self, path: Path, n_ctx: int, chat_template: str | None) -> None:
        """Load the model, then (unless vocab_only) the chosen chat template, the context and the LoRA adapter."""
        chat_format, split_overlap = self.chat_format, self.split_overlap
        self._model = load_model(path, self.model_params)
        self.metadata: dict[str, str] = self._model.metadata()
        if self.vocab_only:
            return
        try:
            if chat_format is not None:  # before the context, whose KV cache may take long to allocate
                self._chat = templates.from_spec(self._model, chat_format, name="chat_format=")
            elif chat_template is not None:
                self._chat = templates.from_spec(self._model, chat_template, name="chat_template=")
            self._ctx = create_context(self._model, self.context_params)
            self._session = Session(self._ctx, logits_all=self._logits_all, backend_sampling=self.backend_sampling)
            self._ctx.set_embeddings(False)  # generation outputs logits only; embed() turns embeddings on
            if self.lora_path is not None:
                self._lora = _llama.LoraAdapter(self._model, self.lora_path)
                _llama.set_lora_adapters(self._ctx, [(self._lora, self.lora_scale)])
        except BaseException:
            self.close()
            raise
        if n_ctx and self._ctx.n_ctx != n_ctx:
            warnings.warn(f"n_ctx={n_ctx} became {self._ctx.n_ctx}: llama.cpp rounds the context up to a "
                          "multiple of 256 tokens", UserWarning, stacklevel=3)
        if split_overlap:
            stats = self._ctx.split_overlap_stats()
            if not stats["enabled"]:  # llama.cpp logs it too, but the log may be hidden
                warnings.warn(f"split_overlap stays off: {stats['reason']}", UserWarning, stacklevel=3)

    # -- lifetime --

    def __getstate__(self) -> dict[str, Any]:
        """llama-cpp-python's pickling: the constructor's arguments (a copy loads the model again; the KV cache
        and the tokens evaluated are not carried: save_state() / load_state() do that)."""
        if self._init_args is None:
            raise TypeError("a Llama whose __init__ did not run cannot be pickled")
        return dict(self._init_args)

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)

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

    def _seq(self, generative: bool = True) -> Session:
        """The context's sequence, once the context is known to be there (and to keep a KV cache: generative)."""
        self._generative() if generative else self._parts()
        assert self._session is not None
        return self._session

    @property
    def _tokens(self) -> list[int]:
        """What the context's KV cache holds, in order."""
        return [] if self._session is None else self._session.tokens

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
        if sequence.cut(self._parts()[1], 0, self._tokens, int(value)) != value:  # the memory started over
            raise ValueError(f"this model's memory cannot keep only the first {value} tokens: the context "
                             "was cleared")

    @property
    def input_ids(self) -> npt.NDArray[np.intc]:
        """The tokens held in the context (n_tokens of them), as llama-cpp-python's input_ids[:n_tokens]."""
        return np.array(self._tokens, dtype=np.intc)

    @property
    def eval_tokens(self) -> deque[int]:
        return deque(self._tokens, maxlen=self.n_ctx())

    def _scores_rows(self) -> np.ndarray:
        return self._seq(generative=False).scores_rows()

    @property
    def scores(self) -> npt.NDArray[np.single]:
        """logits_all=True: the logits rows of the context's positions, shape (n_ctx, n_vocab); rows
        [0, n_tokens) are those of the tokens held (as llama-cpp-python's scores)."""
        return self._scores_rows()

    @property
    def eval_logits(self) -> deque[list[float]]:
        """logits_all=True: the logits row of each token held, as lists (llama-cpp-python's eval_logits)."""
        return deque(self._scores_rows()[: len(self._tokens)].tolist(), maxlen=self.n_ctx())

    def split_overlap_stats(self) -> dict[str, Any]:
        """What split overlap did: enabled, reason (why the lanes are off, or "on"), next_lane, and
        per lane [lane 0, lane 1]: ubatches, graph_builds, waits (on the other lane) and records."""
        return self._parts()[1].split_overlap_stats()

    def allreduce_routing(self) -> AllReduceRouting:
        """This context's AllReduce settings in effect and its own reductions per path (comm_contexts 0 without
        split_mode="tensor")."""
        return context_routing(self._parts()[1])

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
        return pieces_text(self._model_part(), [int(t) for t in tokens], special)

    # -- seeds and state --

    def set_seed(self, seed: int) -> None:
        """Restart the generator that gives calls without a seed theirs, as Llama(seed=seed) does."""
        self._seeds.restart(seed)

    def set_cache(self, cache: Any) -> None:
        """llama-cpp-python's: completions start from the cached state (pyllama_so.cache.LlamaRAMCache) sharing
        the longest prefix with their prompt, where it is longer than what the context holds, and leave their
        own state in the cache; None turns it off."""
        self.cache = cache

    def save_state(self) -> LlamaState:
        """The context's state (llama_state_get_data) with the tokens, kept logits rows and seed."""
        return states.save(self._seq(), self._seeds)

    def load_state(self, state: LlamaState) -> None:
        """Restore a save_state() of a Llama on the same model and context size (llama_state_set_data); a
        state that does not fit is a LlamaError and leaves the context empty."""
        states.load(self._seq(), self._seeds, state)

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
        tokens = [self.tokenize(text.encode("utf-8")) for text in embedding_inputs(input)]
        if truncate:
            tokens = [t[:batch_limit(ctx)] for t in tokens]
        self._tokens.clear()  # embedding clears the KV cache
        data = embedding_lists(embed_tokens(ctx, tokens), normalize)
        output = data[0] if isinstance(input, str) else data
        return (output, sum(len(t) for t in tokens)) if return_count else output

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """OpenAI's embedding response as llama-cpp-python builds it (embed() without normalisation)."""
        embeds, total = self.embed(input, return_count=True)
        return responses.embedding_response([embeds] if isinstance(input, str) else embeds, total,
                                            model if model is not None else self.model_path)

    # -- evaluation --

    def reset(self) -> None:
        """Forget everything in the context."""
        self._seq(generative=False).clear()

    def eval(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to the context; return their logits, shape (len(tokens), n_vocab) (with
        logits_all=True also kept in scores)."""
        return self._seq().eval([int(t) for t in tokens])

    def _prefill(self, tokens: list[int]) -> int:
        """Bring the context to `tokens` (Session.prefill); returns how many tokens were evaluated."""
        return self._seq().prefill(tokens)

    def sampler(self, *, seed: int | None = None, grammar: str | LlamaGrammar | None = None,
                **sampling: Any) -> _llama.Sampler:
        """A llama.cpp sampler chain for this model (SamplingParams' names; `temp` is an alias of
        `temperature`). The caller frees it, or lets it go."""
        return self._chain(SamplingParams.from_kwargs(**sampling), seed, grammar)

    def _chain(self, params: SamplingParams, seed: int | None, grammar: str | LlamaGrammar | None) -> _llama.Sampler:
        """The sampler chain of a call's checked params, seeded with the call's seed (CallSeeds.for_call)."""
        model, ctx = self._parts()
        text, root = grammar_text(grammar)
        return chains.new_sampler(model, dataclasses.replace(params, seed=self._seeds.for_call(seed)), n_ctx=ctx.n_ctx,
                                  grammar=text, grammar_root=root)

    def generate(self, tokens: Sequence[int], *, max_tokens: int | None = None, seed: int | None = None,
                 stop_on_eog: bool = True, grammar: str | LlamaGrammar | None = None,
                 response_format: dict[str, Any] | None = None,
                 logits_processor: LogitsProcessor | None = None,
                 stopping_criteria: StoppingCriteria | None = None, **sampling: Any) -> Iterator[int]:
        """Yield new tokens after `tokens`. Sampling parameters by llama-cpp-python's names (SamplingParams:
        temperature/temp, top_k, top_p, min_p, typical_p, repeat_penalty, frequency_penalty, presence_penalty,
        penalty_last_n, mirostat_*, dry_*, xtc_*, top_n_sigma, logit_bias); temperature=0 is greedy. Stops at
        max_tokens (None, 0 or less: no limit, as in create_completion), the end of the context, or an
        end-of-generation token (which is not yielded). grammar (GBNF text or a LlamaGrammar) or response_format
        (create_completion's) constrain the tokens.

        Each step decodes, samples and accepts in C with the GIL released; Python sees only token ids. A
        logits_processor(input_ids, scores) -> scores or stopping_criteria(input_ids, scores) -> bool is
        llama-cpp-python's slow path: the logits row of every step is copied into numpy for it."""
        constraint = completion.constraint(grammar, response_format)
        params = SamplingParams.from_kwargs(**sampling)
        for tok, _ in self._steps([int(t) for t in tokens], max_tokens_limit(max_tokens), seed, stop_on_eog, constraint,
                                  None, logits_processor, stopping_criteria, params):
            yield tok

    def _steps(self, tokens: list[int], max_tokens: int | None, seed: int | None, stop_on_eog: bool,
               grammar: str | LlamaGrammar | None, n_logprobs: int | None,
               logits_processor: LogitsProcessor | None, stopping_criteria: StoppingCriteria | None,
               params: SamplingParams, prefilled: bool = False
               ) -> Iterator[tuple[int, Logprobs | None]]:
        """(token, logprobs or None) per generated token: the one generation loop of Llama, with the call's one
        sampler chain. prefilled: the context holds `tokens` already, the last one's logits its last output
        (_prompt_logprobs)."""
        sampler = self._chain(params, seed, grammar)  # bad parameters fail before any decode
        _llama.check_logprobs(n_logprobs)
        seq = self._seq(generative=False)
        seq.use_backend(sampler, n_logprobs, logits_processor is not None or stopping_criteria is not None)
        try:
            if not prefilled:
                self._prefill(tokens)
            yield from seq.steps(tokens, sampler, max_tokens, stop_on_eog, n_logprobs, logits_processor,
                                 stopping_criteria)
        finally:
            sampler.free()  # out of the graph too

    def create_completion(  # llama-cpp-python's signature, positional order included
        self, prompt: str | Sequence[int], suffix: str | None = None, max_tokens: int | None = 16,
        temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
        logprobs: int | None = None, echo: bool = False, stop: str | Sequence[str] | None = None,
        frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
        stream: bool = False, seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
        mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
        stopping_criteria: StoppingCriteria | None = None, logits_processor: LogitsProcessor | None = None,
        grammar: str | LlamaGrammar | None = None, logit_bias: dict[int, float] | None = None, *,
        response_format: dict[str, Any] | None = None, **sampling: Any,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """OpenAI-style text completion with llama-cpp-python's signature, defaults and result shapes.

        max_tokens None, 0 or less: up to the end of the context (llama-cpp-python's rule). logprobs=N
        (0..MAX_LOGPROBS): per generated token its text, offset, log-probability and the top N alternatives, in
        llama-cpp-python's format (log-softmax of the model's logits, computed in C); with echo=True the prompt's
        tokens come first, each scored given the ones before it (a leading BOS left out, the first listed token's
        entries None, as there), the prompt then evaluated again from its start. Further llama.cpp samplers by
        keyword (penalty_last_n, dry_*, xtc_*, top_n_sigma, min_keep). tfs_z is accepted and ignored (llama.cpp
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
        return completion.create(self, prompt, suffix, max_tokens, logprobs, echo, stop, seed, model, stopping_criteria,
                                 logits_processor, grammar, response_format, stream, sampling)

    __call__ = create_completion

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """llama-cpp-python's: create_chat_completion's answer as the openai package's ChatCompletion (an
        iterator of ChatCompletionChunk with stream=True). ImportError without the openai package."""
        types = responses.openai_chat_types()
        out = self.create_chat_completion(*args, **kwargs)
        return responses.as_openai(out, types, bool(kwargs.get("stream")))

    def create_chat_completion(  # llama-cpp-python's signature, positional order included
        self, messages: Sequence[Mapping[str, Any]], functions: Sequence[Mapping[str, Any]] | None = None,
        function_call: str | Mapping[str, Any] | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None, temperature: float = 0.2, top_p: float = 0.95,
        top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
        stop: str | Sequence[str] | None = None, seed: int | None = None,
        response_format: Mapping[str, Any] | None = None, max_tokens: int | None = None,
        presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
        tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
        model: str | None = None, logits_processor: Any = None, grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None, logprobs: bool | None = None, top_logprobs: int | None = None,
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
        extra = dict(typical_p=typical_p, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                     repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                     mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, logits_processor=logits_processor,
                     logit_bias=logit_bias)
        return chat.chat_completion(self, messages, functions, function_call, tools, tool_choice, chat_template_kwargs,
                                    model, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                    min_p=min_p, stop=stop, seed=seed, stream=stream, grammar=grammar,
                                    response_format=response_format, logprobs=logprobs, top_logprobs=top_logprobs,
                                    extra=extra)
