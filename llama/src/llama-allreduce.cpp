// The AllReduce settings of a llama_context: see llama/include/pyllama-so-context-allreduce.h.

#include "pyllama-so-context-allreduce.h"
#include "pyllama-so-split-overlap.h"

#include "llama-context.h"

#include "ggml-backend-meta-comm.h"

#include <vector>

// The Meta backends of ctx: each split-overlap lane's, else the one among its scheduler's backends.
static std::vector<ggml_backend_t> llama_allreduce_metas(const llama_context & ctx) {
    std::vector<ggml_backend_t> metas;
    for (int32_t lane = 0; lane < 2; lane++) {
        if (ggml_backend_t meta = llama_split_overlap_backend(&ctx, lane)) {
            metas.push_back(meta);
        }
    }
    ggml_backend_sched_t sched = ctx.get_sched();
    if (!metas.empty() || sched == nullptr) {
        return metas;
    }
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_dev_type(ggml_backend_get_device(backend)) == GGML_BACKEND_DEVICE_TYPE_META) {
            metas.push_back(backend);
        }
    }
    return metas;
}

// The entry point `name` of the backend that made meta's comm context, and that context in *comm; nullptr when
// there is no comm context or its backend has no such entry.
static void * llama_allreduce_entry(ggml_backend_t meta, const char * name, void ** comm) {
    ggml_backend_reg_t reg = nullptr;
    *comm = ggml_backend_meta_comm_context(meta, &reg);
    return *comm != nullptr && reg != nullptr ? ggml_backend_reg_get_proc_address(reg, name) : nullptr;
}

int32_t llama_allreduce_configure(llama_context * ctx, const pyllama_so_allreduce_params * params) {
    if (ctx == nullptr || params == nullptr) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    for (ggml_backend_t meta : llama_allreduce_metas(*ctx)) {
        void * comm = nullptr;
        auto configure = (pyllama_so_allreduce_comm_configure_t) llama_allreduce_entry(meta, PYLLAMA_SO_AR_COMM_CONFIGURE_NAME, &comm);
        if (configure == nullptr) {
            continue;
        }
        const int rc = configure(comm, params);
        if (rc != PYLLAMA_SO_AR_OK) {
            return rc;
        }
    }
    return PYLLAMA_SO_AR_OK;
}

int32_t llama_allreduce_get_report(const llama_context * ctx, pyllama_so_allreduce_report * out) {
    if (ctx == nullptr || out == nullptr || out->size != sizeof(pyllama_so_allreduce_report)) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    *out = {};
    out->size = sizeof(pyllama_so_allreduce_report);
    int32_t n_comm = 0;
    for (ggml_backend_t meta : llama_allreduce_metas(*ctx)) {
        void * comm = nullptr;
        auto report = (pyllama_so_allreduce_comm_report_t) llama_allreduce_entry(meta, PYLLAMA_SO_AR_COMM_REPORT_NAME, &comm);
        pyllama_so_allreduce_report one = {};
        one.size = sizeof(one);
        if (report == nullptr || report(comm, &one) != PYLLAMA_SO_AR_OK) {
            continue;
        }
        if (n_comm++ == 0) {
            out->settings   = one.settings;
            out->ce_enabled = one.ce_enabled;
        }
        for (int p = 0; p < PYLLAMA_SO_AR_PATH_COUNT; p++) {
            out->calls[p] += one.calls[p];
            out->bytes[p] += one.bytes[p];
        }
        out->ce_rounds += one.ce_rounds;
    }
    return n_comm;
}
