"""pyllama_so: llama.cpp tensor-parallel inference on two GPUs, driven from Python."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _pkg_version
from typing import Any

from pyllama_so._llama import (
    ContextFullError,
    DecodeError,
    LlamaError,
    ModelLoadError,
    PromptTooLongError,
    QuantizeError,
    RPCConnectionError,
    backends,
    cpu_virtual_devices,
    devices,
    json_schema_to_grammar,
    set_log_level,
    system_info,
    upstream_version,
)
from pyllama_so.cache import LlamaCache, LlamaRAMCache
from pyllama_so.generation.hooks import LogitsProcessorList, StoppingCriteriaList
from pyllama_so.grammar import LlamaGrammar
from pyllama_so.llama import Llama, LlamaState
from pyllama_so.sampling import SamplingParams
from pyllama_so.tokenizer import LlamaTokenizer

try:
    __version__ = _pkg_version("pyllama_so")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Llama",
    "LlamaState",
    "LlamaGrammar",
    "LlamaTokenizer",
    "LlamaCache",
    "LlamaRAMCache",
    "LogitsProcessorList",
    "SamplingParams",
    "StoppingCriteriaList",
    "LlamaError",
    "ModelLoadError",
    "ContextFullError",
    "PromptTooLongError",
    "DecodeError",
    "QuantizeError",
    "RPCConnectionError",
    "backends",
    "cpu_virtual_devices",
    "devices",
    "json_schema_to_grammar",
    "set_log_level",
    "system_info",
    "upstream_version",
    "build_info",
    "__version__",
]


def build_info() -> dict[str, Any]:
    """What this build is: package version, upstream pin, compiled backends and visible devices."""
    from pyllama_so import _build_info

    return {
        "version": __version__,
        "upstream_commit": _build_info.UPSTREAM_COMMIT,
        "upstream_sdist": _build_info.UPSTREAM_SDIST,
        "compiled_backends": list(_build_info.COMPILED_BACKENDS),
        "backends": backends(),
        "devices": devices(),
    }
