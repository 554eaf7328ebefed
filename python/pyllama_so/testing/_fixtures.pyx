# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Test harness bindings: random-weight models made from GGUF metadata (no file) and the fixtures of
upstream's test-llama-archs (libpyllama-so-testing). Not part of the inference API; the suites
(tests/, python -m pyllama_so.archs) use it.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport memset, strncpy, strstr
from libc.math cimport sqrt, log, cos, fabs

from pyllama_so._llama cimport *

import os

import numpy as np

from pyllama_so._llama import CACHE_TYPES as _CACHE_TYPES, LlamaError, ModelLoadError, cache_type_name

_WEIGHT_TYPES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "bf16": GGML_TYPE_BF16}


# ---------------------------------------------------------------------------------------------
# test-only switches (testing/test-hooks.h): answered for the product from now on, in this process

cdef extern from "test-hooks.h" nogil:
    void pyllama_so_testing_install_test_hooks()
    const char * const * pyllama_so_testing_test_switches(int * n)

pyllama_so_testing_install_test_hooks()


def test_switches():
    """The environment variables that break product code on purpose (docs/multi-gpu.md), read by this harness."""
    cdef int n = 0
    cdef const char * const * names = pyllama_so_testing_test_switches(&n)
    return tuple(names[i].decode() for i in range(n))


# ---------------------------------------------------------------------------------------------
# random weights

cdef struct _RandomInit:
    uint64_t seed
    float stdev
    int failed


cdef inline uint64_t _splitmix64(uint64_t * state) noexcept nogil:
    state[0] += 0x9E3779B97F4A7C15ULL
    cdef uint64_t z = state[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline double _uniform01(uint64_t * state) noexcept nogil:
    return ((_splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0)


cdef void _fill_random(ggml_tensor * tensor, void * userdata) noexcept nogil:
    """Normal(0, stdev) weights, a pure function of (seed, tensor name): reproducible on any device.

    Mamba's A (ssm_a) is made negative: it is a state decay.
    """
    cdef _RandomInit * p = <_RandomInit *> userdata
    cdef bint negative = strstr(tensor.name, "ssm_a") != NULL
    cdef uint64_t state = p.seed
    cdef size_t k = 0
    while tensor.name[k] != 0:                      # FNV-1a of the name, mixed into the seed
        state = (state ^ <unsigned char> tensor.name[k]) * 0x100000001B3ULL
        k += 1
    cdef int64_t n = ggml_nelements(tensor), i
    cdef float * f32 = <float *> malloc(n * sizeof(float))
    cdef void * out = NULL
    cdef double u1, u2
    if f32 == NULL:
        p.failed = 1
        return
    for i in range(n):
        u1 = _uniform01(&state)
        u2 = _uniform01(&state)
        f32[i] = <float> (p.stdev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2))
        if negative:
            f32[i] = -fabs(f32[i])
    if tensor.type == GGML_TYPE_F32:
        ggml_backend_tensor_set(tensor, f32, 0, ggml_nbytes(tensor))
    elif tensor.type == GGML_TYPE_F16 or tensor.type == GGML_TYPE_BF16:
        out = malloc(n * sizeof(uint16_t))
        if out == NULL:
            p.failed = 1
        else:
            if tensor.type == GGML_TYPE_F16:
                ggml_fp32_to_fp16_row(f32, <ggml_fp16_t *> out, n)
            else:
                ggml_fp32_to_bf16_row(f32, <ggml_bf16_t *> out, n)
            ggml_backend_tensor_set(tensor, out, 0, ggml_nbytes(tensor))
            free(out)
    else:
        p.failed = 2
    free(f32)


cdef gguf_context * _gguf_from_dict(dict kv, dict tensor_types) except NULL:
    cdef gguf_context * g = gguf_init_empty()
    cdef ggml_tensor t
    cdef const char ** strs = NULL
    cdef int32_t[::1] i32
    cdef float[::1] f32
    try:
        for key, val in kv.items():
            bkey = key.encode()
            if isinstance(val, bool):
                gguf_set_val_bool(g, bkey, val)
            elif isinstance(val, int):
                if val < 0:
                    gguf_set_val_i32(g, bkey, val)
                else:
                    gguf_set_val_u32(g, bkey, val)
            elif isinstance(val, float):
                gguf_set_val_f32(g, bkey, val)
            elif isinstance(val, str):
                gguf_set_val_str(g, bkey, val.encode())
            elif isinstance(val, (list, tuple)) and val and all(isinstance(v, str) for v in val):
                items = [v.encode() for v in val]
                strs = <const char **> malloc(len(items) * sizeof(char *))
                for j, b in enumerate(items):
                    strs[j] = b
                gguf_set_arr_str(g, bkey, strs, len(items))
                free(strs)
                strs = NULL
            elif (isinstance(val, (list, tuple, np.ndarray)) and len(val)
                  and all(isinstance(v, (int, np.integer)) for v in val)):
                i32 = np.ascontiguousarray(val, dtype=np.int32)
                gguf_set_arr_data(g, bkey, GGUF_TYPE_INT32, &i32[0], i32.shape[0])
            elif isinstance(val, (list, tuple, np.ndarray)) and len(val):
                f32 = np.ascontiguousarray(val, dtype=np.float32)
                gguf_set_arr_data(g, bkey, GGUF_TYPE_FLOAT32, &f32[0], f32.shape[0])
            else:
                raise TypeError(f"metadata value for {key!r} has an unsupported type: {type(val).__name__}")
        for name, tname in (tensor_types or {}).items():
            if tname not in _WEIGHT_TYPES:
                raise ValueError(f"tensor type {tname!r} for {name!r}: expected one of {sorted(_WEIGHT_TYPES)}")
            bname = name.encode()
            if len(bname) >= 64:
                raise ValueError(f"tensor name too long: {name!r}")
            memset(&t, 0, sizeof(t))
            t.type = _WEIGHT_TYPES[tname]
            strncpy(t.name, bname, 63)
            gguf_add_tensor(g, &t)
    except BaseException:
        free(strs)
        gguf_free(g)
        raise
    return g


def random_model(dict kv, dict tensor_types=None, *, uint64_t seed=42, float stdev=0.1,
                 int n_gpu_layers=-1, split_mode="layer", int main_gpu=0, tensor_split=None):
    """A random-weight model made by llama_model_init_from_user from GGUF metadata (no file).

    Tensors are F32 unless tensor_types maps their names to "f16"/"bf16". Weights are normal with
    the given stdev, a pure function of (seed, tensor name).
    """
    cdef float * split_buf = <float *> calloc(llama_max_devices(), sizeof(float))
    cdef gguf_context * g = NULL
    cdef llama_model_params p
    try:
        p = Model._params(n_gpu_layers, split_mode, main_gpu, split_buf, tensor_split, True)
        g = _gguf_from_dict(kv, tensor_types or {})
        return _random_model(g, p, seed, stdev, "random_model")
    finally:
        free(split_buf)
        if g != NULL:
            gguf_free(g)


cdef Model _random_model(gguf_context * g, llama_model_params p, uint64_t seed, float stdev, str what):
    """The model that metadata g describes, with _fill_random weights; `what` prefixes errors."""
    cdef llama_model * ptr
    cdef _RandomInit init
    init.seed = seed
    init.stdev = stdev
    init.failed = 0
    _take_last_error()
    with nogil:
        ptr = llama_model_init_from_user(g, _fill_random, &init, p)
    _null_check(ptr, ModelLoadError, f"{what}: llama_model_init_from_user failed")
    if init.failed:
        llama_model_free(ptr)
        raise ModelLoadError(f"{what}: could not initialise the tensors (out of memory or unsupported type)")
    return Model._adopt(ptr, None)


# ---------------------------------------------------------------------------------------------
# test-llama-archs fixtures

cdef extern from "arch-fixtures.h" nogil:
    enum:
        PYLLAMA_SO_ARCH_KNOWN
        PYLLAMA_SO_ARCH_SUPPORTED
        PYLLAMA_SO_ARCH_MOE
        PYLLAMA_SO_ARCH_MOE_MANDATORY
        PYLLAMA_SO_ARCH_ENCODE
        PYLLAMA_SO_ARCH_SM_TENSOR
        PYLLAMA_SO_ARCH_SAVER
        PYLLAMA_SO_ARCH_MQA
    size_t pyllama_so_arch_count()
    const char * pyllama_so_arch_name(size_t i)
    uint32_t pyllama_so_arch_flags(const char * arch)
    gguf_context * pyllama_so_arch_metadata(const char * arch, bint moe, bint mqa)


def arch_names():
    """The architectures of upstream's test-llama-archs table, in its order."""
    return [(<bytes> pyllama_so_arch_name(i)).decode() for i in range(pyllama_so_arch_count())]


def arch_flags(str arch):
    """What upstream's test does with an architecture: which variants exist and which checks apply."""
    cdef uint32_t f = pyllama_so_arch_flags(arch.encode())
    if not f & PYLLAMA_SO_ARCH_KNOWN:
        raise ValueError(f"unknown architecture {arch!r}")
    return {
        "supported": bool(f & PYLLAMA_SO_ARCH_SUPPORTED),
        "moe": bool(f & PYLLAMA_SO_ARCH_MOE),
        "moe_mandatory": bool(f & PYLLAMA_SO_ARCH_MOE_MANDATORY),
        "encode": bool(f & PYLLAMA_SO_ARCH_ENCODE),
        "sm_tensor": bool(f & PYLLAMA_SO_ARCH_SM_TENSOR),
        "saver": bool(f & PYLLAMA_SO_ARCH_SAVER),
        "mqa": bool(f & PYLLAMA_SO_ARCH_MQA),
    }


cdef llama_model_params _arch_model_params(list device_indices, str split_mode, ggml_backend_dev_t * devs,
                                           float * attn_buf=NULL, object attn_split=None) except *:
    """Model params on exactly these devices (devs: room for len(device_indices) + 1 entries; attn_buf:
    llama_max_devices() entries when attn_split is given)."""
    cdef llama_model_params p = Model._params(-1, split_mode, 0, NULL, None, True, attn_buf, attn_split,
                                              max(1, len(device_indices)))
    cdef size_t n_dev = ggml_backend_dev_count()
    for k, i in enumerate(device_indices):
        if not 0 <= i < n_dev:
            raise ValueError(f"no device {i} (there are {n_dev})")
        devs[k] = ggml_backend_dev_get(i)
    devs[len(device_indices)] = NULL
    p.devices = devs        # an empty list: no devices, everything on the CPU
    return p


def arch_model(str arch, bint moe, list device_indices, str split_mode="layer", *, uint64_t seed=42,
               float stdev=0.1, drop_keys=(), attn_split=None, bint mqa=False):
    """A random-weight model of the architecture's test fixture, on the given ggml devices (attn_split:
    split_mode "tensor" only, one proportion per device; mqa: the MQA variant, four query heads and one KV
    head, dense only)."""
    if mqa and moe:
        raise ValueError("the MQA variant is dense: mqa and moe together")
    cdef gguf_context * g = pyllama_so_arch_metadata(arch.encode(), moe, mqa)
    if g == NULL:
        raise ValueError(f"unknown architecture {arch!r}")
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> calloc(len(device_indices) + 1, sizeof(ggml_backend_dev_t))
    cdef float * attn_buf = <float *> calloc(llama_max_devices(), sizeof(float))
    cdef llama_model_params p
    try:
        for key in drop_keys:
            if gguf_remove_key(g, key.encode()) < 0:
                raise KeyError(key)
        p = _arch_model_params(device_indices, split_mode, devs, attn_buf, attn_split)
        return _random_model(g, p, seed, stdev, arch)
    finally:
        gguf_free(g)
        free(devs)
        free(attn_buf)


def arch_model_load(path, list device_indices, str split_mode="layer", *, attn_split=None):
    """Load a GGUF file (a saved fixture: the round trip's second half, or a real model) on exactly the given
    devices (attn_split: split_mode "tensor" only, one proportion per device)."""
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> calloc(len(device_indices) + 1, sizeof(ggml_backend_dev_t))
    cdef float * attn_buf = <float *> calloc(llama_max_devices(), sizeof(float))
    try:
        return Model._load(path, _arch_model_params(device_indices, split_mode, devs, attn_buf, attn_split))
    finally:
        free(devs)
        free(attn_buf)


def arch_model_save(Model model, path):
    """Write the model with llama_model_saver (upstream's round trip)."""
    model._check_open()
    cdef bytes bpath = str(path).encode()
    cdef const char * cpath = bpath
    with nogil:
        llama_model_save_to_file(model.ptr, cpath)
    if not os.path.exists(path):
        raise LlamaError(f"could not save the model to {path}")


def arch_logits(Context ctx, tokens, bint encode=False):
    """Logits of every token, decoded as one batch in ctx, as float32 (n_tokens, n_vocab).
    With encode, the same tokens go through llama_encode first, as in upstream's test."""
    ctx._check_open()
    cdef int32_t[::1] toks
    cdef int32_t n, rc
    if encode:
        toks = ctx.model._tokens(tokens)
        n = toks.shape[0]
        if n > ctx.batch_cap:
            raise ValueError(f"{n} tokens do not fit one batch of {ctx.batch_cap}")
        ctx._fill_batch(_StepPlan.sequence(toks, 0, 0, 0), 0, n)
        with nogil:
            rc = llama_encode(ctx.ptr, ctx.batch)
        _check_decode(rc, "encode", "llama_encode")
    return ctx.decode(tokens, all_logits=True)


def arch_causal_toggle_ok(Context ctx, tokens):
    """Upstream's check_causal_attn_toggle: with causal attention off, decode n_ubatch/2 then n_ubatch
    more tokens after what is cached; every run must succeed with NaN-free logits for its last token."""
    ctx._check_open()
    cdef int32_t n_ubatch = llama_n_ubatch(ctx.ptr)
    cdef llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(ctx.ptr), 0) + 1
    if len(tokens) < n_ubatch or pos + n_ubatch // 2 + n_ubatch > <llama_pos> llama_n_ctx(ctx.ptr):
        raise ValueError("not enough tokens or context for the causal-attention toggle check")
    llama_set_causal_attn(ctx.ptr, False)
    try:
        for n_tok in (n_ubatch // 2, n_ubatch):
            try:
                logits = ctx.decode(tokens[:n_tok], all_logits=True)
            except (LlamaError, ValueError):  # any llama_decode failure fails the check, as upstream's
                return False
            if np.isnan(logits[len(logits) - 1]).any():  # (no negative index: wraparound is off here)
                return False
    finally:
        llama_set_causal_attn(ctx.ptr, True)
    return True


# ---------------------------------------------------------------------------------------------
# split-overlap race fixtures

cdef extern from "lane-fixtures.h" nogil:
    int pyllama_so_testing_delay_lane(llama_context * ctx, int32_t lane, int64_t delay_us)
    size_t pyllama_so_testing_compute_bytes(const llama_context * ctx)
    int pyllama_so_testing_context_bytes(const llama_context * ctx, const char ** names, size_t * bytes, int n_out)
    int pyllama_so_testing_kv_cell_bytes(const llama_context * ctx, ggml_type type_k, ggml_type type_v,
                                         size_t * out, int n_out)
    int pyllama_so_testing_weight_split(const llama_model * model, const char * name, int64_t * ne, int n_out,
                                        int * n_dev)
    int pyllama_so_testing_lane_race(const int * device_indices, int n_devs, int n_subgraphs, int n_ubatches,
                                     int lanes, int64_t delay_us_lane0, int64_t delay_us_lane1, float * out)


def delay_lane(Context ctx, int lane, int64_t delay_us):
    """Delay every graph of one split-overlap lane's CPU virtual devices; returns how many were delayed."""
    ctx._check_open()
    return pyllama_so_testing_delay_lane(ctx.ptr, lane, delay_us)


def compute_bytes(Context ctx):
    """Compute-buffer bytes in llama.cpp's memory breakdown of the context (every device, both lanes)."""
    ctx._check_open()
    return pyllama_so_testing_compute_bytes(ctx.ptr)


def context_bytes(Context ctx):
    """Context (KV cache, recurrent state) bytes per buffer type in llama.cpp's memory breakdown, as a dict
    {buffer type name: bytes}; a Meta buffer type counts each buffer's largest device, as upstream reports it."""
    ctx._check_open()
    cdef const char * names[64]
    cdef size_t sizes[64]
    cdef int n = pyllama_so_testing_context_bytes(ctx.ptr, names, sizes, 64)
    return {(<bytes> names[i]).decode(): sizes[i] for i in range(min(n, 64))}


def kv_cell_bytes(Context ctx, type_k="f16", type_v="f16"):
    """Bytes of one KV cell (K and V rows of every attention layer) per device of the model's tensor split,
    where the Meta backend puts them (the model's split function on the KV cache tensors); one entry when
    the model is not split by tensor."""
    ctx._check_open()
    cdef size_t out[64]
    cdef int n = pyllama_so_testing_kv_cell_bytes(ctx.ptr, <ggml_type> <int> _CACHE_TYPES[cache_type_name(type_k)],
                                                  <ggml_type> <int> _CACHE_TYPES[cache_type_name(type_v)], out, 64)
    if n < 0:
        raise RuntimeError(f"pyllama_so_testing_kv_cell_bytes failed ({n})")
    return [out[i] for i in range(n)]


_SPLIT_AXES = {0: "0", 1: "1", 2: "2", 3: "3", 10: "mirrored", 11: "partial"}


def weight_split(Model model, str name):
    """Where the model's tensor split puts a weight: (axis, [slice size per device]); axis is "0".."3" (the sizes
    along it) or "mirrored" (every device holds all of it; sizes 0)."""
    model._check_open()
    cdef int64_t ne[64]
    cdef bytes bname = name.encode()
    cdef int n_dev = 0
    cdef int axis = pyllama_so_testing_weight_split(model.ptr, bname, ne, 64, &n_dev)
    if axis == -1:
        raise ValueError("the model is not split by tensor")
    if axis == -2:
        raise KeyError(name)
    return _SPLIT_AXES.get(axis, str(axis)), [ne[j] for j in range(n_dev)]


def lane_race(list device_indices, int n_subgraphs=6, int n_ubatches=8, bint lanes=True, delays_us=(0, 0)):
    """The ggml-level race fixture (testing/lane-race-fixture.cpp): state written in the first subgraph
    and read in the last, ubatches alternating between two linked lanes (or on one Meta backend), each
    lane's devices delayed by its entry of delays_us per graph. Returns the outputs, float32
    (n_ubatches, floats per ubatch)."""
    cdef int idx[3]
    if not 2 <= len(device_indices) <= 3:
        raise ValueError("lane_race takes 2 or 3 devices")
    for k, i in enumerate(device_indices):
        idx[k] = i
    out = np.zeros((n_ubatches, 64 * 8), dtype=np.float32)
    cdef float[:, ::1] out_mv = out
    cdef int rc
    cdef int n_devs = len(device_indices)
    cdef int64_t d0 = delays_us[0], d1 = delays_us[1]
    with nogil:
        rc = pyllama_so_testing_lane_race(idx, n_devs, n_subgraphs, n_ubatches, lanes, d0, d1, &out_mv[0, 0])
    if rc < 0:
        raise LlamaError(f"lane race fixture failed ({rc})")
    if rc != out.shape[1]:
        raise LlamaError(f"lane race fixture returned {rc} floats per ubatch, expected {out.shape[1]}")
    return out
