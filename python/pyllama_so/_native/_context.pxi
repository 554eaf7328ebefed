# The context: its settings and memory, decoding into one sequence or several (the step code itself, shared
# by every decode path, is in _step.pxi), logprobs, and the bench loops. Included by _llama.pyx.

cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t> ts.tv_sec * 1000000000 + ts.tv_nsec


def max_parallel_sequences():
    """The most sequences one context may hold (llama.cpp's LLAMA_MAX_SEQ)."""
    return llama_max_parallel_sequences()


cdef class Context:
    """A llama_context on a Model, with one reusable batch. Free with free() (idempotent)."""

    cdef int32_t _fill_batch(self, _StepPlan plan, int32_t start, int32_t end) noexcept nogil:
        """The batch fill of every decode path: tokens [start, end) of plan (flat, in the order of its items) into
        the batch, with an output where plan asks for one, except those of an item that may not go in
        (_StepPlan.take_sampled). Marks the items that went in; returns the batch's token count."""
        cdef int32_t j, t, lo, hi, nb = 0
        for j in range(plan.n_items):
            lo = max(start, plan.first[j])
            hi = min(end, plan.first[j] + plan.length[j])
            if lo >= hi or not plan.go[j]:
                continue
            for t in range(lo, hi):
                self.batch.token[nb] = plan.tok[t]
                self.batch.pos[nb] = plan.pos0[j] + t - plan.first[j]
                self.batch.n_seq_id[nb] = 1
                self.batch.seq_id[nb][0] = plan.seq[j]
                self.batch.logits[nb] = t - plan.first[j] >= plan.out_from[j]
                nb += 1
            plan.went[j] = 1
        self.batch.n_tokens = nb
        return nb

    def __cinit__(self):
        self.ptr = NULL
        self.batch_cap = 0
        self.backend_samplers = {}
        self.row_pool = _row_pool_new()
        # the rows of a step are sampled in parallel, on 3/4 of the CPUs this process may use: on 16 cores,
        # 12 threads sampled 32 rows 6 % faster than 8, 15 no faster than 12 (docs/benchmarks.md)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.sampling_threads = max(1, cpus * 3 // 4)

    def __init__(self, Model model, *, int n_ctx=0, int n_batch=2048, int n_ubatch=512, int n_seq_max=1,
                 int n_threads=-1, int n_threads_batch=-1, flash_attn="auto", type_k="f16",
                 type_v="f16", bint offload_kqv=True, bint op_offload=True, bint split_overlap=False,
                 bint embeddings=False, pooling_type=None, bint kv_unified=False, allreduce=None):
        """embeddings: made for embedding (llama.cpp reserves for it); set_embeddings() turns the output
        of embeddings on and off between decodes. pooling_type: POOLING_TYPES name or None (the model's).
        kv_unified: one KV buffer shared by the n_seq_max sequences, so that each may use all of n_ctx.
        allreduce: this context's AllReduce settings (a pyllama_so.config.AllReduceParams), None for the defaults."""
        model._check_open()
        if model.vocab_only:
            raise ValueError("the model was loaded with vocab_only=True (no weights): it has no context")
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
        p.embeddings = embeddings
        p.pooling_type = POOLING_TYPES[pooling_type_name(pooling_type)]
        p.kv_unified = kv_unified
        p.no_perf = True
        _take_last_error()
        cdef int log_threshold = _quiet_load_begin()
        with nogil:
            self.ptr = llama_init_from_model(model.ptr, p)
        _quiet_load_end(log_threshold)
        if self.ptr == NULL:
            _check_rpc_servers(model.rpc_servers, "creating the context")
        _null_check(self.ptr, LlamaError, "failed to create the context")
        self.model = model
        model.live_contexts += 1
        self.batch_cap = llama_n_batch(self.ptr)
        self.batch = llama_batch_init(self.batch_cap, 0, 1)
        self.rng = 0x2545F4914F6CDD1DULL
        self.embeddings = embeddings
        _check_rpc_servers(model.rpc_servers, "creating the context")  # on failure, freed with self
        if allreduce is not None:
            _context_allreduce_configure(self.ptr, allreduce)  # before any decode: its comm contexts take them now

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        self.running = None  # llama_free waits for the step still running
        if self.backend_samplers:  # None when the garbage collector cleared a cycle holding the context
            for smp in self.backend_samplers.values():
                (<Sampler> smp).backend = None
            self.backend_samplers.clear()
        _row_pool_free(self.row_pool)
        self.row_pool = NULL
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
        if self.running is not None:
            raise RuntimeError("a step of decode_batch_sample_begin() is running: call decode_batch_sample_end() "
                               "before anything else on this context")

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

    @property
    def pooling_type(self):
        """The pooling llama.cpp uses in this context (a POOLING_TYPES name; the model's unless asked)."""
        self._check_open()
        return pooling_type_name(<int> llama_get_pooling_type(self.ptr))

    @property
    def has_memory(self):
        """Whether the context keeps a KV cache (or recurrent state). Embedding-only architectures (BERT
        and its kin) have none: llama.cpp encodes each batch on its own, so they cannot generate."""
        self._check_open()
        return llama_get_memory(self.ptr) != NULL

    def set_embeddings(self, bint on):
        """Output embeddings (every token of a batch becomes an output) or not, from the next decode on."""
        self._check_open()
        llama_set_embeddings(self.ptr, on)
        self.embeddings = on

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

    def decode(self, tokens, *, int seq_id=0, bint all_logits=False, int logits_from=0):
        """Append tokens to a sequence; return logits as a float32 array of shape (n_out, n_vocab).

        n_out is len(tokens) - logits_from with all_logits (the tokens from index logits_from on: the
        model computes no output for the others), else 1 (the last token). The batch is cut into
        n_batch-sized llama_decode calls; the GIL is released during each.
        """
        self._check_open()
        cdef int32_t[::1] toks = self.model._tokens(tokens)
        cdef int32_t n = toks.shape[0]
        if n == 0:
            raise ValueError("no tokens to decode")
        if not 0 <= logits_from < n or (logits_from and not all_logits):
            raise ValueError(f"logits_from must be in 0..{n - 1} (the tokens given) and needs all_logits, "
                             f"got {logits_from}")
        cdef int32_t n_ctx = llama_n_ctx_seq(self.ptr)  # a sequence's share; all of n_ctx with one sequence
        cdef llama_pos pos0 = llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1
        if pos0 + n > n_ctx:
            raise ContextFullError(f"{pos0} cached + {n} new tokens exceed the context of {n_ctx} tokens")
        out = _run_step(self, _StepPlan.sequence(toks, pos0, seq_id, logits_from if all_logits else n - 1), "decode",
                        _OUT_COPY)
        self.n_last_outputs = out.shape[0]
        return out

    cdef int _decode_one(self, llama_token token, llama_pos pos, llama_seq_id seq_id) noexcept nogil:
        """llama_decode of one token with its logits (output 0)."""
        self.batch.token[0] = token
        self.batch.pos[0] = pos
        self.batch.n_seq_id[0] = 1
        self.batch.seq_id[0][0] = seq_id
        self.batch.logits[0] = 1
        self.batch.n_tokens = 1
        return llama_decode(self.ptr, self.batch)

    def decode_logprobs(self, tokens, int n_top=0, *, int seq_id=0, rows=None):
        """Append tokens to a sequence with an output at every token, and score them: for each token after
        the first, (log p(token | the tokens before it), [(id, log p) of the n_top most likely there]), from
        the previous token's logits row, computed in C as logprobs() does (len(tokens) - 1 entries). rows: a
        C-contiguous float32 array of shape (len(tokens), n_vocab) that receives each token's logits row
        (Llama's scores with logits_all). The last token's logits stay in the context (output -1).

        llama_decode calls of one ubatch each: the output buffer holds n_ubatch rows, not n_batch, and the
        ubatches are those of a decode() of the same tokens (the same rounding)."""
        self._check_open()
        if not 0 <= n_top <= MAX_LOGPROBS:
            raise ValueError(f"n_top must be in [0, {MAX_LOGPROBS}], got {n_top}")
        cdef int32_t[::1] toks = self.model._tokens(tokens)
        cdef int32_t n = toks.shape[0]
        if n == 0:
            raise ValueError("no tokens to decode")
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        cdef float[:, ::1] rows_mv
        if rows is not None:
            rows_mv = rows
            if rows_mv.shape[0] != n or rows_mv.shape[1] != n_vocab:
                raise ValueError(f"rows must have shape ({n}, {n_vocab}), got ({rows_mv.shape[0]}, {rows_mv.shape[1]})")
        cdef llama_pos pos0 = llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1
        if pos0 + n > llama_n_ctx_seq(self.ptr):
            raise ContextFullError(f"{pos0} cached + {n} new tokens exceed the context of "
                                   f"{llama_n_ctx_seq(self.ptr)} tokens")
        cdef int32_t done = 0, chunk, i, rc
        cdef const float * src
        cdef _StepPlan plan = _StepPlan.sequence(toks, pos0, seq_id, 0)
        out = []
        while done < n:
            chunk = min(n - done, self.batch_cap, <int32_t> llama_n_ubatch(self.ptr))
            self._fill_batch(plan, done, done + chunk)
            with nogil:
                rc = llama_decode(self.ptr, self.batch)
                if rc == 0:
                    llama_synchronize(self.ptr)
            if rc != 0:
                _check_rpc_servers(self.model.rpc_servers, "decode_logprobs")
            _check_decode(rc, "decode_logprobs")
            for i in range(chunk):
                src = llama_get_logits_ith(self.ptr, i)
                if src == NULL:
                    raise DecodeError("no logits for an output token")
                if rows is not None:
                    memcpy(&rows_mv[done + i, 0], src, n_vocab * sizeof(float))
                if done + i + 1 < n:
                    out.append(_row_logprobs(src, n_vocab, toks[done + i + 1], n_top))
            self.n_last_outputs = chunk
            done += chunk
        _check_rpc_servers(self.model.rpc_servers, "decode_logprobs")
        return out

    def prefill(self, tokens, *, int seq_id=0):
        """Append tokens to a sequence, keeping only the last token's logits in the context (for
        Sampler.sample(ctx) or logprobs(), until the next decode): decode() without the copy."""
        self._check_open()
        cdef int32_t[::1] toks = self.model._tokens(tokens)
        cdef int32_t n = toks.shape[0]
        if n == 0:
            raise ValueError("no tokens to decode")
        cdef llama_pos pos0 = llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1
        cdef int32_t n_ctx = llama_n_ctx_seq(self.ptr)
        if pos0 + n > n_ctx:
            raise ContextFullError(f"{pos0} cached + {n} new tokens exceed the context of {n_ctx} tokens")
        _run_step(self, _StepPlan.sequence(toks, pos0, seq_id, n - 1), "prefill", _OUT_KEEP)
        self.n_last_outputs = 1

    def decode_sample(self, Sampler sampler, int token, *, int seq_id=0):
        """One generation step in C, the GIL released: decode `token` at the end of a sequence, sample the
        next token from its logits with `sampler` (accepted) and return it. No logits reach Python."""
        self._check_open()
        sampler._check_open()
        cdef int32_t n_vocab = llama_vocab_n_tokens(self.model.vocab)
        if not 0 <= token < n_vocab:
            raise ValueError(f"token id out of range [0, {n_vocab})")
        if sampler.n_vocab != n_vocab:
            raise ValueError("the sampler was made for another vocabulary")
        cdef llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id) + 1
        if pos + 1 > llama_n_ctx_seq(self.ptr):
            raise ContextFullError(f"{pos} cached + 1 new token exceed the context of {llama_n_ctx_seq(self.ptr)} "
                                   f"tokens")
        cdef int rc
        cdef llama_token out = LLAMA_TOKEN_NULL
        with nogil:
            rc = self._decode_one(token, pos, seq_id)
            if rc == 0:
                out = sampler._sample(self.ptr, 0)
        if rc != 0:
            _check_rpc_servers(self.model.rpc_servers, "decode")
        _check_decode(rc, "decode")
        self.n_last_outputs = 1
        if self.model.rpc_servers:
            _check_rpc_servers(self.model.rpc_servers, "decode")
        if out == LLAMA_TOKEN_NULL:
            raise DecodeError("no logits for the decoded token")
        return out

    def set_backend_sampler(self, int seq_id, Sampler sampler):
        """Run a sampler chain inside the decode graph for one sequence (llama.cpp's experimental backend
        sampling: llama_set_sampler), or take it out (None). Returns whether it went there: llama.cpp keeps
        it on the CPU under split_mode="tensor", and so does this with a grammar. Of a chain in the graph,
        the leading samplers llama.cpp can offload (logit bias, penalties, top-k, top-p, min-p, temperature,
        greedy, dist) run there and the rest on the CPU. Sampler.sample reads the token as before; the
        output rows of such a sequence have no logits (logprobs need the CPU path)."""
        self._check_open()
        old = self.backend_samplers.pop(seq_id, None)
        if old is not None:
            (<Sampler> old).backend = None
        if sampler is None:
            llama_set_sampler(self.ptr, seq_id, NULL)
            return False
        sampler._check_open()
        if sampler.grammar != NULL:
            llama_set_sampler(self.ptr, seq_id, NULL)
            return False
        if sampler.backend is not None:
            ctx, other = sampler.backend
            (<Context> ctx).set_backend_sampler(other, None)
        if not llama_set_sampler(self.ptr, seq_id, sampler.chain):
            llama_set_sampler(self.ptr, seq_id, NULL)
            return False
        sampler.backend = (self, seq_id)
        self.backend_samplers[seq_id] = sampler
        return True

    def logprobs(self, int token, int n_top=0, int idx=-1):
        """(log p(token), [(id, log p) of the n_top most likely tokens, best first]) for output idx of the
        last decode: the log-softmax of the model's logits, computed in C (a log-sum-exp over the row and
        a partial selection of the top n_top). log p(token) is None for a token outside the vocabulary."""
        self._check_open()
        if not 0 <= n_top <= MAX_LOGPROBS:
            raise ValueError(f"n_top must be in [0, {MAX_LOGPROBS}], got {n_top}")
        with nogil:  # after prefill() the devices may still compute: wait without the GIL
            llama_synchronize(self.ptr)
        cdef const float * row = llama_get_logits_ith(self.ptr, idx)
        if row == NULL:
            raise IndexError(f"no logits for output {idx}")
        return _row_logprobs(row, llama_vocab_n_tokens(self.model.vocab), token, n_top)

    def decode_sequences(self, seqs):
        """Append tokens to several sequences at once: the tokens of every sequence share each
        llama_decode call (n_batch at a time, in the order given), as a server batches its slots.
        seqs: (seq_id, tokens) pairs with distinct seq_ids < n_seq_max. Returns the logits of each
        sequence's last token, float32 (len(seqs), n_vocab), in the order given."""
        self._check_open()
        plan = _plan_step(self, [(s, t, True, None, None, True) for s, t in seqs])
        return _run_step(self, plan, "decode_sequences", _OUT_COPY)

    def decode_batch(self, items):
        """Append tokens to several sequences in shared llama_decode calls: a server's step, where some
        sequences add one generated token and others a piece of their prompt.

        items: (seq_id, tokens, logits) triples with distinct seq_ids < n_seq_max and at least one token
        each; logits (bool) asks for the logits of the item's last token. Each sequence continues after
        the positions it holds. The tokens go in the order given, n_batch at a time (one llama_decode
        call when they fit). Returns float32 (items with logits, n_vocab), in the order given. A sequence
        that would outgrow its share of the context (n_ctx_seq) raises ContextFullError before any decode.
        """
        self._check_open()
        plan = _plan_step(self, [(s, t, bool(want), None, None, True) for s, t, want in items])
        return _run_step(self, plan, "decode_batch", _OUT_COPY)

    def decode_batch_sample(self, items):
        """A server's step in C: decode_batch() where every item that asks for an output is sampled in C
        right after the llama_decode call that holds it (the GIL released), with no logits row copied.

        items: (seq_id, tokens, sampler, n_logprobs) with distinct seq_ids; sampler None: no output for
        that item (a prompt piece); n_logprobs None: no log-probabilities, else the top n_logprobs.
        Returns one entry per item, in order: None for items without a sampler, else (token, logprob,
        top) where logprob and top are None without n_logprobs."""
        self._check_open()
        cdef _StepPlan plan = _plan_step(self, _sample_items(items))
        return _per_item(plan.items, _run_step(self, plan, "decode_batch_sample", _OUT_SAMPLE))

    def decode_batch_sample_begin(self, items):
        """decode_batch_sample(items) up to its last llama_decode call, which is left running on the
        devices (llama_decode returns before a GPU has computed): the caller's thread is free, e.g. to
        stream the text of the previous step, until decode_batch_sample_end() waits for it, samples its
        rows and returns what decode_batch_sample(items) would. In between, every other call on this
        context is a RuntimeError; the items' samplers must stay open."""
        self._check_open()
        plan = _plan_step(self, _sample_items(items))
        _run_step(self, plan, "decode_batch_sample", _OUT_SAMPLE, defer_last=True)

    def decode_batch_sample_end(self):
        """The outputs of the step decode_batch_sample_begin() left running (see decode_batch_sample)."""
        cdef _RunningStep step = _running(self)
        self.running = None
        step.check_samplers()
        _sample_outputs(self, step.at, step.first, step.samplers, step.tops, step.out)
        _check_rpc_servers(self.model.rpc_servers, "decode_batch_sample")
        return _per_item(step.items, step.out)

    def decode_batch_sample_chain(self, plan):
        """End the step decode_batch_sample_begin() left running and begin the next one in the same call, with
        no Python in between: the GIL is released from the wait for the devices, through sampling, to the
        next llama_decode (a server's steady state: the next step holds the token each generating sequence
        just sampled, so the devices do not wait for the caller's thread).

        plan: the next step's items in order, (seq_id, tokens, sampler, n_logprobs, go_on) each, as
        decode_batch_sample_begin() takes them but for tokens None: the token sampled for seq_id in the step
        that ends, which goes in only if go_on is true and it is not an end-of-generation token (go_on is
        ignored for other items). The next step must fit one llama_decode (n_batch tokens). The logprobs
        the step that ends asks for are computed before the next decode replaces its logits.

        Returns (outputs, started, t_sampled, t_launched, error): what decode_batch_sample_end() returns; the
        items of the next step, which is left running, as decode_batch_sample_begin() would have got them
        (empty: none started); the time.perf_counter() values when the rows were sampled and when the next
        llama_decode was called (t_sampled when none started); and None, or the LlamaError of that
        llama_decode, in which case started is empty."""
        cdef _RunningStep step = _running(self)
        step.check_samplers()
        # the next step, checked before anything runs: a plan refused here leaves the step running
        cdef _StepPlan nxt = _plan_step(self, [(e[0], e[1], e[2] is not None, e[2], e[3], e[4]) for e in plan],
                                        step.rows_of())
        return _chain_step(self, step, nxt)

    def split_overlap_stats(self):
        """What split overlap did in this context: whether the two lanes exist (else why not), the lane
        of a decode call's first ubatch of >= 64 tokens, and per lane the ubatches, graph builds,
        cross-lane waits and records. Counters only: allowed while a step of decode_batch_sample_begin() runs."""
        if self.ptr == NULL:
            raise ValueError("the context is closed")
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

    def allreduce_report(self):
        """This context's AllReduce settings and its reductions per path (_context_allreduce_report)."""
        self._check_open()
        return _context_allreduce_report(self.ptr)

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
        with nogil:
            llama_synchronize(self.ptr)
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
