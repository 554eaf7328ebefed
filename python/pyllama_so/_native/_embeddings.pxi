# Embeddings: several sequences decoded in one batch of an embedding context, read back per token
# (pooling "none") or per sequence (llama.cpp's pooled output). Included by _llama.pyx.


@cython.boundscheck(False)  # the per-token batch loop; every index is checked against the batch above
@cython.wraparound(False)
def embed_sequences(Context ctx, list sequences):
    """Embeddings of each token list, all decoded in one llama_decode call from an empty memory, each as
    its own sequence (seq_id = its index). Returns one float32 array per sequence: (n_tokens, n_embd_out)
    with pooling "none", else the pooled (n_embd_out,) (with "rank": the classifier's n_cls_out scores).

    The context must output embeddings (set_embeddings(True)); all tokens together must fit one ubatch
    (a pooled sequence must not straddle two) and the sequences n_seq_max. The memory is empty after."""
    ctx._check_open()
    if not ctx.embeddings:
        raise ValueError("the context does not output embeddings: call set_embeddings(True) first")
    arrays = [np.asarray(ctx.model._tokens(t)) for t in sequences]
    if not arrays or any(a.shape[0] == 0 for a in arrays):
        raise ValueError("every sequence needs at least one token")
    cdef uint32_t n_seq_max = llama_n_seq_max(ctx.ptr)
    if <uint32_t> len(arrays) > n_seq_max:
        raise ValueError(f"{len(arrays)} sequences exceed the context's n_seq_max of {n_seq_max}")
    cdef int32_t limit = min(ctx.batch_cap, <int32_t> llama_n_ubatch(ctx.ptr))
    cdef int32_t total = sum(a.shape[0] for a in arrays)
    if total > limit:
        raise ValueError(f"{total} tokens exceed one batch of {limit} (n_batch and n_ubatch) for embeddings")
    cdef int32_t[::1] tok = np.concatenate(arrays).astype(np.int32)
    cdef int32_t[::1] seq = np.repeat(np.arange(len(arrays), dtype=np.int32), [a.shape[0] for a in arrays])
    cdef int32_t[::1] pos = np.concatenate([np.arange(a.shape[0], dtype=np.int32) for a in arrays])
    cdef int32_t i, rc
    for i in range(total):
        ctx.batch.token[i] = tok[i]
        ctx.batch.pos[i] = pos[i]
        ctx.batch.n_seq_id[i] = 1
        ctx.batch.seq_id[i][0] = seq[i]
        ctx.batch.logits[i] = 1  # llama.cpp outputs every token of an embedding batch anyway
    ctx.batch.n_tokens = total
    cdef llama_memory_t mem = llama_get_memory(ctx.ptr)
    with nogil:
        llama_memory_clear(mem, True)
        rc = llama_decode(ctx.ptr, ctx.batch)
    try:
        if rc != 0:
            _check_rpc_servers(ctx.model.rpc_servers, "embedding")
        _check_decode(rc, "embedding")
        return _read_embeddings(ctx, arrays)
    finally:
        llama_memory_clear(mem, True)
        ctx.n_last_outputs = 0


cdef list _read_embeddings(Context ctx, list arrays):
    cdef bint per_token = llama_get_pooling_type(ctx.ptr) == LLAMA_POOLING_TYPE_NONE
    cdef bint rank = llama_get_pooling_type(ctx.ptr) == LLAMA_POOLING_TYPE_RANK
    cdef int32_t width = llama_model_n_cls_out(ctx.model.ptr) if rank else llama_model_n_embd_out(ctx.model.ptr)
    cdef int32_t s, j, row = 0
    cdef const float * src
    cdef float[:, ::1] mat
    out = []
    for s in range(len(arrays)):
        if per_token:
            n = arrays[s].shape[0]
            emb = np.empty((n, width), dtype=np.float32)
            mat = emb
            for j in range(n):
                src = llama_get_embeddings_ith(ctx.ptr, row + j)
                if src == NULL:
                    raise DecodeError(f"no embedding for token {j} of sequence {s}")
                memcpy(&mat[j, 0], src, width * sizeof(float))
            row += n
        else:
            src = llama_get_embeddings_seq(ctx.ptr, s)
            if src == NULL:
                raise DecodeError(f"no pooled embedding for sequence {s}")
            emb = np.asarray(<float[:width]> <float *> src).copy()
        out.append(emb)
    return out
