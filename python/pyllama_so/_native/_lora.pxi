# LoRA adapters: loaded for a model (llama_adapter_lora_init) and applied to a context with a scale
# (llama_set_adapters_lora). Included by _llama.pyx.


cdef class LoraAdapter:
    """A LoRA adapter GGUF (general.type "adapter", adapter.type "lora") loaded for a Model. It lives as
    long as the model; free() (idempotent) releases it earlier, after no context uses it any more."""

    def __cinit__(self):
        self.ptr = NULL

    def __init__(self, Model model, path):
        model._check_open()
        if model.vocab_only:
            raise ValueError("the model was loaded with vocab_only=True (no weights): a LoRA adapter needs them")
        p = os.fspath(path)
        if not os.path.isfile(p):
            raise FileNotFoundError(f"LoRA adapter not found: {p}")
        cdef bytes bpath = str(p).encode()
        cdef const char * cpath = bpath
        _take_last_error()
        with nogil:
            self.ptr = llama_adapter_lora_init(model.ptr, cpath)
        _null_check(self.ptr, ModelLoadError, f"failed to load the LoRA adapter {p}")
        self.model = model
        self.path = str(p)

    def free(self):
        """Free the adapter now (llama.cpp frees it with its model otherwise). Idempotent."""
        if self.ptr != NULL and self.model is not None and not self.model.closed:
            llama_adapter_lora_free(self.ptr)
        self.ptr = NULL

    @property
    def closed(self):
        return self.ptr == NULL

    def meta(self, str key):
        """A scalar metadata value of the adapter's GGUF as a string, or None."""
        if self.ptr == NULL:
            raise ValueError("the LoRA adapter is freed")
        cdef char buf[256]
        n = llama_adapter_meta_val_str(self.ptr, key.encode(), buf, sizeof(buf))
        return None if n < 0 else (<bytes> buf).decode("utf-8", "replace")


def set_lora_adapters(Context ctx, adapters):
    """Apply (adapter, scale) pairs to the context from its next decode on, replacing those it had;
    an empty list removes them. A scale of 0 leaves that adapter out (llama.cpp)."""
    ctx._check_open()
    pairs = [(a, float(s)) for a, s in adapters]
    for a, s in pairs:
        if not isinstance(a, LoraAdapter) or (<LoraAdapter> a).ptr == NULL:
            raise ValueError("adapters must be open LoraAdapter objects")
        if (<LoraAdapter> a).model is not ctx.model:
            raise ValueError(f"the LoRA adapter {(<LoraAdapter> a).path} was loaded for another model")
        if not math.isfinite(s):
            raise ValueError(f"lora_scale must be finite, got {s}")
    cdef size_t n = len(pairs), i
    cdef llama_adapter_lora ** ptrs = <llama_adapter_lora **> calloc(max(n, 1), sizeof(llama_adapter_lora *))
    cdef float * scales = <float *> calloc(max(n, 1), sizeof(float))
    try:
        for i in range(n):
            ptrs[i] = (<LoraAdapter> pairs[i][0]).ptr
            scales[i] = pairs[i][1]
        if llama_set_adapters_lora(ctx.ptr, ptrs if n else NULL, n, scales if n else NULL) != 0:
            raise LlamaError("llama_set_adapters_lora failed")
    finally:
        free(ptrs)
        free(scales)
