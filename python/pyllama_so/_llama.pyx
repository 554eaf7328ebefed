# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Low-level bindings over llama.h. The user-facing API is pyllama_so.Llama (llama.py).

Every C call that can take long (model load, decode, quantization) runs with the GIL released. Return
codes of the C API are turned into Python exceptions in one place: _check_decode(), _null_check() and
_check_quantize().
"""

from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport memcpy, memset, strncpy, strlen, strstr
from libc.math cimport sqrt, log, cos, fabs
from libc.stdio cimport fputs, fflush, stderr
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.bytes cimport PyBytes_FromStringAndSize

import math
import os

import numpy as np

__all__ = [
    "LlamaError", "ModelLoadError", "ContextFullError", "DecodeError",
    "Model", "Context", "devices", "backends", "system_info", "set_log_level", "upstream_version",
    "max_devices", "supports_gpu_offload", "SPLIT_MODES", "FLASH_ATTN", "CACHE_TYPES",
    "QuantizeError", "FTYPES", "quantize_model", "chat_apply_template", "chat_builtin_templates",
    "RPCConnectionError", "rpc_supported", "rpc_endpoints", "rpc_devices", "probe_rpc_server",
]


class LlamaError(RuntimeError):
    """An error reported by llama.cpp."""


class ModelLoadError(LlamaError, ValueError):
    """The model file (or metadata) could not be turned into a model."""


class ContextFullError(LlamaError):
    """The KV cache has no room for the batch: raise n_ctx or clear the context."""


class DecodeError(LlamaError):
    """llama_decode failed for a reason other than a full context."""


class QuantizeError(LlamaError):
    """llama_model_quantize failed (unreadable input, unwritable output, unsupported tensor...)."""


SPLIT_MODES = {"none": LLAMA_SPLIT_MODE_NONE, "layer": LLAMA_SPLIT_MODE_LAYER,
               "row": LLAMA_SPLIT_MODE_ROW, "tensor": LLAMA_SPLIT_MODE_TENSOR}
FLASH_ATTN = {"auto": LLAMA_FLASH_ATTN_TYPE_AUTO, "off": LLAMA_FLASH_ATTN_TYPE_DISABLED,
              "on": LLAMA_FLASH_ATTN_TYPE_ENABLED}
CACHE_TYPES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "bf16": GGML_TYPE_BF16, "q8_0": GGML_TYPE_Q8_0,
               "q4_0": GGML_TYPE_Q4_0, "q4_1": GGML_TYPE_Q4_1, "q5_0": GGML_TYPE_Q5_0, "q5_1": GGML_TYPE_Q5_1}
# llama_ftype by name, spelled as llama-quantize spells them: the targets of quantize_model. The
# IQ1/IQ2 types and Q2_K_S are left out: they need an importance matrix, which random weights lack.
FTYPES = {
    "f32": LLAMA_FTYPE_ALL_F32, "f16": LLAMA_FTYPE_MOSTLY_F16, "bf16": LLAMA_FTYPE_MOSTLY_BF16,
    "q8_0": LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": LLAMA_FTYPE_MOSTLY_Q4_0, "q4_1": LLAMA_FTYPE_MOSTLY_Q4_1,
    "q5_0": LLAMA_FTYPE_MOSTLY_Q5_0, "q5_1": LLAMA_FTYPE_MOSTLY_Q5_1, "q2_k": LLAMA_FTYPE_MOSTLY_Q2_K,
    "q3_k_s": LLAMA_FTYPE_MOSTLY_Q3_K_S, "q3_k_m": LLAMA_FTYPE_MOSTLY_Q3_K_M, "q3_k_l": LLAMA_FTYPE_MOSTLY_Q3_K_L,
    "q4_k_s": LLAMA_FTYPE_MOSTLY_Q4_K_S, "q4_k_m": LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q5_k_s": LLAMA_FTYPE_MOSTLY_Q5_K_S, "q5_k_m": LLAMA_FTYPE_MOSTLY_Q5_K_M, "q6_k": LLAMA_FTYPE_MOSTLY_Q6_K,
    "iq4_nl": LLAMA_FTYPE_MOSTLY_IQ4_NL, "iq4_xs": LLAMA_FTYPE_MOSTLY_IQ4_XS,
}


# ---------------------------------------------------------------------------------------------
# logging: llama.cpp logs from any thread, so the callback touches no Python object.

cdef extern from *:
    """
    // The last error line llama.cpp logged on this thread: decodes run without the GIL, so two
    // threads must not read each other's message.
    static thread_local char pyllama_so_last_error[1024];
    """
    char _last_error "pyllama_so_last_error"[1024]

cdef int _log_threshold = GGML_LOG_LEVEL_WARN
cdef bint _log_last_shown = False

cdef void _log_callback(ggml_log_level level, const char * text, void * user_data) noexcept nogil:
    global _log_last_shown
    cdef bint show
    if level == GGML_LOG_LEVEL_CONT:
        show = _log_last_shown
    else:
        show = level != GGML_LOG_LEVEL_NONE and <int> level >= _log_threshold
        # the loader's "error loading model: <cause>" is followed by a generic "failed to load model": keep the cause
        if level == GGML_LOG_LEVEL_ERROR and not (strstr(text, "failed to load model") != NULL and
                                                  strstr(_last_error, "error loading model") != NULL):
            strncpy(_last_error, text, sizeof(_last_error) - 1)
            _last_error[sizeof(_last_error) - 1] = 0
    if show:
        fputs(text, stderr)
        fflush(stderr)
    _log_last_shown = show

_LOG_LEVELS = {"debug": GGML_LOG_LEVEL_DEBUG, "info": GGML_LOG_LEVEL_INFO, "warn": GGML_LOG_LEVEL_WARN,
               "error": GGML_LOG_LEVEL_ERROR, "none": 99}


# the level the user chose with set_log_level, or -1 for none: Llama's verbose= must not override it
cdef int _log_explicit = -1


def set_log_level(level):
    """Show llama.cpp log lines at this level and above: debug, info, warn (default), error, none.

    A level set here stays until the next call: Llama(verbose=True) may only lower it to info.
    None forgets it (back to warn, and to what verbose= asks for).
    """
    global _log_threshold, _log_explicit
    if level is None:
        _log_explicit = -1
        _log_threshold = GGML_LOG_LEVEL_WARN
        return
    if not isinstance(level, str) or level not in _LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {sorted(_LOG_LEVELS)} or None")
    _log_explicit = _log_threshold = _LOG_LEVELS[level]


def set_verbose(bint verbose):
    """Llama's verbose=: info lines and above when True, else the default (warn). A level set with
    set_log_level is kept, except that verbose=True lowers it to info."""
    global _log_threshold
    cdef int base = _log_explicit if _log_explicit >= 0 else <int> GGML_LOG_LEVEL_WARN
    _log_threshold = min(base, <int> GGML_LOG_LEVEL_INFO) if verbose else base


cdef str _take_last_error():
    """The calling thread's last logged error (empty if none), cleared."""
    msg = (<bytes> _last_error).decode("utf-8", "replace").strip()
    _last_error[0] = 0
    return msg


cdef _check_decode(int rc, str what, str call="llama_decode"):
    """The one place where llama_decode's (and llama_encode's) return codes become exceptions."""
    if rc == 0:
        return
    if rc == 1:
        raise ContextFullError(f"{what}: no KV-cache slot for the batch (the context is full; raise n_ctx)")
    if rc == 2:
        raise DecodeError(f"{what}: aborted")
    detail = _take_last_error()
    if rc == -1:
        raise ValueError(f"{what}: invalid batch" + (f" ({detail})" if detail else ""))
    raise DecodeError(f"{what}: {call} returned {rc}" + (f": {detail}" if detail else ""))


cdef _null_check(const void * ptr, exc_type, str what):
    if ptr == NULL:
        detail = _take_last_error()
        raise exc_type(what + (f": {detail}" if detail else ""))


cdef _check_quantize(uint32_t rc, str what):
    if rc != 0:
        detail = _take_last_error()
        raise QuantizeError(what + (f": {detail}" if detail else f" (llama_model_quantize returned {rc})"))


llama_log_set(_log_callback, NULL)  # first, so that backend initialisation logs through it too
llama_backend_init()


def upstream_version():
    """llama.cpp's own version string."""
    return (<bytes> llama_version()).decode()


def system_info():
    return (<bytes> llama_print_system_info()).decode()


def max_devices():
    return llama_max_devices()


def supports_gpu_offload():
    return llama_supports_gpu_offload()


_DEV_TYPES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
              GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
              GGML_BACKEND_DEVICE_TYPE_META: "meta"}


cdef dict _device_info(size_t index, ggml_backend_dev_t dev):
    cdef size_t free_mem, total_mem
    ggml_backend_dev_memory(dev, &free_mem, &total_mem)
    return {
        "index": index,
        "name": (<bytes> ggml_backend_dev_name(dev)).decode(),
        "description": (<bytes> ggml_backend_dev_description(dev)).decode(),
        "type": _DEV_TYPES.get(ggml_backend_dev_type(dev), "unknown"),
        "backend": (<bytes> ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev))).decode(),
        "memory_free": free_mem,
        "memory_total": total_mem,
    }


def devices():
    """Every ggml backend device: index, name, description, type, backend, memory (RPC servers' devices
    are not among them: rpc_devices() lists those)."""
    cdef size_t i
    return [_device_info(i, ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]


def backends():
    """Names of the registered backends that have at least one device."""
    cdef size_t i
    cdef ggml_backend_reg_t reg
    out = []
    for i in range(ggml_backend_reg_count()):
        reg = ggml_backend_reg_get(i)
        if ggml_backend_reg_dev_count(reg) > 0:
            out.append((<bytes> ggml_backend_reg_name(reg)).decode())
    return out


def gpu_device_count():
    """GPU devices (integrated ones included) that llama.cpp sees."""
    return sum(1 for d in devices() if d["type"] in ("gpu", "igpu"))


def cpu_virtual_devices(int n):
    """Make n CPU virtual devices (named CPUV0.., at most 16) if none exist yet; return how many exist.

    They let llama.cpp's tensor split run without a GPU. GGML_CPU_VIRTUAL_DEVICES=N creates them at
    start-up instead. See ggml/include/ggml-cpu-virtual.h.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    return ggml_backend_cpu_virtual_init(n)


def quantize_model(src, dst, str ftype, int n_threads=0):
    """Quantize the GGUF model file src into dst with llama.cpp's llama_model_quantize.

    ftype is a key of FTYPES ("q4_k_m", "q4_0", "q8_0", ...). llama.cpp chooses each tensor's type as
    llama-quantize does: 1-D tensors stay F32, the K-quant _s/_m/_l types mix in larger types for some
    tensors, and a tensor whose rows are not a whole number of the type's blocks gets a fallback type
    (Q4_K -> Q5_0, Q6_K -> Q8_0 for rows of 128). n_threads <= 0 uses every hardware thread.
    """
    if ftype not in FTYPES:
        raise ValueError(f"unknown quantization type {ftype!r}; expected one of {list(FTYPES)}")
    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.abspath(src) == os.path.abspath(dst) or (
            os.path.exists(src) and os.path.exists(dst) and os.path.samefile(src, dst)):
        # llama.cpp would truncate the file it is reading from
        raise ValueError(f"quantize_model: the output is the input ({dst}); write to another file")
    cdef bytes bsrc = os.fsencode(src)
    cdef bytes bdst = os.fsencode(dst)
    cdef const char * csrc = bsrc
    cdef const char * cdst = bdst
    cdef llama_model_quantize_params p = llama_model_quantize_default_params()
    p.nthread = n_threads
    p.ftype = <llama_ftype> <int> FTYPES[ftype]
    cdef uint32_t rc
    _take_last_error()  # a stale message must not become this call's detail
    with nogil:
        rc = llama_model_quantize(csrc, cdst, &p)
    _check_quantize(rc, f"cannot quantize {src} to {ftype} in {dst}")


# ---------------------------------------------------------------------------------------------
# chat templates: llama.cpp's built-in formats (no Jinja), chosen by name or detected in a model's template


def chat_builtin_templates():
    """Names of the chat templates llama.cpp formats itself ("chatml", "llama3", ...)."""
    cdef int32_t n = llama_chat_builtin_templates(NULL, 0)
    cdef const char ** names = <const char **> calloc(max(n, 1), sizeof(char *))
    try:
        n = llama_chat_builtin_templates(names, n)
        return [(<bytes> names[i]).decode() for i in range(n)]
    finally:
        free(names)


def chat_apply_template(str template, messages, bint add_assistant=True):
    """Format messages ({"role": ..., "content": ...} mappings, contents as str) with a chat template:
    a built-in name (chat_builtin_templates()) or a model's template text, which llama.cpp recognizes by
    its markers. add_assistant ends the text with the start of an assistant turn. ValueError for a
    template llama.cpp does not know."""
    cdef list keep = []  # the encoded strings, alive while C points into them
    cdef Py_ssize_t n = len(messages), i
    cdef llama_chat_message * chat = <llama_chat_message *> calloc(max(n, 1), sizeof(llama_chat_message))
    cdef bytes btmpl = template.encode()
    cdef bytes role, content
    cdef int32_t size = 256, got
    cdef char * buf = NULL
    try:
        for i in range(n):
            role = str(messages[i]["role"]).encode()
            content = str(messages[i]["content"]).encode()
            if b"\0" in role or b"\0" in content:
                raise ValueError("a chat message contains a NUL character")
            keep += [role, content]
            chat[i].role = role
            chat[i].content = content
            size += 2 * (len(role) + len(content))
        while True:
            buf = <char *> malloc(size)
            got = llama_chat_apply_template(btmpl, chat, n, add_assistant, buf, size)
            if got < 0:
                raise ValueError(f"llama_chat_apply_template cannot format these messages with the template {template[:80]!r}"
                                 " (not one it knows, see chat_builtin_templates())")
            if got <= size:
                return PyBytes_FromStringAndSize(buf, got).decode("utf-8", "replace")
            free(buf)
            buf = NULL
            size = got
    finally:
        free(buf)
        free(chat)


# ---------------------------------------------------------------------------------------------
# the rules for parameter values: the one place that checks them (Llama, the argument parser and
# the bench call these)

_FLASH_ATTN_ALIASES = {"0": "off", "false": "off", "disabled": "off", "1": "on", "true": "on", "enabled": "on"}


def split_mode_name(value):
    """A split mode as its name: a name ("none", "layer", "row", "tensor") or llama.cpp's enum value."""
    names = list(SPLIT_MODES)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"split_mode must be a name or an int, not {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value < len(names):
            raise ValueError(f"unknown split_mode {value}; expected 0..{len(names) - 1} or one of {names}")
        return names[value]
    if value.lower() not in SPLIT_MODES:
        raise ValueError(f"unknown split_mode {value!r}; expected one of {names}")
    return value.lower()


def flash_attn_name(value):
    """Flash attention as "auto", "on" or "off": a bool, None (auto), or a name or 0/1."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        key = _FLASH_ATTN_ALIASES.get(value.lower(), value.lower())
        if key in FLASH_ATTN:
            return key
    raise ValueError(f"unknown flash_attn {value!r}; expected a bool or one of {list(FLASH_ATTN) + list(_FLASH_ATTN_ALIASES)}")


def cache_type_name(value, str what="cache type"):
    """A KV-cache type as its ggml name ("f16", "q8_0", ...): a name or a ggml_type id."""
    if isinstance(value, int) and not isinstance(value, bool):
        name = (<bytes> ggml_type_name(<ggml_type> value)).decode() if 0 <= value < GGML_TYPE_COUNT else ""
        if name not in CACHE_TYPES:
            raise ValueError(f"unsupported {what}: ggml type id {value}" + (f" ({name})" if name else ""))
        return name
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a ggml type name or id, not {type(value).__name__}")
    if value.lower() not in CACHE_TYPES:
        raise ValueError(f"unknown {what} {value!r}; expected one of {list(CACHE_TYPES)}")
    return value.lower()


def _check_split(what, split, n_devices):
    try:
        values = [float(v) for v in split]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of numbers, got {split!r}") from None
    if not values:
        raise ValueError(f"{what} is empty")
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{what} entries must be finite and >= 0: {values}")
    if not any(values):
        raise ValueError(f"{what} entries are all 0: {values}")
    limit = min(llama_max_devices(), max(1, gpu_device_count()) if n_devices is None else n_devices)
    if len(values) > limit:
        raise ValueError(f"{what} has {len(values)} entries but there are {limit} device(s)")
    return values


def check_tensor_split(tensor_split, n_devices=None):
    """tensor_split as a list of floats: finite, >= 0, not all 0, at most n_devices entries (default:
    the GPU devices there are, or 1 without GPUs; never more than llama.cpp's maximum)."""
    return _check_split("tensor_split", tensor_split, n_devices)


def check_attn_split(attn_split, n_devices=None):
    """attn_split (the attention heads' and KV cache's proportions per device under split_mode="tensor")
    as a list of floats, with the rules of check_tensor_split: finite, >= 0, not all 0 (a 0 entry gives that
    device no attention), at most n_devices entries."""
    return _check_split("attn_split", attn_split, n_devices)


def check_batch_sizes(n_batch, n_ubatch):
    """n_batch and n_ubatch: both >= 1, and n_ubatch <= n_batch."""
    if n_batch < 1 or n_ubatch < 1:
        raise ValueError(f"n_batch and n_ubatch must be >= 1, got {n_batch} and {n_ubatch}")
    if n_ubatch > n_batch:
        raise ValueError(f"n_ubatch ({n_ubatch}) must not exceed n_batch ({n_batch})")


def default_n_ubatch(n_batch, split_overlap):
    """The ubatch when none is given: llama.cpp's 512, or half of n_batch with split overlap, so that
    each batch gives both lanes a ubatch (on two H200s, pp2048 with -b 2048 ran fastest at -ub 1024 of
    128-2048; docs/benchmarks.md). Never below the 64 tokens a lane needs, nor above n_batch."""
    if split_overlap:
        return min(n_batch, max(64, n_batch // 2))
    return min(n_batch, 512)


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t> ts.tv_sec * 1000000000 + ts.tv_nsec


include "_rpc.pxi"


# ---------------------------------------------------------------------------------------------
# model

cdef cbool _silent_progress(float progress, void * user_data) noexcept nogil:
    return True


cdef cbool _python_progress(float progress, void * user_data) noexcept nogil:
    """user_data is a list [callback, exception]: an exception cancels the load and is kept for the caller."""
    with gil:
        state = <list> user_data
        try:
            return bool(state[0](progress))
        except BaseException as e:
            state[1] = e
            return False


cdef class Model:
    """A loaded llama_model. Free it with free() (idempotent) after every Context on it is freed."""

    def __dealloc__(self):
        if self.ptr != NULL and self.live_contexts == 0:
            llama_model_free(self.ptr)
            self.ptr = NULL

    @staticmethod
    cdef llama_model_params _params(int n_gpu_layers, object split_mode, int main_gpu, float * split_buf,
                                    object tensor_split, bint use_mmap, float * attn_buf=NULL,
                                    object attn_split=None, object n_devices=None) except *:
        """Model params; split_buf and attn_buf have llama_max_devices() entries (attn_buf may be NULL when
        attn_split is None). attn_split needs split_mode "tensor"."""
        cdef llama_model_params p = llama_model_default_params()
        p.n_gpu_layers = n_gpu_layers
        p.split_mode = SPLIT_MODES[split_mode_name(split_mode)]
        p.main_gpu = main_gpu
        p.load_mode = LLAMA_LOAD_MODE_AUTO if use_mmap else LLAMA_LOAD_MODE_NONE
        p.progress_callback = _silent_progress
        if tensor_split is not None:
            for i, v in enumerate(check_tensor_split(tensor_split, n_devices)):  # split_buf has llama_max_devices() entries
                split_buf[i] = v
            p.tensor_split = split_buf
        if attn_split is not None:
            if split_mode_name(split_mode) != "tensor":
                raise ValueError(f'attn_split needs split_mode="tensor", not {split_mode_name(split_mode)!r}')
            for i, v in enumerate(check_attn_split(attn_split, n_devices)):
                attn_buf[i] = v
            p.attn_split = attn_buf
        return p

    @staticmethod
    def load(path, *, int n_gpu_layers=-1, split_mode="layer", int main_gpu=0, tensor_split=None,
             bint use_mmap=True, progress=None, attn_split=None, rpc_servers=None):
        """Load a GGUF file. Raises ModelLoadError for a file llama.cpp cannot load (Llama checks that it exists).
        attn_split (split_mode "tensor" only): the attention heads' and KV cache's proportions per device.
        rpc_servers ("host:port" list or comma-separated string): the devices of these RPC servers come
        first, then the local ones (tensor_split and main_gpu count them in that order); RPCConnectionError
        for a server that cannot be reached."""
        cdef float * split_buf = <float *> calloc(llama_max_devices(), sizeof(float))
        cdef float * attn_buf = <float *> calloc(llama_max_devices(), sizeof(float))
        cdef llama_model_params p
        cdef vector[ggml_backend_dev_t] devs
        cdef Model model
        endpoints = rpc_endpoints(rpc_servers) if rpc_servers is not None else []
        progress_state = [progress, None]
        try:
            if endpoints:
                devs = _rpc_model_devices(endpoints, split_mode_name(split_mode))
                if split_mode_name(split_mode) == "none" and not 0 <= main_gpu < <int> devs.size():
                    raise ValueError(f"main_gpu {main_gpu} out of range: {devs.size()} device(s)")
                devs.push_back(NULL)
            p = Model._params(n_gpu_layers, split_mode, main_gpu, split_buf, tensor_split, use_mmap,
                              attn_buf, attn_split, devs.size() - 1 if endpoints else None)
            if endpoints:
                p.devices = devs.data()
            if progress is not None:
                p.progress_callback = _python_progress
                p.progress_callback_user_data = <void *> progress_state
            model = Model._load(path, p)
            model.rpc_servers = tuple(endpoints)
            try:
                _check_rpc_servers(model.rpc_servers, "loading the model")
            except BaseException:
                model.free()
                raise
            return model
        except ModelLoadError as e:
            if progress_state[1] is not None:  # the callback raised: that is the error, not the cancel
                raise progress_state[1]
            _check_rpc_servers(tuple(endpoints), "loading the model")  # a lost server is the cause
            if split_mode_name(split_mode) == "tensor" and gpu_device_count() == 0:
                raise ModelLoadError(f"{e}. Tensor split needs devices other than the CPU and there is no GPU: "
                                     "set GGML_CPU_VIRTUAL_DEVICES=2 or call pyllama_so.cpu_virtual_devices(2) "
                                     "before loading to split over CPU virtual devices") from None
            raise
        finally:
            free(split_buf)
            free(attn_buf)

    @staticmethod
    cdef Model _load(path, llama_model_params p):
        """llama_model_load_from_file with these params; ModelLoadError when llama.cpp rejects it."""
        cdef Model self = Model.__new__(Model)
        cdef bytes bpath = str(path).encode()
        cdef const char * cpath = bpath
        _take_last_error()
        with nogil:
            self.ptr = llama_model_load_from_file(cpath, p)
        _null_check(self.ptr, ModelLoadError, f"failed to load model from {path}")
        self.vocab = llama_model_get_vocab(self.ptr)
        self.path = str(path)
        self.rpc_servers = ()
        return self

    @staticmethod
    cdef Model _adopt(llama_model * ptr, path):
        """A Model owning ptr (not NULL): freed with the Model."""
        cdef Model self = Model.__new__(Model)
        self.ptr = ptr
        self.vocab = llama_model_get_vocab(ptr)
        self.path = None if path is None else str(path)
        self.rpc_servers = ()
        return self

    cdef void _check_open(self) except *:
        if self.ptr == NULL:
            raise ValueError("the model is closed")

    def free(self):
        """Free the model. Idempotent. Every Context on it must be freed first."""
        if self.ptr == NULL:
            return
        if self.live_contexts:
            raise LlamaError(f"{self.live_contexts} context(s) still use this model: free them first")
        llama_model_free(self.ptr)
        self.ptr = NULL

    @property
    def closed(self):
        return self.ptr == NULL

    @property
    def n_vocab(self):
        self._check_open()
        return llama_vocab_n_tokens(self.vocab)

    @property
    def n_embd(self):
        self._check_open()
        return llama_model_n_embd(self.ptr)

    @property
    def n_layer(self):
        self._check_open()
        return llama_model_n_layer(self.ptr)

    @property
    def n_ctx_train(self):
        self._check_open()
        return llama_model_n_ctx_train(self.ptr)

    @property
    def n_params(self):
        self._check_open()
        return llama_model_n_params(self.ptr)

    @property
    def size(self):
        """Bytes of weights."""
        self._check_open()
        return llama_model_size(self.ptr)

    @property
    def desc(self):
        cdef char buf[256]
        self._check_open()
        llama_model_desc(self.ptr, buf, sizeof(buf))
        return (<bytes> buf).decode("utf-8", "replace")

    def meta(self, str key):
        """A metadata value as a string, or None."""
        cdef char buf[1024]
        self._check_open()
        n = llama_model_meta_val_str(self.ptr, key.encode(), buf, sizeof(buf))
        return None if n < 0 else (<bytes> buf).decode("utf-8", "replace")

    def chat_template(self, name=None):
        """The model's chat template (tokenizer.chat_template, or the named variant), or None."""
        self._check_open()
        cdef bytes bname
        cdef const char * res
        if name is None:
            res = llama_model_chat_template(self.ptr, NULL)
        else:
            bname = str(name).encode()
            res = llama_model_chat_template(self.ptr, bname)
        return None if res == NULL else (<bytes> res).decode("utf-8", "replace")

    @property
    def token_bos(self):
        self._check_open()
        return llama_vocab_bos(self.vocab)

    @property
    def token_eos(self):
        self._check_open()
        return llama_vocab_eos(self.vocab)

    @property
    def add_bos(self):
        self._check_open()
        return llama_vocab_get_add_bos(self.vocab)

    def is_eog(self, int token):
        self._check_open()
        return llama_vocab_is_eog(self.vocab, token)

    def tokenize(self, text, *, bint add_special=True, bint parse_special=False):
        """Text (str or UTF-8 bytes) to an int32 numpy array of token ids."""
        self._check_open()
        cdef bytes b
        if isinstance(text, str):
            b = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray)):
            b = bytes(text)
        else:  # bytes(123) would be 123 zero bytes
            raise TypeError(f"text must be str or bytes, not {type(text).__name__}")
        cdef int32_t n_max = len(b) + 8
        cdef int32_t[::1] out = np.empty(n_max, dtype=np.int32)
        cdef int32_t n = llama_tokenize(self.vocab, b, len(b), &out[0], n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            out = np.empty(n_max, dtype=np.int32)
            n = llama_tokenize(self.vocab, b, len(b), &out[0], n_max, add_special, parse_special)
        if n < 0:
            raise LlamaError("tokenization failed")
        return np.asarray(out[:n]).copy()

    def detokenize_bytes(self, tokens, *, bint remove_special=False, bint unparse_special=False):
        self._check_open()
        cdef int32_t[::1] toks = self._tokens(tokens)
        cdef int32_t n_tok = toks.shape[0]
        if n_tok == 0:
            return b""
        cdef int32_t cap = n_tok * 8 + 16
        cdef char * buf = <char *> malloc(cap)
        cdef int32_t n
        try:
            n = llama_detokenize(self.vocab, &toks[0], n_tok, buf, cap, remove_special, unparse_special)
            if n < 0:
                cap = -n
                free(buf)
                buf = <char *> malloc(cap)
                n = llama_detokenize(self.vocab, &toks[0], n_tok, buf, cap, remove_special, unparse_special)
            if n < 0:
                raise LlamaError("detokenization failed")
            return PyBytes_FromStringAndSize(buf, n)
        finally:
            free(buf)

    def token_to_piece(self, int token, *, bint special=False):
        cdef char buf[256]
        self._check_open()
        n = llama_token_to_piece(self.vocab, token, buf, sizeof(buf), 0, special)
        if n < 0:
            raise LlamaError(f"token {token}: piece longer than {sizeof(buf)} bytes")
        return PyBytes_FromStringAndSize(buf, n)

    cdef int32_t[::1] _tokens(self, tokens):
        arr = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n_vocab = llama_vocab_n_tokens(self.vocab)
        if arr.size and (arr.min() < 0 or arr.max() >= n_vocab):
            raise ValueError(f"token id out of range [0, {n_vocab})")
        return arr


# ---------------------------------------------------------------------------------------------
# context

cdef class Context:
    """A llama_context on a Model, with one reusable batch. Free with free() (idempotent)."""

    cdef void _fill_batch(self, const int32_t[::1] toks, int32_t start, int32_t n, llama_pos pos0,
                          int32_t seq_id, bint all_logits, int32_t last):
        """Tokens [start, start + n) of toks into the batch, at positions pos0 + index in one sequence;
        logits for every token (all_logits) or only for token `last`."""
        cdef int32_t i
        for i in range(n):
            self.batch.token[i] = toks[start + i]
            self.batch.pos[i] = pos0 + start + i
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = seq_id
            self.batch.logits[i] = all_logits or start + i == last
        self.batch.n_tokens = n

    def __cinit__(self):
        self.ptr = NULL
        self.batch_cap = 0

    def __init__(self, Model model, *, int n_ctx=0, int n_batch=2048, int n_ubatch=512, int n_seq_max=1,
                 int n_threads=-1, int n_threads_batch=-1, flash_attn="auto", type_k="f16",
                 type_v="f16", bint offload_kqv=True, bint op_offload=True, bint split_overlap=False):
        model._check_open()
        check_batch_sizes(n_batch, n_ubatch)
        cdef llama_context_params p = llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_ubatch
        p.n_seq_max = n_seq_max
        if n_threads > 0:
            p.n_threads = n_threads
        if n_threads_batch > 0:
            p.n_threads_batch = n_threads_batch
        elif n_threads > 0:
            p.n_threads_batch = n_threads
        p.flash_attn_type = FLASH_ATTN[flash_attn_name(flash_attn)]
        p.type_k = CACHE_TYPES[cache_type_name(type_k, "type_k")]
        p.type_v = CACHE_TYPES[cache_type_name(type_v, "type_v")]
        p.offload_kqv = offload_kqv
        p.op_offload = op_offload
        p.split_overlap = split_overlap
        p.no_perf = True
        _take_last_error()
        with nogil:
            self.ptr = llama_init_from_model(model.ptr, p)
        if self.ptr == NULL:
            _check_rpc_servers(model.rpc_servers, "creating the context")
        _null_check(self.ptr, LlamaError, "failed to create the context")
        self.model = model
        model.live_contexts += 1
        self.batch_cap = llama_n_batch(self.ptr)
        self.batch = llama_batch_init(self.batch_cap, 0, 1)
        self.rng = 0x2545F4914F6CDD1DULL
        _check_rpc_servers(model.rpc_servers, "creating the context")  # on failure, freed with self

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        if self.ptr != NULL:
            llama_free(self.ptr)
            self.ptr = NULL
            llama_batch_free(self.batch)
            self.batch_cap = 0
            if self.model is not None:
                self.model.live_contexts -= 1

    def free(self):
        """Free the context (idempotent)."""
        self._release()

    cdef void _check_open(self) except *:
        if self.ptr == NULL:
            raise ValueError("the context is closed")

    @property
    def closed(self):
        return self.ptr == NULL

    @property
    def n_ctx(self):
        self._check_open()
        return llama_n_ctx(self.ptr)

    @property
    def n_batch(self):
        self._check_open()
        return llama_n_batch(self.ptr)

    @property
    def n_ubatch(self):
        self._check_open()
        return llama_n_ubatch(self.ptr)

    @property
    def n_seq_max(self):
        self._check_open()
        return llama_n_seq_max(self.ptr)

    @property
    def n_ctx_seq(self):
        """Tokens one sequence may hold: n_ctx / n_seq_max rounded up to 256 (llama.cpp gives each sequence
        its own part of the KV cache), so n_ctx itself with one sequence."""
        self._check_open()
        return llama_n_ctx_seq(self.ptr)

    def n_past(self, int seq_id=0):
        """Tokens held in the KV cache for a sequence."""
        self._check_open()
        return llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1

    def clear(self, bint data=False):
        """Empty the KV cache (and the recurrent state)."""
        self._check_open()
        llama_memory_clear(llama_get_memory(self.ptr), data)

    def truncate(self, int n_keep, int seq_id=0):
        """Drop every cached position >= n_keep of a sequence."""
        self._check_open()
        if not llama_memory_seq_rm(llama_get_memory(self.ptr), seq_id, n_keep, -1):
            raise LlamaError("this model's memory cannot drop part of a sequence")

    def set_threads(self, int n_threads, int n_threads_batch=-1):
        self._check_open()
        llama_set_n_threads(self.ptr, n_threads, n_threads_batch if n_threads_batch > 0 else n_threads)

    def synchronize(self):
        self._check_open()
        with nogil:
            llama_synchronize(self.ptr)

    def decode(self, tokens, *, int seq_id=0, bint all_logits=False):
        """Append tokens to a sequence; return logits as a float32 array of shape (n_out, n_vocab).

        n_out is len(tokens) with all_logits, else 1 (the last token). The batch is cut into
        n_batch-sized llama_decode calls; the GIL is released during each.
        """
        self._check_open()
        cdef int32_t[::1] toks = self.model._tokens(tokens)
        cdef int32_t n = toks.shape[0]
        if n == 0:
            raise ValueError("no tokens to decode")
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        cdef int32_t n_ctx = llama_n_ctx_seq(self.ptr)  # a sequence's share; all of n_ctx with one sequence
        cdef llama_pos pos0 = llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1
        if pos0 + n > n_ctx:
            raise ContextFullError(f"{pos0} cached + {n} new tokens exceed the context of {n_ctx} tokens")
        out = np.empty((n if all_logits else 1, n_vocab), dtype=np.float32)
        cdef float[:, ::1] out_mv = out
        cdef int32_t done = 0, chunk, i, row = 0, rc
        cdef float * src
        while done < n:
            chunk = min(n - done, self.batch_cap)
            self._fill_batch(toks, done, chunk, pos0, seq_id, all_logits, n - 1)
            with nogil:
                rc = llama_decode(self.ptr, self.batch)
            if rc != 0:  # a lost RPC server is the cause to report
                _check_rpc_servers(self.model.rpc_servers, "decode")
            _check_decode(rc, "decode")
            for i in range(chunk):
                if self.batch.logits[i]:
                    src = llama_get_logits_ith(self.ptr, i)
                    if src == NULL:
                        raise DecodeError("no logits for an output token")
                    memcpy(&out_mv[row, 0], src, n_vocab * sizeof(float))
                    row += 1
            self.n_last_outputs = row
            done += chunk
        # replies of a lost RPC server read as zeros: checked after the logits were fetched
        _check_rpc_servers(self.model.rpc_servers, "decode")
        return out

    def decode_sequences(self, seqs):
        """Append tokens to several sequences at once: the tokens of every sequence share each
        llama_decode call (n_batch at a time, in the order given), as a server batches its slots.
        seqs: (seq_id, tokens) pairs with distinct seq_ids < n_seq_max. Returns the logits of each
        sequence's last token, float32 (len(seqs), n_vocab), in the order given."""
        return self._decode_items([(s, t, True) for s, t in seqs], "decode_sequences")

    def decode_batch(self, items):
        """Append tokens to several sequences in shared llama_decode calls: a server's step, where some
        sequences add one generated token and others a piece of their prompt.

        items: (seq_id, tokens, logits) triples with distinct seq_ids < n_seq_max and at least one token
        each; logits (bool) asks for the logits of the item's last token. Each sequence continues after
        the positions it holds. The tokens go in the order given, n_batch at a time (one llama_decode
        call when they fit). Returns float32 (items with logits, n_vocab), in the order given. A sequence
        that would outgrow its share of the context (n_ctx_seq) raises ContextFullError before any decode.
        """
        return self._decode_items([(s, t, bool(want)) for s, t, want in items], "decode_batch")

    def _decode_items(self, list items, str what):
        self._check_open()
        cdef uint32_t n_seq_max = llama_n_seq_max(self.ptr)
        cdef int32_t n_ctx_seq = llama_n_ctx_seq(self.ptr)
        cdef llama_memory_t mem = llama_get_memory(self.ptr)
        ids = [int(s) for s, _, _ in items]
        if len(set(ids)) != len(ids) or not all(0 <= s < n_seq_max for s in ids):
            raise ValueError(f"seq_ids must be distinct and in [0, {n_seq_max}): {ids}")
        arrays = [np.asarray(self.model._tokens(t)) for _, t, _ in items]
        if not items or any(a.shape[0] == 0 for a in arrays):
            raise ValueError("every sequence needs at least one token")
        lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
        pos0 = np.array([llama_memory_seq_pos_max(mem, s) + 1 for s in ids], dtype=np.int64)
        for s, held, new in zip(ids, pos0, lengths):
            if held + new > n_ctx_seq:
                raise ContextFullError(f"sequence {s}: {held} cached + {new} new tokens exceed its context of "
                                       f"{n_ctx_seq} tokens")
        # flat per-token arrays: token, sequence, position, and the output row (-1: no logits)
        ends = np.cumsum(lengths)
        n_total = int(lengths.sum())  # not ends[-1]: this module compiles with wraparound=False
        cdef int32_t[::1] tok = np.concatenate(arrays).astype(np.int32)
        cdef int32_t[::1] seq = np.repeat(np.array(ids, dtype=np.int32), lengths)
        cdef int32_t[::1] pos = (np.arange(n_total) - np.repeat(ends - lengths, lengths)
                                 + np.repeat(pos0, lengths)).astype(np.int32)
        want = np.array([w for _, _, w in items], dtype=bool)
        rows_np = np.full(n_total, -1, dtype=np.int32)
        rows_np[ends[want] - 1] = np.arange(int(want.sum()), dtype=np.int32)
        cdef int32_t[::1] rows = rows_np
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        out = np.empty((int(want.sum()), n_vocab), dtype=np.float32)
        cdef float[:, ::1] out_mv = out
        cdef int32_t total = tok.shape[0], start, n, i, rc
        cdef float * src
        for start in range(0, total, self.batch_cap):
            n = min(self.batch_cap, total - start)
            for i in range(n):
                self.batch.token[i] = tok[start + i]
                self.batch.pos[i] = pos[start + i]
                self.batch.n_seq_id[i] = 1
                self.batch.seq_id[i][0] = seq[start + i]
                self.batch.logits[i] = rows[start + i] >= 0
            self.batch.n_tokens = n
            with nogil:
                rc = llama_decode(self.ptr, self.batch)
            if rc != 0:
                _check_rpc_servers(self.model.rpc_servers, what)
            _check_decode(rc, what)
            for i in range(n):
                if rows[start + i] >= 0:
                    src = llama_get_logits_ith(self.ptr, i)
                    if src == NULL:
                        raise DecodeError("no logits for an output token")
                    memcpy(&out_mv[rows[start + i], 0], src, n_vocab * sizeof(float))
        _check_rpc_servers(self.model.rpc_servers, what)
        return out

    def split_overlap_stats(self):
        """What split overlap did in this context: whether the two lanes exist (else why not), the lane
        of the next large ubatch, and per lane the ubatches, graph builds, cross-lane waits and records."""
        self._check_open()
        cdef llama_split_overlap_stats st
        st.size = sizeof(llama_split_overlap_stats)
        if not llama_split_overlap_get_stats(self.ptr, &st):
            raise LlamaError("llama_split_overlap_get_stats failed")
        return {
            "enabled": bool(st.enabled),
            "reason": (<bytes> llama_split_overlap_reason_str(st.reason)).decode(),
            "next_lane": st.next_lane,
            "ubatches": [st.ubatches[0], st.ubatches[1]],
            "graph_builds": [st.graph_builds[0], st.graph_builds[1]],
            "waits": [st.waits[0], st.waits[1]],
            "records": [st.records[0], st.records[1]],
        }

    @property
    def graphs_reused(self):
        """Ubatches for which llama.cpp reused the previous compute graph instead of building one
        (llama_perf_context's n_reused, counted even without perf timings)."""
        self._check_open()
        return llama_perf_context(self.ptr).n_reused

    def logits_view(self, int i=-1):
        """Zero-copy view of output i of the last llama_decode; valid until the next decode."""
        self._check_open()
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        cdef float * src = llama_get_logits_ith(self.ptr, i)
        if src == NULL:
            raise IndexError(f"no logits for output {i}")
        view = np.asarray(<float[:n_vocab]> src)
        view.flags.writeable = False
        return view

    # -- benchmark loops: the same calls as upstream's llama-bench, with no Python in between --

    cdef llama_token _rand_token(self, int32_t n_vocab) noexcept nogil:
        self.rng ^= self.rng << 13
        self.rng ^= self.rng >> 7
        self.rng ^= self.rng << 17
        return <llama_token> (self.rng % <uint64_t> n_vocab)

    def run_prompt(self, int n_prompt):
        """Decode n_prompt random tokens in batches of the context's n_batch (one output), then synchronize.

        Returns the host time in ns: from the first llama_decode call to the return of the last one,
        before the synchronization (on GPUs: the host's work to prepare and queue the ubatches, and any
        waits inside llama_decode).
        """
        self._check_open()
        cdef int32_t n_batch = self.batch_cap  # llama.cpp's n_batch, capped at n_ctx
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        cdef bint add_bos = llama_vocab_get_add_bos(self.model.vocab)
        cdef llama_token bos = llama_vocab_bos(self.model.vocab)
        cdef int32_t done = 0, chunk, i, rc = 0
        cdef int64_t t0 = 0, t1 = 0
        with nogil:
            while done < n_prompt:
                chunk = min(n_prompt - done, n_batch)
                for i in range(chunk):
                    self.batch.token[i] = self._rand_token(n_vocab)
                if done == 0 and add_bos:
                    self.batch.token[0] = bos
                if done == 0:
                    t0 = _now_ns()
                rc = llama_decode(self.ptr, llama_batch_get_one(self.batch.token, chunk))
                if rc != 0:
                    break
                done += chunk
            t1 = _now_ns()
            if rc == 0:
                llama_synchronize(self.ptr)
        _check_rpc_servers(self.model.rpc_servers, "prompt run")
        _check_decode(rc, "prompt run")
        return t1 - t0 if n_prompt > 0 else 0

    def run_gen(self, int n_gen):
        """Decode n_gen single random tokens, synchronizing after each (as llama-bench's tg).

        Returns the host time in ns: the llama_decode calls' time, without the synchronizations.
        """
        self._check_open()
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        cdef llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(self.ptr), 0) + 1
        cdef int32_t i, rc = 0
        cdef int64_t t0, host_ns = 0
        cdef llama_token tok = llama_vocab_bos(self.model.vocab) if llama_vocab_get_add_bos(self.model.vocab) \
            else self._rand_token(n_vocab)
        with nogil:
            for i in range(n_gen):
                self.batch.token[0] = tok
                self.batch.pos[0] = pos
                self.batch.n_seq_id[0] = 1
                self.batch.seq_id[0][0] = 0
                self.batch.logits[0] = 1
                self.batch.n_tokens = 1
                t0 = _now_ns()
                rc = llama_decode(self.ptr, self.batch)
                host_ns += _now_ns() - t0
                if rc != 0:
                    break
                llama_synchronize(self.ptr)
                pos += 1
                tok = self._rand_token(n_vocab)
        _check_rpc_servers(self.model.rpc_servers, "generation run")
        _check_decode(rc, "generation run")
        return host_ns

include "_allreduce.pxi"
