# Quantization with llama.cpp's llama_model_quantize. Included by _llama.pyx.

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


def quantize_model(src, dst, str ftype, int n_threads=0, bint allow_requantize=False, token_embedding_type=None,
                   output_tensor_type=None):
    """Quantize the GGUF model file src into dst with llama.cpp's llama_model_quantize.

    ftype is a key of FTYPES ("q4_k_m", "q4_0", "q8_0", ...). llama.cpp chooses each tensor's type as
    llama-quantize does: 1-D tensors stay F32, the K-quant _s/_m/_l types mix in larger types for some
    tensors, and a tensor whose rows are not a whole number of the type's blocks gets a fallback type
    (Q4_K -> Q5_0, Q6_K -> Q8_0 for rows of 128). n_threads <= 0 uses every hardware thread.
    allow_requantize: also convert tensors that are quantized already (llama-quantize --allow-requantize),
    e.g. to "f32" to dequantize a quantized model. token_embedding_type, output_tensor_type: the type of
    token_embd.weight and of output.weight instead of llama.cpp's choice (llama-quantize's
    --token-embedding-type / --output-tensor-type), one of CACHE_TYPES' names: a model whose rows are not a
    whole number of 256-blocks (Gemma 3 270M's 640) otherwise keeps its embeddings in Q8_0.
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
    p.allow_requantize = allow_requantize
    if token_embedding_type is not None:
        p.token_embedding_type = CACHE_TYPES[cache_type_name(token_embedding_type, "token_embedding_type")]
    if output_tensor_type is not None:
        p.output_tensor_type = CACHE_TYPES[cache_type_name(output_tensor_type, "output_tensor_type")]
    cdef uint32_t rc
    _take_last_error()  # a stale message must not become this call's detail
    with nogil:
        rc = llama_model_quantize(csrc, cdst, &p)
    _check_quantize(rc, f"cannot quantize {src} to {ftype} in {dst}")
