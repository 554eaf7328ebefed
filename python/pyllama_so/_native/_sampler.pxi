# llama.cpp's sampler chain (llama_sampler_*), built from llama-cpp-python's parameter names, and the
# log-probabilities of an output row. Included by _llama.pyx. The parameters are validated by
# pyllama_so.sampling.SamplingParams; what needs the vocabulary (logit_bias) is checked here.
#
# The chain's order is that of llama.cpp's common sampler (common/sampling.cpp, common_params_sampling's
# default list): logit bias, penalties, DRY, top-n-sigma, top-k, typical-p, top-p, min-p, XTC,
# temperature, then the distribution draw; mirostat 1/2 replace everything after DRY by temperature and
# the mirostat draw; temperature 0 ends the chain with greedy (argmax) instead. Samplers whose
# parameters make them a no-op are left out, which changes nothing but time.

from libc.math cimport exp, log, INFINITY

# top_logprobs / logprobs above this are a ValueError (OpenAI's own limit for top_logprobs)
MAX_LOGPROBS = 20

cdef enum:
    # the largest top_k whose candidates _sample_row picks out of the row itself (a heap of k entries while it
    # reads the row): beyond it the whole row goes to the chain, where llama.cpp sorts by buckets
    _PREFILTER_MAX_K = 128


cdef list _logit_bias_entries(object logit_bias, int32_t n_vocab):
    """{token id: bias} (ids as int or as decimal str, as JSON gives them) to (id, bias) pairs."""
    if logit_bias is None:
        return []
    if not hasattr(logit_bias, "items"):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, not {type(logit_bias).__name__}")
    out = []
    for key, value in logit_bias.items():
        try:
            tok = int(key) if isinstance(key, (int, str)) and not isinstance(key, bool) else None
        except ValueError:
            tok = None
        if tok is None or not 0 <= tok < n_vocab:
            raise ValueError(f"logit_bias: {key!r} is not a token id of the vocabulary [0, {n_vocab})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"logit_bias: the bias of token {tok} must be a number, not {value!r}")
        out.append((tok, float(value)))
    return out


cdef llama_token _sample_row(llama_sampler * chain, llama_sampler * grammar, llama_token_data * cur,
                             int32_t n_vocab, const float * logits, const void * prefilter) noexcept nogil:
    """Sample a token from a logits row with chain (and grammar) and accept it: llama_sampler_sample's work on
    a buffer of the sampler's own, so rows of different sequences can be sampled on several threads. A grammar
    is applied as llama.cpp's common sampler does: the chain draws first, and only a token the grammar
    rejects makes it draw again from the grammar-filtered row.

    prefilter (the Sampler's _Prefilter) with k > 0 (a chain that starts with top-k, or is greedy, k = 1, after
    at most a logit bias): the chain gets only the row's k largest (biased) logits when they are distinct and
    above the rest, which is what its top-k would keep of the whole row; the same token, without writing n_vocab
    candidates."""
    cdef llama_token_data_array arr
    cdef llama_token_data one
    cdef llama_token_data_array single
    cdef llama_token tok
    cdef int32_t i, n_cand = 0
    cdef _Prefilter * pf = <_Prefilter *> prefilter
    if pf != NULL and pf.k > 0 and grammar == NULL:
        n_cand = _top_candidates(logits, n_vocab, pf.k, pf.bias_ids, pf.bias_vals, pf.n_bias, cur)
        if n_cand:
            pf.n_picked += 1
        else:
            pf.n_whole += 1
    if n_cand == 0:
        for i in range(n_vocab):
            cur[i].id = i
            cur[i].logit = logits[i]
            cur[i].p = 0
        n_cand = n_vocab
    arr.data, arr.size, arr.selected, arr.sorted = cur, n_cand, -1, False
    llama_sampler_apply(chain, &arr)
    if arr.selected < 0:
        return LLAMA_TOKEN_NULL
    tok = arr.data[arr.selected].id
    if grammar != NULL:
        one.id, one.logit, one.p = tok, 1.0, 0.0
        single.data, single.size, single.selected, single.sorted = &one, 1, -1, False
        llama_sampler_apply(grammar, &single)
        if not one.logit > -INFINITY:  # rejected: draw again from the row the grammar allows
            for i in range(n_vocab):
                cur[i].id = i
                cur[i].logit = logits[i]
                cur[i].p = 0
            arr.data, arr.size, arr.selected, arr.sorted = cur, n_vocab, -1, False
            llama_sampler_apply(grammar, &arr)
            llama_sampler_apply(chain, &arr)
            if arr.selected < 0:
                return LLAMA_TOKEN_NULL
            tok = arr.data[arr.selected].id
        llama_sampler_accept(grammar, tok)
    llama_sampler_accept(chain, tok)
    return tok


cdef class Sampler:
    """A llama.cpp sampler chain for one generation: sample() draws from an output row of a Context's last
    decode in C and accepts the token (penalties, DRY, mirostat and grammar keep their state). Free with
    free() (idempotent); any use after that is a ValueError.

    params: a pyllama_so.sampling.SamplingParams. n_ctx resolves penalty_last_n / dry_penalty_last_n -1
    (the whole context). grammar: GBNF text; it is applied as llama.cpp's common sampler does: the chain
    draws first, and only a token the grammar rejects makes it draw again from the grammar-filtered row.
    prefilter: where the chain starts with top-k (k <= 128) or is greedy, after at most a logit bias, pick the
    row's k largest (biased) logits while reading it and give the chain only those when that is what its top-k
    would keep (distinct values, above the rest), instead of all n_vocab candidates: the same tokens, faster
    (prefilter_k says which k). False gives the chain every row whole.
    """

    def __cinit__(self):
        self.chain = NULL
        self.grammar = NULL
        self.cur = NULL
        self.backend = None
        self.pf.k = 0
        self.pf.n_bias = 0
        self.pf.bias_ids = NULL
        self.pf.bias_vals = NULL
        self.pf.n_picked = 0
        self.pf.n_whole = 0

    def __init__(self, Model model, params, *, int n_ctx=0, grammar=None, str grammar_root="root",
                 bint prefilter=True):
        model._check_open()
        self.model = model
        self.n_vocab = llama_vocab_n_tokens(model.vocab)
        self.params = {k: getattr(params, k) for k in params.__dataclass_fields__}
        bias = _logit_bias_entries(params.logit_bias, self.n_vocab)
        seed = params.seed
        self.seed = LLAMA_DEFAULT_SEED if seed is None or seed < 0 else <uint32_t> (seed & 0xFFFFFFFF)
        if self.seed == LLAMA_DEFAULT_SEED:  # llama.cpp would draw one; draw it here so that .seed tells it
            self.seed = <uint32_t> (int.from_bytes(os.urandom(4), "little") % 0xFFFFFFFF)
        if grammar is not None:
            self._init_grammar(grammar, grammar_root)
        cdef llama_sampler_chain_params cp = llama_sampler_chain_default_params()
        cp.no_perf = True
        self.chain = llama_sampler_chain_init(cp)
        _null_check(self.chain, LlamaError, "llama_sampler_chain_init failed")
        self._add_members(params, bias, n_ctx)
        if not prefilter or self.grammar != NULL:
            self.pf.k = 0
        if self.pf.k > 0 and bias:
            self._set_prefilter_bias(bias)
        self._ensure_cur()

    cdef _set_prefilter_bias(self, list bias):
        """The chain's leading logit bias, by token id ascending, for the prefilter; a token named twice (as
        int and as str) gets both biases from llama.cpp, so such a chain takes whole rows."""
        entries = sorted(bias)
        if len({tok for tok, _ in entries}) != len(entries):
            self.pf.k = 0
            return
        cdef int32_t i, n = len(entries)
        self.pf.bias_ids = <int32_t *> malloc(n * sizeof(int32_t))
        self.pf.bias_vals = <float *> malloc(n * sizeof(float))
        if self.pf.bias_ids == NULL or self.pf.bias_vals == NULL:
            raise MemoryError()
        for i in range(n):
            self.pf.bias_ids[i] = entries[i][0]
            self.pf.bias_vals[i] = entries[i][1]
        self.pf.n_bias = n

    @property
    def prefilter_k(self):
        """> 0: rows may reach the chain as their prefilter_k largest (biased) logits; 0: always whole."""
        return self.pf.k

    @property
    def prefilter_rows(self):
        """(rows that reached the chain as their prefilter_k largest logits, rows the prefilter gave it whole:
        ties at or within the top k, a NaN), counted since the sampler was made; (0, 0) with prefilter_k 0."""
        return (self.pf.n_picked, self.pf.n_whole)

    cdef _init_grammar(self, grammar, str root):
        self.grammar = _grammar_sampler(self.model, grammar, root)

    cdef _add_members(self, params, list bias, int n_ctx):
        cdef llama_logit_bias * lb
        cdef int32_t i
        if bias:
            lb = <llama_logit_bias *> malloc(len(bias) * sizeof(llama_logit_bias))
            for i, (tok, b) in enumerate(bias):
                lb[i].token = tok
                lb[i].bias = b
            self._add(llama_sampler_init_logit_bias(self.n_vocab, len(bias), lb))  # copies the array
            free(lb)
        last_n = n_ctx if params.penalty_last_n == -1 else params.penalty_last_n
        if last_n != 0 and (params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0
                            or params.presence_penalty != 0.0):
            self._add(llama_sampler_init_penalties(self.n_vocab, last_n, params.repeat_penalty,
                                                   params.frequency_penalty, params.presence_penalty))
        dry_last_n = n_ctx if params.dry_penalty_last_n == -1 else params.dry_penalty_last_n
        if params.dry_multiplier > 0 and params.dry_base >= 1.0 and dry_last_n != 0:
            self._add_dry(params, dry_last_n)
        cdef float temp = params.temperature
        cdef int lead = 1 if bias else 0  # members before which the prefilter can still take the row's top k
        if temp == 0:
            if llama_sampler_chain_n(self.chain) == lead:
                self.pf.k = 1  # greedy (after a logit bias) keeps the row's largest (biased) logit
            self._add(llama_sampler_init_greedy())
            return
        if params.mirostat_mode == 1:
            self._add(llama_sampler_init_temp(temp))
            self._add(llama_sampler_init_mirostat(self.n_vocab, self.seed, params.mirostat_tau, params.mirostat_eta,
                                                  100))
            return
        if params.mirostat_mode == 2:
            self._add(llama_sampler_init_temp(temp))
            self._add(llama_sampler_init_mirostat_v2(self.seed, params.mirostat_tau, params.mirostat_eta))
            return
        cdef size_t min_keep = params.min_keep
        if params.top_n_sigma > 0:
            self._add(llama_sampler_init_top_n_sigma(params.top_n_sigma))
        if params.top_k > 0:
            if llama_sampler_chain_n(self.chain) == lead and params.top_k <= _PREFILTER_MAX_K:
                self.pf.k = params.top_k  # the chain's top-k (after a logit bias) keeps the top_k largest logits
            self._add(llama_sampler_init_top_k(params.top_k))
        if params.typical_p < 1.0:
            self._add(llama_sampler_init_typical(params.typical_p, min_keep))
        if params.top_p < 1.0:
            self._add(llama_sampler_init_top_p(params.top_p, min_keep))
        if params.min_p > 0:
            self._add(llama_sampler_init_min_p(params.min_p, min_keep))
        if params.xtc_probability > 0:
            self._add(llama_sampler_init_xtc(params.xtc_probability, params.xtc_threshold, min_keep, self.seed))
        self._add(llama_sampler_init_temp_ext(temp, 0.0, 1.0))
        self._add(llama_sampler_init_dist(self.seed))

    cdef _add_dry(self, params, int32_t last_n):
        breakers = [s.encode() for s in params.dry_sequence_breakers]
        cdef Py_ssize_t n = len(breakers), i
        cdef const char ** arr = <const char **> calloc(max(n, 1), sizeof(char *))
        try:
            for i in range(n):
                arr[i] = <const char *> (<bytes> breakers[i])
            self._add(llama_sampler_init_dry(self.model.vocab, params.dry_multiplier, params.dry_base,
                                             params.dry_allowed_length, last_n, arr, n))
        finally:
            free(arr)

    cdef _add(self, llama_sampler * member):
        _null_check(member, LlamaError, "a llama.cpp sampler could not be created")
        llama_sampler_chain_add(self.chain, member)  # the chain owns it from here

    def __dealloc__(self):
        self.free()

    def free(self):
        """Free the chain and the grammar (idempotent); a chain running in a context's graph is taken out
        of it first."""
        if self.backend is not None:
            ctx, seq_id = self.backend
            (<Context> ctx).set_backend_sampler(seq_id, None)
        if self.chain != NULL:
            llama_sampler_free(self.chain)
            self.chain = NULL
        if self.grammar != NULL:
            llama_sampler_free(self.grammar)
            self.grammar = NULL
        free(self.cur)
        self.cur = NULL
        free(self.pf.bias_ids)
        free(self.pf.bias_vals)
        self.pf.bias_ids = NULL
        self.pf.bias_vals = NULL
        self.pf.n_bias = 0
        self.pf.k = 0

    @property
    def closed(self):
        return self.chain == NULL

    cdef void _check_open(self) except *:
        if self.chain == NULL:
            raise ValueError("the sampler is freed")

    @property
    def members(self):
        """The names of the chain's samplers, in order (the grammar, if any, is not among them)."""
        self._check_open()
        return [(<bytes> llama_sampler_name(llama_sampler_chain_get(self.chain, i))).decode()
                for i in range(llama_sampler_chain_n(self.chain))]

    @property
    def on_backend(self):
        """Whether the chain runs in a context's graph (Context.set_backend_sampler)."""
        return self.backend is not None

    @property
    def has_grammar(self):
        return self.grammar != NULL

    cdef llama_token _sample(self, llama_context * ctx, int32_t idx) noexcept nogil:
        """Sample from output idx and accept the token; LLAMA_TOKEN_NULL when there is no such output."""
        if self.backend is not None:  # the graph drew the token, or ran the chain's first samplers
            return llama_sampler_sample(self.chain, ctx, idx)
        cdef const float * logits = llama_get_logits_ith(ctx, idx)
        if logits == NULL:  # llama_sampler_sample would abort
            return LLAMA_TOKEN_NULL
        return _sample_row(self.chain, self.grammar, self.cur, self.n_vocab, logits, &self.pf)

    cdef int _ensure_cur(self) except -1:
        """The candidates buffer of _sample_row (n_vocab entries), allocated at first use."""
        if self.cur == NULL:
            self.cur = <llama_token_data *> malloc(self.n_vocab * sizeof(llama_token_data))
            if self.cur == NULL:
                raise MemoryError()
        return 0

    def sample(self, Context ctx, int idx=-1):
        """Sample a token from output idx (-1: the last) of ctx's last decode and accept it."""
        self._check_open()
        ctx._check_open()
        if ctx.model.n_vocab != self.n_vocab:
            raise ValueError("the context's model has another vocabulary than the sampler's")
        cdef llama_token tok
        with nogil:
            tok = self._sample(ctx.ptr, idx)
        if tok == LLAMA_TOKEN_NULL:
            raise DecodeError(f"no logits for output {idx} of the last decode")
        return tok

    def sample_logits(self, logits):
        """Sample a token from a logits row given in Python (a logits processor's output) and accept it:
        the chain (and grammar) of sample(), on a copy."""
        self._check_open()
        cdef const float[::1] row = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
        if row.shape[0] != self.n_vocab:
            raise ValueError(f"logits must have n_vocab = {self.n_vocab} entries, got {row.shape[0]}")
        self._ensure_cur()
        cdef llama_token tok
        with nogil:
            tok = _sample_row(self.chain, self.grammar, self.cur, self.n_vocab, &row[0], &self.pf)
        if tok == LLAMA_TOKEN_NULL:
            raise LlamaError("the sampler chain selected no token")
        return tok

    def accept(self, tokens):
        """Add tokens to the history of the penalties, DRY and mirostat (a prompt, before generating):
        not to the grammar, which only follows generated tokens."""
        self._check_open()
        cdef int32_t[::1] toks = self.model._tokens(tokens)
        cdef Py_ssize_t i
        with nogil:
            for i in range(toks.shape[0]):
                llama_sampler_accept(self.chain, toks[i])

    def accept_generated(self, int token):
        """Accept a token chosen outside sample() (e.g. by a logits processor) into chain and grammar."""
        self._check_open()
        if self.grammar != NULL:
            llama_sampler_accept(self.grammar, token)
        llama_sampler_accept(self.chain, token)

    def reset(self):
        """Forget the history (penalties, DRY, mirostat, grammar state); the draw restarts from the seed."""
        self._check_open()
        llama_sampler_reset(self.chain)
        if self.grammar != NULL:
            llama_sampler_reset(self.grammar)


cdef int32_t _row_logprobs_into(const float * row, int32_t n_vocab, int n_top, int32_t * ids, float * vals,
                                double * lse) noexcept nogil:
    """The log-sum-exp of a logits row (*lse) and its n_top most likely tokens, best first, into ids and vals
    (logits, not yet log-probabilities): one pass, n_top kept in order, no sort of the vocabulary. Returns
    how many were kept (min(n_top, n_vocab))."""
    cdef int32_t i, j, k = 0
    cdef float m = -INFINITY, v
    cdef double s = 0.0
    for i in range(n_vocab):
        if row[i] > m:
            m = row[i]
    for i in range(n_vocab):
        v = row[i]
        s += exp(v - m)
        if n_top > 0 and (k < n_top or v > vals[k - 1]):
            j = k if k < n_top else n_top - 1
            while j > 0 and vals[j - 1] < v:  # equal values keep the lower id first
                vals[j] = vals[j - 1]
                ids[j] = ids[j - 1]
                j -= 1
            vals[j] = v
            ids[j] = i
            if k < n_top:
                k += 1
    lse[0] = m + log(s)
    return k


cdef tuple _logprobs_tuple(float token_logit, bint in_vocab, const int32_t * ids, const float * vals, int32_t k,
                           double lse):
    """_row_logprobs' result from what _row_logprobs_into found (token_logit: the row's logit of the token)."""
    return (float(token_logit - lse) if in_vocab else None, [(ids[j], float(vals[j] - lse)) for j in range(k)])


cdef tuple _row_logprobs(const float * row, int32_t n_vocab, llama_token token, int n_top):
    """(log p(token), [(id, log p) of the n_top most likely, best first]) of a logits row: a log-sum-exp
    over the row and a partial selection (_row_logprobs_into)."""
    cdef int32_t * ids = <int32_t *> malloc(max(n_top, 1) * sizeof(int32_t))
    cdef float * vals = <float *> malloc(max(n_top, 1) * sizeof(float))
    cdef int32_t k
    cdef double lse
    cdef bint in_vocab = 0 <= token < n_vocab
    try:
        if ids == NULL or vals == NULL:
            raise MemoryError()
        with nogil:
            k = _row_logprobs_into(row, n_vocab, n_top, ids, vals, &lse)
        return _logprobs_tuple(row[token] if in_vocab else 0.0, in_vocab, ids, vals, k, lse)
    finally:
        free(ids)
        free(vals)


cdef enum:
    NO_LOGPROBS = -1  # _StepRows' top_n of a row that asks for none


cdef class _StepRows:
    """The output rows of one llama_decode call, to sample: each row's batch position and chain (in the graph,
    or one of the CPU rows, gathered in order for _sample_rows with their grammars and buffers), and the
    logprobs it asks for. Built and read with the GIL; sample() runs without it, so that a caller can go from
    the wait for the devices to its next llama_decode in C."""
    cdef int32_t n, n_cpu, n_vocab
    cdef int32_t * at  # batch position
    cdef llama_sampler ** graph_chain  # the chain of a row sampled in the graph; NULL for a CPU row
    cdef int32_t * top_n  # logprobs asked for; NO_LOGPROBS: none
    cdef int32_t * top_off  # where a row's top tokens go in top_ids / top_vals
    cdef int32_t * top_k  # how many were found
    cdef int32_t * top_ids
    cdef float * top_vals
    cdef double * lse
    cdef float * tok_logit
    cdef llama_token * tok  # each row's token, after sample()
    # the CPU rows, in order: their row, chain, grammar and candidates buffer; sample() fills srcs and picked
    cdef int32_t * cpu_row
    cdef llama_sampler ** cpu_chains
    cdef llama_sampler ** cpu_grammars
    cdef llama_token_data ** cpu_curs
    cdef const void ** cpu_prefilter  # each row's Sampler.pf
    cdef const float ** srcs
    cdef llama_token * picked

    def __cinit__(self, list entries, int32_t n_vocab):
        """entries: (Sampler, batch position, n_logprobs or None) per output row, in order."""
        cdef int32_t i, total = 0, m = max(len(entries), 1)
        cdef Sampler smp
        # a draw in the graph has no logprobs
        tops = [NO_LOGPROBS if top is None or (<Sampler?> smp_).backend is not None else top
                for smp_, _, top in entries]
        self.n, self.n_cpu, self.n_vocab = len(entries), 0, n_vocab
        self.at = <int32_t *> malloc(m * sizeof(int32_t))
        self.graph_chain = <llama_sampler **> malloc(m * sizeof(void *))
        self.top_n = <int32_t *> malloc(m * sizeof(int32_t))
        self.top_off = <int32_t *> malloc(m * sizeof(int32_t))
        self.top_k = <int32_t *> malloc(m * sizeof(int32_t))
        self.top_ids = <int32_t *> malloc(max(sum(max(t, 0) for t in tops), 1) * sizeof(int32_t))
        self.top_vals = <float *> malloc(max(sum(max(t, 0) for t in tops), 1) * sizeof(float))
        self.lse = <double *> malloc(m * sizeof(double))
        self.tok_logit = <float *> malloc(m * sizeof(float))
        self.tok = <llama_token *> malloc(m * sizeof(llama_token))
        self.cpu_row = <int32_t *> malloc(m * sizeof(int32_t))
        self.cpu_chains = <llama_sampler **> malloc(m * sizeof(void *))
        self.cpu_grammars = <llama_sampler **> malloc(m * sizeof(void *))
        self.cpu_curs = <llama_token_data **> malloc(m * sizeof(void *))
        self.cpu_prefilter = <const void **> malloc(m * sizeof(void *))
        self.srcs = <const float **> malloc(m * sizeof(void *))
        self.picked = <llama_token *> malloc(m * sizeof(llama_token))
        if (self.at == NULL or self.graph_chain == NULL or self.top_n == NULL or self.top_off == NULL
                or self.top_k == NULL or self.top_ids == NULL or self.top_vals == NULL or self.lse == NULL
                or self.tok_logit == NULL or self.tok == NULL or self.cpu_row == NULL or self.cpu_chains == NULL
                or self.cpu_grammars == NULL or self.cpu_curs == NULL or self.cpu_prefilter == NULL or self.srcs == NULL
                or self.picked == NULL):
            raise MemoryError()
        for i, (sampler, pos, _) in enumerate(entries):
            smp = sampler
            self.at[i], self.top_n[i], self.top_off[i], self.top_k[i] = pos, tops[i], total, 0
            total += max(tops[i], 0)
            self.graph_chain[i] = smp.chain if smp.backend is not None else NULL
            if smp.backend is None:
                self.cpu_row[self.n_cpu], self.cpu_chains[self.n_cpu] = i, smp.chain
                self.cpu_grammars[self.n_cpu], self.cpu_curs[self.n_cpu] = smp.grammar, smp.cur
                self.cpu_prefilter[self.n_cpu] = &smp.pf
                self.n_cpu += 1

    def __dealloc__(self):
        free(self.at)
        free(self.graph_chain)
        free(self.top_n)
        free(self.top_off)
        free(self.top_k)
        free(self.top_ids)
        free(self.top_vals)
        free(self.lse)
        free(self.tok_logit)
        free(self.tok)
        free(self.cpu_row)
        free(self.cpu_chains)
        free(self.cpu_grammars)
        free(self.cpu_curs)
        free(self.cpu_prefilter)
        free(self.srcs)
        free(self.picked)

    cdef int sample(self, llama_context * ctx, _RowPool * pool, int n_threads) noexcept nogil:
        """Sample every row of ctx's last decode (which must have finished: llama_synchronize): chains in the
        graph one by one, the others together on n_threads threads (of pool), then the logprobs asked for, before the
        next decode replaces the rows. 0, or 1 when a row has no logits, 2 when a chain selected no token."""
        cdef int32_t i, j, m = 0
        for i in range(self.n):  # in row order: the first llama_get_logits_ith call may reorder the outputs
            if self.graph_chain[i] != NULL:
                self.tok[i] = llama_sampler_sample(self.graph_chain[i], ctx, self.at[i])
                if self.tok[i] == LLAMA_TOKEN_NULL:
                    return 1
                continue
            self.srcs[m] = llama_get_logits_ith(ctx, self.at[i])
            if self.srcs[m] == NULL:
                return 1
            m += 1
        _sample_rows(_sample_row, self.n_cpu, self.cpu_chains, self.cpu_grammars, self.cpu_curs,
                     self.cpu_prefilter, self.n_vocab, self.srcs, self.picked, pool, n_threads)
        for j in range(self.n_cpu):
            i = self.cpu_row[j]
            self.tok[i] = self.picked[j]
            if self.picked[j] == LLAMA_TOKEN_NULL:
                return 2
            if self.top_n[i] >= 0:
                self.top_k[i] = _row_logprobs_into(self.srcs[j], self.n_vocab, self.top_n[i],
                                                   &self.top_ids[self.top_off[i]], &self.top_vals[self.top_off[i]],
                                                   &self.lse[i])
                self.tok_logit[i] = self.srcs[j][self.picked[j]]
        return 0

    cdef tuple output(self, int32_t i):
        """Row i's (token, log p(token), top) after sample(); (token, None, None) without logprobs."""
        if self.top_n[i] < 0:
            return (self.tok[i], None, None)
        return (self.tok[i],) + _logprobs_tuple(self.tok_logit[i], True, &self.top_ids[self.top_off[i]],
                                                &self.top_vals[self.top_off[i]], self.top_k[i], self.lse[i])


cdef _StepRows _step_rows(list at, int32_t first, list samplers, list tops, int32_t n_vocab):
    """The outputs of a llama_decode call at batch positions at, output rows first on (samplers and tops: per
    output row of the step), as _StepRows."""
    return _StepRows([(samplers[first + k], pos, tops[first + k]) for k, pos in enumerate(at)], n_vocab)


cdef int _check_sampled(int err) except -1:
    if err == 1:
        raise DecodeError("no logits for an output token")
    if err == 2:
        raise DecodeError("the sampler chain selected no token")
    return 0


def check_logprobs(value, str name="logprobs"):
    """A logprobs / top_logprobs count: None or an int in [0, MAX_LOGPROBS]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], not {value!r}")
    if not 0 <= value <= MAX_LOGPROBS:
        raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
    return value
