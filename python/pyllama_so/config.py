"""One configuration for every entry point: the model and context parameters, checked once.

`Llama(...)` builds them from its keyword arguments; the bench, the server and the perplexity tool
from their flags (`pyllama_so.args.model_params` / `context_params`). `load_model` and `create_context`
turn them into the bindings' `Model` and `Context`:

    model_params = ModelParams(split_mode="tensor", tensor_split=(1, 1))
    context_params = ContextParams(n_ctx=4096, split_overlap=True)
    check_combination(model_params, context_params)
    model = load_model("model.gguf", model_params)
    ctx = create_context(model, context_params)

Making a parameter object checks it, and every field is left in one spelling (names for llama.cpp's
enums, tuples for lists), so an object that exists is valid. A bad value of one parameter is a
ParamError (a ValueError; `param` names the parameter, as the message does), a wrong type a TypeError;
a rule between parameters is a ValueError naming both (TensorSplitOnlyError for attn_split and
split_overlap without split_mode="tensor", n_ubatch > n_batch). The command-line tools report a
ParamError as argparse reports a bad flag value, and the others as `tool: error: message`.

The value rules themselves live in the bindings (`_params.pxi`: `split_mode_name`, `check_tensor_split`,
`check_tensor_split_only`, `check_batch_sizes`, ...), which the low-level `Model.load` / `Context` apply
too; this module composes them, in the order that gives the right error first.

A context's AllReduce settings (`ContextParams.allreduce`, an `AllReduceParams`) go to that context's
comm contexts alone; a knob left None takes its environment variable (GGML_CUDA_AR_*: the command line's
setting), else the built-in default (docs/multi-gpu.md).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyllama_so import _llama
from pyllama_so._llama import TensorSplitOnlyError

__all__ = [
    "ModelParams",
    "ContextParams",
    "AllReduceParams",
    "ParamError",
    "TensorSplitOnlyError",
    "check_combination",
    "load_model",
    "create_context",
]

KvValue = bool | int | float | str


class ParamError(ValueError):
    """A value of one parameter that the configuration refuses; param names it, as the message does.
    (Rules between parameters raise other ValueErrors: TensorSplitOnlyError, n_ubatch > n_batch.)"""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _checked(param: str, check: Callable[..., Any], *args: Any) -> Any:
    """check(*args), its ValueError raised as a ParamError of param (the message, after "param: " where it
    does not name the parameter)."""
    try:
        return check(*args)
    except ParamError:
        raise
    except ValueError as e:
        message = str(e)
        raise ParamError(param, message if param in message else f"{param}: {message}") from None


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # a frozen dataclass normalising its own fields


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool")


def _int(obj: object, name: str) -> int:
    """The field as an int (numpy integers too), set back as one; TypeError for anything else."""
    value = getattr(obj, name)
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    _set(obj, name, number)
    return number


@dataclass(frozen=True)
class ModelParams:
    """How to load a model (llama_model_params): where its layers go and what the loader overrides.

    split_mode: "none", "layer", "row" or "tensor" (or llama.cpp's 0..3). tensor_split: proportions per
    device, at most one entry per device (the GPUs; with rpc_servers, llama.cpp's maximum here and the
    real count when the servers are reached). attn_split: split_mode="tensor" only, the attention heads'
    and KV cache's proportions per device (None follows tensor_split). main_gpu: the GPU of split_mode
    "none" (checked against the GPUs there are, when there are any). rpc_servers: "host:port" list or
    comma-separated string; their devices come first. vocab_only: the vocabulary and metadata only.
    kv_overrides: GGUF metadata key -> bool/int/float/str (a dict is accepted and kept as pairs).
    """

    n_gpu_layers: int = -1
    split_mode: str | int = "layer"
    main_gpu: int = 0
    tensor_split: Sequence[float] | None = None
    attn_split: Sequence[float] | None = None
    rpc_servers: str | Sequence[str] | None = None
    use_mmap: bool = True
    vocab_only: bool = False
    kv_overrides: Mapping[str, KvValue] | Sequence[tuple[str, KvValue]] | None = None

    def __post_init__(self) -> None:
        _int(self, "n_gpu_layers")
        _int(self, "main_gpu")
        _check_bool("use_mmap", self.use_mmap)
        _check_bool("vocab_only", self.vocab_only)
        mode = _checked("split_mode", _llama.split_mode_name, self.split_mode)
        _set(self, "split_mode", mode)
        if self.kv_overrides is not None:
            pairs = self.kv_overrides.items() if isinstance(self.kv_overrides, Mapping) else self.kv_overrides
            checked = _checked("kv_overrides", _llama.check_kv_overrides, dict(pairs))
            _set(self, "kv_overrides", tuple((key, value) for key, _, value in checked))
        if self.rpc_servers is not None:
            _set(self, "rpc_servers", tuple(_checked("rpc_servers", _llama.rpc_endpoints, self.rpc_servers)))
        if self.attn_split is not None:  # the split mode first: no length makes it right
            _llama.check_tensor_split_only("attn_split", mode)
        # with RPC servers the device count is known once connected: Model.load checks the lengths then
        n_devices = None if self.rpc_servers is None else _llama.max_devices()
        if self.tensor_split is not None:
            _set(self, "tensor_split", tuple(_checked("tensor_split", _llama.check_tensor_split, self.tensor_split,
                                                      n_devices)))
        if self.attn_split is not None:
            _set(self, "attn_split", tuple(_checked("attn_split", _llama.check_attn_split, self.attn_split,
                                                    n_devices)))
        n_gpus = _llama.gpu_device_count()
        if n_gpus and self.rpc_servers is None:  # with RPC servers Model.load checks it against their devices too
            _checked("main_gpu", _llama.check_main_gpu, self.main_gpu, n_gpus)

    @property
    def kv_overrides_dict(self) -> dict[str, KvValue] | None:
        return None if self.kv_overrides is None else dict(self.kv_overrides)


ENV_CE = "GGML_CUDA_AR_CE"
ENV_CE_MIN_BYTES = "GGML_CUDA_AR_CE_MIN_BYTES"
ENV_CE_CHUNK_BYTES = "GGML_CUDA_AR_CE_CHUNK_BYTES"
ENV_LL_MAX_BYTES = "GGML_CUDA_AR_LL_MAX_BYTES"
_AR_LIMITS = _llama.ALLREDUCE_LIMITS  # as the C side checks them
CHUNK_BYTES_RANGE = (_AR_LIMITS["chunk_bytes_min"], _AR_LIMITS["chunk_bytes_max"])
LL_MAX_BYTES_LIMIT = _AR_LIMITS["ll_max_bytes_limit"]


@dataclass(frozen=True)
class AllReduceParams:
    """The AllReduce knobs of one context's comm contexts (split_mode="tensor"), checked (ParamError naming the
    knob, TypeError for a wrong type). A knob left None takes its environment variable (environment() names
    them), else the built-in default.

    copy_engines: None = automatic (copy engines for large reductions between GPUs without peer
        access), True = force them even with peer access, False = never (upstream routing).
    min_bytes: smallest reduction (bytes of the F32 tensor) that goes to the copy engines; default
        512 KiB; 1 = every reduction.
    chunk_bytes: bytes per copy-engine copy, a power of two from 64 KiB to 4 MiB; default automatic
        (1 MiB below 8 MiB of BF16 payload, 2 MiB from there). Smaller chunks start the receiving
        copies sooner but each copy has a fixed cost.
    ll_max_bytes: largest reduction (bytes of the F32 tensor) for the low-latency path, where the copy
        engines are on; default 64 KiB; 0 = never (the internal pipeline takes them); at most 4 MiB.
    """

    copy_engines: bool | None = None
    min_bytes: int | None = None
    chunk_bytes: int | None = None
    ll_max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.copy_engines is not None and not isinstance(self.copy_engines, bool):
            raise TypeError(f"copy_engines must be bool or None, not {type(self.copy_engines).__name__}")
        for name in ("min_bytes", "chunk_bytes", "ll_max_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be int or None, not {type(value).__name__}")
        if self.ll_max_bytes is not None and not 0 <= self.ll_max_bytes <= LL_MAX_BYTES_LIMIT:
            raise ParamError("ll_max_bytes",
                             f"ll_max_bytes must be from 0 to {LL_MAX_BYTES_LIMIT}, got {self.ll_max_bytes}")
        if self.min_bytes is not None and self.min_bytes < 1:
            raise ParamError("min_bytes", f"min_bytes must be >= 1, got {self.min_bytes}")
        if self.chunk_bytes is not None:
            lo, hi = CHUNK_BYTES_RANGE
            if not lo <= self.chunk_bytes <= hi or self.chunk_bytes & (self.chunk_bytes - 1):
                raise ParamError("chunk_bytes",
                                 f"chunk_bytes must be a power of two from {lo} to {hi}, got {self.chunk_bytes}")

    def environment(self) -> dict[str, str | None]:
        """The variables that say this, e.g. for a child process (None: left to the default)."""
        return {
            ENV_CE: None if self.copy_engines is None else ("1" if self.copy_engines else "0"),
            ENV_CE_MIN_BYTES: None if self.min_bytes is None else str(self.min_bytes),
            ENV_CE_CHUNK_BYTES: None if self.chunk_bytes is None else str(self.chunk_bytes),
            ENV_LL_MAX_BYTES: None if self.ll_max_bytes is None else str(self.ll_max_bytes),
        }


@dataclass(frozen=True)
class ContextParams:
    """How to make a context on a model (llama_context_params).

    n_ctx: KV cache tokens of all sequences (0: the model's training context; llama.cpp rounds up to a
    multiple of 256). n_batch: most tokens per llama_decode call; n_ubatch: most per ubatch, None for the
    default: n_batch with embeddings (llama.cpp pools each ubatch on its own, so an embedding batch is one
    ubatch), else 512, or half of n_batch with split_overlap (_llama.default_n_ubatch). n_seq_max:
    sequences. n_threads / n_threads_batch: <= 0 for llama.cpp's default (n_threads_batch: n_threads).
    flash_attn: "auto", "on", "off" (or a bool, None, 0/1). type_k / type_v: KV cache types ("f16", "q8_0",
    ... or a ggml type id). split_overlap: two lanes for prompt ubatches (split_mode="tensor" only:
    check_combination). embeddings / pooling_type (a name, llama.cpp's -1..4, None for the model's) /
    kv_unified: an embedding context. allreduce: this context's AllReduce settings (split_mode="tensor" only:
    check_combination), None for every knob's default.
    """

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int | None = None
    n_seq_max: int = 1
    n_threads: int = -1
    n_threads_batch: int = -1
    flash_attn: str | bool | None = "auto"
    type_k: str | int = "f16"
    type_v: str | int = "f16"
    split_overlap: bool = False
    embeddings: bool = False
    pooling_type: str | int | None = "unspecified"
    kv_unified: bool = False
    offload_kqv: bool = True
    op_offload: bool = True
    allreduce: AllReduceParams | None = None

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_seq_max", "n_threads", "n_threads_batch"):
            _int(self, name)
        for name in ("split_overlap", "embeddings", "kv_unified", "offload_kqv", "op_offload"):
            _check_bool(name, getattr(self, name))
        _set(self, "pooling_type", _checked("pooling_type", _llama.pooling_type_name, self.pooling_type))
        _set(self, "flash_attn", _checked("flash_attn", _llama.flash_attn_name, self.flash_attn))
        _set(self, "type_k", _checked("type_k", _llama.cache_type_name, self.type_k, "type_k"))
        _set(self, "type_v", _checked("type_v", _llama.cache_type_name, self.type_v, "type_v"))
        if self.n_ctx < 0:
            raise ParamError("n_ctx", f"n_ctx must be >= 0 (0 = the model's training context), got {self.n_ctx}")
        if self.n_ubatch is None:
            _set(self, "n_ubatch", self.n_batch if self.embeddings
                 else _llama.default_n_ubatch(self.n_batch, self.split_overlap))
        _llama.check_batch_sizes(self.n_batch, _int(self, "n_ubatch"))
        if self.n_seq_max < 1:
            raise ParamError("n_seq_max", f"n_seq_max must be >= 1, got {self.n_seq_max}")
        if self.allreduce is not None and not isinstance(self.allreduce, AllReduceParams):
            raise TypeError(f"allreduce must be an AllReduceParams or None, not {type(self.allreduce).__name__}")


def check_combination(model: ModelParams, context: ContextParams) -> None:
    """The rules between a model's and a context's parameters: split_overlap and allreduce need
    split_mode="tensor" (TensorSplitOnlyError, a ValueError)."""
    if context.split_overlap:
        _llama.check_tensor_split_only("split_overlap", model.split_mode)
    if context.allreduce is not None:
        _llama.check_tensor_split_only("allreduce", model.split_mode)


def load_model(path: str | os.PathLike[str], params: ModelParams, *,
               progress: Callable[[float], bool] | None = None) -> _llama.Model:
    """Load a GGUF file with these parameters (ModelLoadError when llama.cpp cannot; the caller checks that
    the file exists, with its own wording)."""
    return _llama.Model.load(os.fspath(path), n_gpu_layers=params.n_gpu_layers, split_mode=params.split_mode,
                             main_gpu=params.main_gpu, tensor_split=_list(params.tensor_split),
                             attn_split=_list(params.attn_split), rpc_servers=_list(params.rpc_servers),
                             use_mmap=params.use_mmap, vocab_only=params.vocab_only,
                             kv_overrides=params.kv_overrides_dict, progress=progress)


def create_context(model: _llama.Model, params: ContextParams) -> _llama.Context:
    """A context on a loaded model. pooling_type="rank" on an embedding context needs a model that pools
    with "rank" (ValueError)."""
    if params.embeddings and params.pooling_type == "rank" and model.pooling_type != "rank":
        raise ValueError('pooling_type="rank" needs a reranking model (one whose GGUF pools with "rank" '
                         f"through a classifier head); this model pools with {model.pooling_type!r}")
    assert params.n_ubatch is not None  # None given becomes the default in ContextParams.__post_init__
    return _llama.Context(model, n_ctx=params.n_ctx, n_batch=params.n_batch, n_ubatch=params.n_ubatch,
                          n_seq_max=params.n_seq_max, n_threads=params.n_threads,
                          n_threads_batch=params.n_threads_batch, flash_attn=params.flash_attn,
                          type_k=params.type_k, type_v=params.type_v, offload_kqv=params.offload_kqv,
                          op_offload=params.op_offload, split_overlap=params.split_overlap,
                          embeddings=params.embeddings, pooling_type=params.pooling_type,
                          kv_unified=params.kv_unified, allreduce=params.allreduce)


def _list(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)
