# The state of a context (KV cache, last logits and embeddings) as bytes, and back: llama_state_*.
# Included by _llama.pyx.


def context_state(Context ctx):
    """The context's state as bytes (llama_state_get_size / llama_state_get_data)."""
    ctx._check_open()
    _take_last_error()
    cdef size_t size = llama_state_get_size(ctx.ptr)
    if size == 0:
        raise LlamaError(f"llama_state_get_size failed: {_take_last_error() or 'no reason logged'}")
    cdef uint8_t * buf = <uint8_t *> malloc(size)
    cdef size_t n
    if buf == NULL:
        raise MemoryError()
    try:
        with nogil:
            n = llama_state_get_data(ctx.ptr, buf, size)
        if n == 0 or n > size:
            raise LlamaError(f"llama_state_get_data failed: {_take_last_error() or 'no reason logged'}")
        return PyBytes_FromStringAndSize(<char *> buf, n)
    finally:
        free(buf)


def set_context_state(Context ctx, const uint8_t[::1] data):
    """Restore a state from context_state() (llama_state_set_data). A state of another model or context
    shape is a LlamaError with llama.cpp's reason; the context is then empty."""
    ctx._check_open()
    if data.shape[0] == 0:
        raise ValueError("the state is empty")
    cdef size_t n
    _take_last_error()
    with nogil:
        n = llama_state_set_data(ctx.ptr, &data[0], data.shape[0])
    if n != <size_t> data.shape[0]:
        reason = _take_last_error()
        llama_memory_clear(llama_get_memory(ctx.ptr), True)
        raise LlamaError(f"llama_state_set_data read {n} of {data.shape[0]} bytes: "
                         f"{reason.strip() if reason else 'the state does not fit this context'}")
    ctx.n_last_outputs = 1
