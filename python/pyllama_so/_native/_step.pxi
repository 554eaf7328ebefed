# A step: the tokens of one or several sequences in shared llama_decode calls (a server's step, where some
# sequences add a generated token and others a piece of their prompt), each output copied out, left in the
# context or sampled in C. Included by _llama.pyx.
#
# Every decode path of Context goes through the same three parts:
#   the plan check  _plan_step (several sequences) or _StepPlan.sequence (one, checked by its caller): the
#                   items against the context, before anything runs, as a _StepPlan of flat per-token arrays;
#   the batch fill  Context._fill_batch: a range of a _StepPlan's tokens into the llama_batch;
#   the run         _run_step: llama_decode n_batch tokens at a time, each call's outputs copied, kept or
#                   sampled; the last call may be left running as a _RunningStep, which
#                   decode_batch_sample_end() or _chain_step() ends.

cdef enum:
    _OUT_COPY = 0    # _run_step copies each output's logits row into a float32 array
    _OUT_KEEP = 1    # leaves the outputs in the context (prefill)
    _OUT_SAMPLE = 2  # samples them in C with the plan's samplers


cdef class _StepPlan:
    """A step's tokens, checked: the items' tokens flat, in order, and per item where its tokens start, how many,
    its sequence and first position, and from which of its tokens on it asks for outputs. Built by _plan_step or
    _StepPlan.sequence; only Context._fill_batch (which marks the items that went in) and take_sampled (a chained
    step) change it."""

    def __dealloc__(self):
        free(self.first)

    @staticmethod
    cdef _StepPlan sequence(int32_t[::1] toks, llama_pos pos0, llama_seq_id seq_id, int32_t out_from):
        """One sequence's tokens at positions pos0 on, with an output at every token from index out_from on."""
        return _new_plan([(seq_id, None, True, None, None, True)], toks, [toks.shape[0]], [pos0], [out_from])

    cdef void take_sampled(self, const llama_token * sampled, const llama_vocab * vocab) noexcept nogil:
        """A chained step's tokens from the step that ends (sampled: its tokens by output row): each item that
        follows a row takes its token, or stays out of the batch when it may not go on (go_on false) or the token
        ends the generation."""
        cdef int32_t j
        cdef llama_token tok
        for j in range(self.n_items):
            if self.follow[j] < 0:
                continue
            tok = sampled[self.follow[j]]
            if not self.go[j] or llama_vocab_is_eog(vocab, tok):
                self.go[j] = 0
            else:
                self.tok[self.first[j]] = tok


cdef _StepPlan _new_plan(list items, tokens, list lengths, list pos0, list out_from, list follow=None,
                         list go=None):
    """A _StepPlan over tokens (int32, contiguous; kept alive by the plan) with the per-item values given;
    follow: -1 for every item, go: 1 for every item when None."""
    cdef _StepPlan plan = _StepPlan.__new__(_StepPlan)
    cdef int32_t[::1] tok = tokens
    cdef int32_t j, n = len(items), at = 0, n_out = 0
    plan.items, plan.tokens = items, tokens
    plan.samplers = [e[3] for e in items if e[2]]
    plan.tops = [e[4] for e in items if e[2]]
    plan.tok = &tok[0] if tok.shape[0] > 0 else NULL
    plan.n_items, plan.n_tokens = n, tok.shape[0]
    plan.first = <int32_t *> calloc(max(n, 1) * 8, sizeof(int32_t))  # one block for the eight per-item arrays
    if plan.first == NULL:
        raise MemoryError()
    plan.length = plan.first + n
    plan.pos0 = plan.first + 2 * n
    plan.seq = plan.first + 3 * n
    plan.out_from = plan.first + 4 * n
    plan.follow = plan.first + 5 * n
    plan.go = plan.first + 6 * n
    plan.went = plan.first + 7 * n
    for j in range(n):
        plan.first[j], plan.length[j], plan.pos0[j], plan.seq[j] = at, lengths[j], pos0[j], int(items[j][0])
        plan.out_from[j] = out_from[j]
        plan.follow[j] = -1 if follow is None else follow[j]
        plan.go[j] = 1 if go is None else go[j]
        n_out += max(0, plan.length[j] - plan.out_from[j])
        at += plan.length[j]
    plan.n_out = n_out
    return plan


cdef _StepPlan _plan_step(Context ctx, list items, dict follow=None):
    """The plan check of a step of several sequences, before anything runs: items are (seq_id, tokens, wants an
    output, sampler, n_logprobs, go_on), with distinct sequences in range, open samplers, valid logprob counts, at
    least one token each and room in each sequence's share of the context (n_ctx_seq). follow: for a step chained
    to the running one (decode_batch_sample_chain), the output row of each sequence the running step samples; an
    item with tokens None takes that sequence's token, and the step must fit one llama_decode call."""
    cdef uint32_t n_seq_max = llama_n_seq_max(ctx.ptr)
    cdef int32_t n_ctx_seq = llama_n_ctx_seq(ctx.ptr)
    cdef llama_memory_t mem = llama_get_memory(ctx.ptr)
    ids = [int(e[0]) for e in items]
    if len(set(ids)) != len(ids) or not all(0 <= s < n_seq_max for s in ids):
        raise ValueError(f"seq_ids must be distinct and in [0, {n_seq_max}): {ids}")
    for _, _, _, smp, top, _ in items:
        if smp is not None:
            (<Sampler?> smp)._check_open()
            if top is not None:
                check_logprobs(top, "n_logprobs")
    arrays = [None if e[1] is None and follow is not None else np.asarray(ctx.model._tokens(e[1])) for e in items]
    for s, a in zip(ids, arrays):
        if a is None and s not in follow:
            raise ValueError(f"seq_id {s} has no sampled output in the running step to follow")
        if a is not None and a.shape[0] == 0:
            raise ValueError("every sequence needs at least one token")
    if not items and follow is None:
        raise ValueError("every sequence needs at least one token")
    lengths = [1 if a is None else a.shape[0] for a in arrays]
    if follow is not None and sum(lengths) > ctx.batch_cap:
        raise ValueError(f"the next step has up to {sum(lengths)} tokens: more than n_batch ({ctx.batch_cap})")
    pos0 = [llama_memory_seq_pos_max(mem, s) + 1 for s in ids]
    for s, held, new in zip(ids, pos0, lengths):
        if held + new > n_ctx_seq:
            raise ContextFullError(f"sequence {s}: {held} cached + {new} new tokens exceed its context of "
                                   f"{n_ctx_seq} tokens")
    # a token to follow has a slot, which take_sampled fills
    tokens = np.concatenate([np.full(1, LLAMA_TOKEN_NULL, dtype=np.int32) if a is None else a for a in arrays]) \
        if items else np.zeros(0, dtype=np.int32)
    return _new_plan(items, tokens, lengths, pos0, [n - 1 if e[2] else n for e, n in zip(items, lengths)],
                     [follow[s] if a is None else -1 for s, a in zip(ids, arrays)],
                     [bool(e[5]) or a is not None for e, a in zip(items, arrays)])


cdef class _RunningStep:
    """The step that decode_batch_sample_begin() or _chain_step() left running: its last llama_decode call has
    not been waited for. Ended by decode_batch_sample_end() or _chain_step()."""

    def __cinit__(self, list items, list at, int32_t first, list samplers, list tops, list out):
        self.items, self.at, self.first = items, at, first
        self.samplers, self.tops, self.out = samplers, tops, out

    cdef check_samplers(self):
        """Its samplers must still be open when its outputs are sampled."""
        for smp in self.samplers:
            (<Sampler?> smp)._check_open()

    cdef dict rows_of(self):
        """seq_id -> the output row of each sequence it samples."""
        rows = {}
        for e in self.items:
            if e[2]:
                rows[int(e[0])] = len(rows)
        return rows


cdef _RunningStep _running(Context ctx):
    if ctx.ptr == NULL:
        raise ValueError("the context is closed")
    if ctx.running is None:
        raise RuntimeError("no step of decode_batch_sample_begin() is running")
    return ctx.running


cdef list _sample_items(items):
    """decode_batch_sample's items, (seq_id, tokens, sampler, n_logprobs), as _plan_step takes them."""
    return [(s, t, smp is not None, smp, n, True) for s, t, smp, n in items]


cdef list _per_item(list items, list out):
    """A step's outputs spread back over its items: None for an item without an output."""
    res, k = [], 0
    for e in items:
        res.append(out[k] if e[2] else None)
        k += bool(e[2])
    return res


cdef list _outputs_at(Context ctx, int32_t nb):
    """The batch positions of the last llama_decode call (nb tokens) that asked for an output."""
    cdef int32_t i
    return [i for i in range(nb) if ctx.batch.logits[i]]


cdef object _run_step(Context ctx, _StepPlan plan, str what, int outputs, bint defer_last=False):
    """The run: plan's tokens in llama_decode calls of n_batch tokens (the GIL released during each), each call's
    outputs copied into a float32 array of plan.n_out rows (_OUT_COPY, returned), left in the context (_OUT_KEEP)
    or sampled in C with the plan's samplers (_OUT_SAMPLE: a list of (token, logprob, top), returned). With
    defer_last the last call is left running as ctx.running, for decode_batch_sample_end()."""
    cdef int32_t n_vocab = llama_vocab_n_tokens(ctx.model.vocab)
    cdef int32_t start, end, nb, rc, first = 0
    if outputs == _OUT_COPY:
        out = np.empty((plan.n_out, n_vocab), dtype=np.float32)
    else:
        out = [None] * plan.n_out
    for start in range(0, plan.n_tokens, ctx.batch_cap):
        end = min(start + ctx.batch_cap, plan.n_tokens)
        nb = ctx._fill_batch(plan, start, end)
        with nogil:
            rc = llama_decode(ctx.ptr, ctx.batch)
        if rc != 0:  # a lost RPC server is the cause to report
            _check_rpc_servers(ctx.model.rpc_servers, what)
        _check_decode(rc, what)
        if outputs == _OUT_KEEP:
            continue
        at = _outputs_at(ctx, nb)
        if defer_last and end == plan.n_tokens:  # left running: decode_batch_sample_end() samples it
            ctx.running = _RunningStep(plan.items, at, first, plan.samplers, plan.tops, out)
            return None
        if outputs == _OUT_SAMPLE:
            _sample_outputs(ctx, at, first, plan.samplers, plan.tops, out)
        else:
            _copy_outputs(ctx, at, first, out, n_vocab)
        first += len(at)
    # replies of a lost RPC server read as zeros: checked after the outputs were taken
    _check_rpc_servers(ctx.model.rpc_servers, what)
    return None if outputs == _OUT_KEEP else out


cdef _copy_outputs(Context ctx, list at, int32_t first, float[:, ::1] out, int32_t n_vocab):
    """The logits rows of the last llama_decode's outputs (batch positions at) into out's rows first on."""
    cdef const float * src
    cdef int32_t k
    if at:  # outputs to read: wait for them without the GIL (llama_get_logits_ith would wait holding it)
        with nogil:
            llama_synchronize(ctx.ptr)
    for k in range(len(at)):
        src = llama_get_logits_ith(ctx.ptr, at[k])
        if src == NULL:
            raise DecodeError("no logits for an output token")
        memcpy(&out[first + k, 0], src, n_vocab * sizeof(float))


cdef _sample_outputs(Context ctx, list at, int32_t first, list samplers, list tops, list out):
    """Sample the last llama_decode's outputs (batch positions at; output rows first on) with _StepRows, the GIL
    released from the wait for the devices on (llama_get_logits_ith would wait holding it, and a server's HTTP
    thread could not run meanwhile). out[row] = (token, logprob, top)."""
    cdef _StepRows step_rows = _step_rows(at, first, samplers, tops, llama_vocab_n_tokens(ctx.model.vocab))
    cdef int n_threads = ctx.sampling_threads
    cdef int err
    with nogil:
        llama_synchronize(ctx.ptr)
        err = step_rows.sample(ctx.ptr, ctx.row_pool, n_threads)
    _check_sampled(err)
    for k in range(len(at)):
        out[first + k] = step_rows.output(k)


@cython.boundscheck(False)  # sampled has a slot for every output row of the step that ends
@cython.wraparound(False)
cdef tuple _chain_step(Context ctx, _RunningStep step, _StepPlan plan):
    """decode_batch_sample_chain's run, once plan is checked: wait for the running step, sample the outputs of its
    last call, fill the batch with plan (each generating sequence with the token it just sampled) and call
    llama_decode, all without the GIL. Returns what decode_batch_sample_chain() does."""
    cdef _StepRows step_rows = _step_rows(step.at, step.first, step.samplers, step.tops,
                                          llama_vocab_n_tokens(ctx.model.vocab))
    cdef int32_t[::1] sampled = np.array([LLAMA_TOKEN_NULL if o is None else o[0] for o in step.out] or [0],
                                         dtype=np.int32)
    cdef int32_t n_at = len(step.at), first = step.first, i, nb = 0, rc = 0
    cdef const llama_vocab * vocab = ctx.model.vocab
    cdef int err = 0, n_threads = ctx.sampling_threads
    cdef int64_t t_sampled = 0, t_launched = 0
    ctx.running = None  # from here on the step is consumed, whatever happens
    with nogil:
        llama_synchronize(ctx.ptr)
        err = step_rows.sample(ctx.ptr, ctx.row_pool, n_threads)
        t_sampled = _now_ns()
        if not err:
            for i in range(n_at):
                sampled[first + i] = step_rows.tok[i]
            plan.take_sampled(&sampled[0], vocab)
            nb = ctx._fill_batch(plan, 0, plan.n_tokens)
            t_launched = _now_ns()
            if nb > 0:
                rc = llama_decode(ctx.ptr, ctx.batch)
    _check_sampled(err)
    for i in range(n_at):
        step.out[first + i] = step_rows.output(i)
    outputs = _per_item(step.items, step.out)
    _check_rpc_servers(ctx.model.rpc_servers, "decode_batch_sample")
    started, error = [], None
    if nb > 0:
        try:
            if rc != 0:
                _check_rpc_servers(ctx.model.rpc_servers, "decode_batch_sample")
            _check_decode(rc, "decode_batch_sample")
        except LlamaError as e:
            error = e
        else:
            started = _begin_chained(ctx, plan, nb)
    t_s = t_sampled / 1e9
    return outputs, started, t_s, (t_launched / 1e9 if nb > 0 else t_s), error


cdef list _begin_chained(Context ctx, _StepPlan plan, int32_t nb):
    """A chained step whose llama_decode (nb tokens) was called, as ctx.running. Returns its items as
    decode_batch_sample_begin() would have got them (a generating sequence with the token it was given)."""
    cdef int32_t j
    started = []
    for j in range(plan.n_items):
        if plan.went[j]:
            e = plan.items[j]
            started.append((e[0], [plan.tok[plan.first[j]]] if plan.follow[j] >= 0 else e[1], e[3], e[4]))
    at = _outputs_at(ctx, nb)
    ctx.running = _RunningStep(_sample_items(started), at, 0, [e[2] for e in started if e[2] is not None],
                               [e[3] for e in started if e[2] is not None], [None] * len(at))
    return started
