#include "sample-rows.h"

namespace {

struct rows_job {
    pyllama_so_row_sampler fn;
    int n, n_parts;
    llama_sampler ** chains;
    llama_sampler ** grammars;
    llama_token_data ** curs;
    const void ** prefilters;
    int32_t n_vocab;
    const float ** rows;
    llama_token * out;
};

// part p samples rows p, p + n_parts, ...
void rows_part(void * arg, int part) {
    const rows_job * job = (const rows_job *) arg;
    for (int i = part; i < job->n; i += job->n_parts) {
        job->out[i] = job->fn(job->chains[i], job->grammars[i], job->curs[i], job->n_vocab, job->rows[i],
                              job->prefilters[i]);
    }
}

} // namespace

void pyllama_so_sample_rows(pyllama_so_row_sampler fn, int n, llama_sampler ** chains, llama_sampler ** grammars,
                            llama_token_data ** curs, const void ** prefilters, int32_t n_vocab, const float ** rows,
                            llama_token * out, pyllama_so_row_pool * pool, int n_threads) {
    rows_job job = { fn, n, n_threads < n ? n_threads : n, chains, grammars, curs, prefilters, n_vocab, rows, out };
    if (job.n_parts < 1) {
        job.n_parts = 1;
    }
    pyllama_so_row_pool_run(pool, job.n_parts, rows_part, &job);
}
