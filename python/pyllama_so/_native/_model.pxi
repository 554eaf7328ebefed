# The model: loading a GGUF file, its metadata, the vocabulary. Included by _llama.pyx.

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


cdef llama_model_kv_override * _kv_override_array(list items) except NULL:
    """The C array of check_kv_overrides' items, terminated by an entry with an empty key (free it after
    the load: llama.cpp copies the overrides while loading)."""
    cdef llama_model_kv_override * arr = <llama_model_kv_override *> calloc(
        len(items) + 1, sizeof(llama_model_kv_override))
    cdef bytes bkey, bval
    if arr == NULL:
        raise MemoryError()
    for i, (key, kind, value) in enumerate(items):
        bkey = key.encode()
        strncpy(arr[i].key, bkey, sizeof(arr[i].key) - 1)
        if kind == "bool":
            arr[i].tag = LLAMA_KV_OVERRIDE_TYPE_BOOL
            arr[i].val_bool = value
        elif kind == "int":
            arr[i].tag = LLAMA_KV_OVERRIDE_TYPE_INT
            arr[i].val_i64 = value
        elif kind == "float":
            arr[i].tag = LLAMA_KV_OVERRIDE_TYPE_FLOAT
            arr[i].val_f64 = value
        else:
            bval = value.encode()
            arr[i].tag = LLAMA_KV_OVERRIDE_TYPE_STR
            strncpy(arr[i].val_str, bval, sizeof(arr[i].val_str) - 1)
    return arr


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
            # split_buf has llama_max_devices() entries
            for i, v in enumerate(check_tensor_split(tensor_split, n_devices)):
                split_buf[i] = v
            p.tensor_split = split_buf
        if attn_split is not None:
            check_tensor_split_only("attn_split", split_mode)
            for i, v in enumerate(check_attn_split(attn_split, n_devices)):
                attn_buf[i] = v
            p.attn_split = attn_buf
        return p

    @staticmethod
    def load(path, *, int n_gpu_layers=-1, split_mode="layer", int main_gpu=0, tensor_split=None,
             bint use_mmap=True, progress=None, attn_split=None, rpc_servers=None, bint vocab_only=False,
             kv_overrides=None):
        """Load a GGUF file. Raises ModelLoadError for a file llama.cpp cannot load (Llama checks that it exists).
        attn_split (split_mode "tensor" only): the attention heads' and KV cache's proportions per device.
        rpc_servers ("host:port" list or comma-separated string): the devices of these RPC servers come
        first, then the local ones (tensor_split and main_gpu count them in that order); RPCConnectionError
        for a server that cannot be reached. vocab_only: the vocabulary and metadata without the weights
        (tokenizing only; no Context can be made on it). kv_overrides: GGUF metadata key -> bool/int/float/str
        replacing the file's values while loading (check_kv_overrides; a value of the wrong type for its key
        is ignored by llama.cpp with a warning)."""
        overrides = check_kv_overrides(kv_overrides) if kv_overrides is not None else []
        cdef float * split_buf = <float *> calloc(llama_max_devices(), sizeof(float))
        cdef float * attn_buf = <float *> calloc(llama_max_devices(), sizeof(float))
        cdef llama_model_kv_override * kvo = NULL
        cdef llama_model_params p
        cdef vector[ggml_backend_dev_t] devs
        cdef Model model
        endpoints = rpc_endpoints(rpc_servers) if rpc_servers is not None else []
        progress_state = [progress, None]
        try:
            if endpoints:
                devs = _rpc_model_devices(endpoints, split_mode_name(split_mode))
                if split_mode_name(split_mode) == "none":
                    check_main_gpu(main_gpu, devs.size())
                devs.push_back(NULL)
            p = Model._params(n_gpu_layers, split_mode, main_gpu, split_buf, tensor_split, use_mmap,
                              attn_buf, attn_split, devs.size() - 1 if endpoints else None)
            if endpoints:
                p.devices = devs.data()
            if progress is not None:
                p.progress_callback = _python_progress
                p.progress_callback_user_data = <void *> progress_state
            p.vocab_only = vocab_only
            if overrides:
                kvo = _kv_override_array(overrides)
                p.kv_overrides = kvo
            model = Model._load(path, p)
            model.rpc_servers = tuple(endpoints)
            model.kv_overrides = {k: v for k, _, v in overrides}
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
            free(kvo)

    @staticmethod
    cdef Model _load(path, llama_model_params p):
        """llama_model_load_from_file with these params; ModelLoadError when llama.cpp rejects it."""
        cdef Model self = Model.__new__(Model)
        cdef bytes bpath = str(path).encode()
        cdef const char * cpath = bpath
        _take_last_error()
        cdef int log_threshold = _quiet_load_begin()
        with nogil:
            self.ptr = llama_model_load_from_file(cpath, p)
        _quiet_load_end(log_threshold)
        _null_check(self.ptr, ModelLoadError, f"failed to load model from {path}")
        self.vocab = llama_model_get_vocab(self.ptr)
        self.path = str(path)
        self.rpc_servers = ()
        self.vocab_only = p.vocab_only
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

    @property
    def n_embd_out(self):
        """Width of an output embedding (n_embd for most models)."""
        self._check_open()
        return llama_model_n_embd_out(self.ptr)

    @property
    def n_cls_out(self):
        """Outputs of a reranking model's classifier head (what pooling "rank" gives per sequence)."""
        self._check_open()
        return llama_model_n_cls_out(self.ptr)

    @property
    def has_encoder(self):
        self._check_open()
        return llama_model_has_encoder(self.ptr)

    @property
    def has_decoder(self):
        self._check_open()
        return llama_model_has_decoder(self.ptr)

    @property
    def pooling_type(self):
        """The model's own pooling for embeddings ("<arch>.pooling_type", from kv_overrides when one gives
        it an int as llama.cpp takes it): a POOLING_TYPES name, or "unspecified" when there is none
        (llama.cpp then pools with "none")."""
        key = f"{self.meta('general.architecture')}.pooling_type"
        value = (self.kv_overrides or {}).get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            value = self.meta(key)
        if value is None:
            return "unspecified"
        try:
            return pooling_type_name(int(value))
        except ValueError:
            return "unspecified"  # a value llama.cpp does not know either

    def meta(self, str key):
        """A metadata value as a string, or None (arrays are not available, as in llama.cpp's API)."""
        self._check_open()
        cdef bytes bkey = key.encode()
        cdef int32_t n = llama_model_meta_val_str(self.ptr, bkey, NULL, 0)
        if n < 0:
            return None
        cdef char * buf = <char *> malloc(n + 1)
        try:
            llama_model_meta_val_str(self.ptr, bkey, buf, n + 1)
            return PyBytes_FromStringAndSize(buf, n).decode("utf-8", "replace")
        finally:
            free(buf)

    def metadata(self):
        """Every scalar GGUF metadata key -> its value as a string (llama_model_meta_*_by_index), as
        llama-cpp-python's Llama.metadata. Arrays (the vocabulary, ...) are left out by llama.cpp."""
        self._check_open()
        out = {}
        cdef int32_t i, n
        cdef char * buf = NULL
        for i in range(llama_model_meta_count(self.ptr)):
            pair = []
            for by_index in (0, 1):
                n = (llama_model_meta_key_by_index(self.ptr, i, NULL, 0) if by_index == 0
                     else llama_model_meta_val_str_by_index(self.ptr, i, NULL, 0))
                if n < 0:
                    break
                buf = <char *> malloc(n + 1)
                try:
                    if by_index == 0:
                        llama_model_meta_key_by_index(self.ptr, i, buf, n + 1)
                    else:
                        llama_model_meta_val_str_by_index(self.ptr, i, buf, n + 1)
                    pair.append(PyBytes_FromStringAndSize(buf, n).decode("utf-8", "replace"))
                finally:
                    free(buf)
            if len(pair) == 2:
                out[pair[0]] = pair[1]
        return out

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
    def token_nl(self):
        self._check_open()
        return llama_vocab_nl(self.vocab)

    @property
    def fim_tokens(self):
        """The vocabulary's fill-in-the-middle tokens, {"pre", "suf", "mid", "pad", "rep", "sep"} -> id, or
        None where the vocabulary has none (LLAMA_TOKEN_NULL)."""
        self._check_open()
        ids = {"pre": llama_vocab_fim_pre(self.vocab), "suf": llama_vocab_fim_suf(self.vocab),
               "mid": llama_vocab_fim_mid(self.vocab), "pad": llama_vocab_fim_pad(self.vocab),
               "rep": llama_vocab_fim_rep(self.vocab), "sep": llama_vocab_fim_sep(self.vocab)}
        return {k: (None if v < 0 else v) for k, v in ids.items()}

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

    def detokenize_pieces(self, tokens, *, bint special=False):
        """The tokens' pieces (llama_token_to_piece, no space stripped) joined, as llama-cpp-python
        detokenizes; llama_detokenize (detokenize_bytes) instead drops a SentencePiece model's leading
        space and cleans spaces up as the model's tokenizer says."""
        self._check_open()
        cdef int32_t[::1] toks = self._tokens(tokens)
        cdef Py_ssize_t n_tok = toks.shape[0], i
        cdef int32_t cap = 256, n
        cdef char * buf = <char *> malloc(cap)
        cdef char * grown
        parts = []
        try:
            for i in range(n_tok):
                n = llama_token_to_piece(self.vocab, toks[i], buf, cap, 0, special)
                if n < 0:
                    grown = <char *> realloc(buf, -n)
                    if grown == NULL:
                        raise MemoryError()
                    buf, cap = grown, -n
                    n = llama_token_to_piece(self.vocab, toks[i], buf, cap, 0, special)
                if n < 0:
                    raise LlamaError(f"token {toks[i]}: no piece")
                parts.append(PyBytes_FromStringAndSize(buf, n))
        finally:
            free(buf)
        return b"".join(parts)

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
