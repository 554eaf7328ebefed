# cython: language_level=3, cdivision=True
"""Low-level bindings over llama.h. The user-facing API is pyllama_so.Llama (llama.py).

Every C call that can take long (model load, decode, quantization) runs with the GIL released. Return
codes of the C API are turned into Python exceptions in one place: _check_decode(), _null_check() and
_check_quantize() (_errors.pxi).

One .pxi per concept, included below in dependency order: errors and logging, devices, parameter rules,
quantization, chat templates, RPC, model, context, the decoding step (plan check, batch fill, run),
embeddings, state, LoRA adapters, grammar, sampler, AllReduce. Bounds and wraparound checks are
on, except on the per-token loops that turn them off themselves (with a comment saying why).
"""

cimport cython

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free, calloc, realloc
from libc.string cimport memcpy, memset, strlen, strncat, strncpy
from libc.stdio cimport fputs, fflush, stderr
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.bytes cimport PyBytes_FromStringAndSize

import math
import os

import numpy as np

__all__ = [
    "LlamaError", "ModelLoadError", "ContextFullError", "PromptTooLongError", "DecodeError",
    "Model", "Context", "devices", "backends", "system_info", "set_log_level", "upstream_version",
    "max_devices", "supports_gpu_offload", "SPLIT_MODES", "FLASH_ATTN", "CACHE_TYPES",
    "QuantizeError", "FTYPES", "quantize_model", "chat_apply_template", "chat_builtin_templates",
    "RPCConnectionError", "rpc_supported", "rpc_endpoints", "rpc_devices", "probe_rpc_server",
    "Sampler", "MAX_LOGPROBS", "check_logprobs", "check_grammar", "json_schema_to_grammar",
    "POOLING_TYPES", "pooling_type_name", "check_kv_overrides", "embed_sequences",
    "context_state", "set_context_state", "LoraAdapter", "set_lora_adapters", "max_parallel_sequences",
]


include "_errors.pxi"

llama_log_set(_log_callback, NULL)  # first, so that backend initialisation logs through it too
llama_backend_init()

include "_devices.pxi"
include "_params.pxi"
include "_quantize.pxi"
include "_chat.pxi"
include "_rpc.pxi"
include "_model.pxi"
include "_context.pxi"
include "_step.pxi"
include "_embeddings.pxi"
include "_state.pxi"
include "_lora.pxi"
include "_grammar.pxi"
include "_chat_tools.pxi"
include "_sampler.pxi"
include "_allreduce.pxi"
