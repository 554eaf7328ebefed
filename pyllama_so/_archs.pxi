# Included at the end of _llama.pyx: bindings for the per-architecture tests (pyllama_so.archs),
# equivalent to upstream's tests/test-llama-archs.cpp, and for the CPU virtual devices they run on.

cdef extern from "ggml-cpu-virtual.h" nogil:
    size_t ggml_backend_cpu_virtual_init(size_t n)


cdef extern from "pyllama-so-archs.h" nogil:
    enum:
        PYLLAMA_SO_ARCH_KNOWN
        PYLLAMA_SO_ARCH_SUPPORTED
        PYLLAMA_SO_ARCH_MOE
        PYLLAMA_SO_ARCH_MOE_MANDATORY
        PYLLAMA_SO_ARCH_ENCODE
        PYLLAMA_SO_ARCH_SM_TENSOR
        PYLLAMA_SO_ARCH_SAVER
    size_t pyllama_so_arch_count()
    const char * pyllama_so_arch_name(size_t i)
    uint32_t pyllama_so_arch_flags(const char * arch)
    gguf_context * pyllama_so_arch_metadata(const char * arch, bint moe)


def cpu_virtual_devices(int n):
    """Make n CPU virtual devices (named CPUV0..) if none exist yet; return how many exist.

    GGML_CPU_VIRTUAL_DEVICES=N creates them at start-up instead. See ggml/include/ggml-cpu-virtual.h.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    return ggml_backend_cpu_virtual_init(n)


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
    }


cdef llama_model_params _arch_model_params(list device_indices, str split_mode, ggml_backend_dev_t * devs) except *:
    """Model params on exactly these devices (devs: room for len(device_indices) + 1 entries)."""
    cdef llama_model_params p = Model._params(-1, split_mode, 0, NULL, None, True)
    cdef size_t n_dev = ggml_backend_dev_count()
    for k, i in enumerate(device_indices):
        if not 0 <= i < n_dev:
            raise ValueError(f"no device {i} (there are {n_dev})")
        devs[k] = ggml_backend_dev_get(i)
    devs[len(device_indices)] = NULL
    p.devices = devs        # an empty list: no devices, everything on the CPU
    return p


def arch_model(str arch, bint moe, list device_indices, str split_mode="layer", *, uint64_t seed=42,
               float stdev=0.1, drop_keys=()):
    """A random-weight model of the architecture's test fixture, on the given ggml devices."""
    cdef gguf_context * g = pyllama_so_arch_metadata(arch.encode(), moe)
    if g == NULL:
        raise ValueError(f"unknown architecture {arch!r}")
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> calloc(len(device_indices) + 1, sizeof(ggml_backend_dev_t))
    cdef llama_model_params p
    try:
        for key in drop_keys:
            if gguf_remove_key(g, key.encode()) < 0:
                raise KeyError(key)
        p = _arch_model_params(device_indices, split_mode, devs)
        return Model._random(g, p, seed, stdev, arch)
    finally:
        gguf_free(g)
        free(devs)


def arch_model_load(path, list device_indices, str split_mode="layer"):
    """Load a saved fixture on the given devices (the round trip's second half)."""
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> calloc(len(device_indices) + 1, sizeof(ggml_backend_dev_t))
    try:
        return Model._load(path, _arch_model_params(device_indices, split_mode, devs))
    finally:
        free(devs)


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
        ctx._fill_batch(toks, 0, n, 0, 0, True, n - 1)
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
