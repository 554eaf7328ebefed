// pyllama_so: requested AllReduce settings -> the ones a comm context uses (pyllama-so-allreduce.h). In ggml-base, so
// that every backend whose comm context takes the settings (CUDA, the CPU virtual devices) resolves them alike.

#include "pyllama-so-allreduce.h"

#include "ggml-impl.h"

#include <cstdlib>
#include <cstring>

// A byte-count variable: text == nullptr when unset; ok when the text is a plain decimal number.
struct pyllama_so_env_bytes {
    const char *       text  = nullptr;
    bool               ok    = false;
    unsigned long long value = 0;

    explicit pyllama_so_env_bytes(const char * name) {
        const char * v = getenv(name);
        if (v == nullptr || v[0] == '\0') {
            return;
        }
        char * end = nullptr;
        text  = v;
        value = strtoull(v, &end, 10);
        ok    = end != v && *end == '\0' && v[0] != '-';
    }
};

static bool pyllama_so_ar_chunk_ok(unsigned long long v) {
    return v >= PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN && v <= PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX && (v & (v - 1)) == 0;
}

// GGML_CUDA_AR_CE: -1 automatic (unset), 0 never, 1 forced.
static int32_t pyllama_so_ar_env_mode() {
    const char * v = getenv("GGML_CUDA_AR_CE");
    if (v == nullptr || v[0] == '\0') {
        return -1;
    }
    if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "false") == 0) {
        return 0;
    }
    if (strcmp(v, "1") == 0 || strcmp(v, "on") == 0 || strcmp(v, "true") == 0 || strcmp(v, "force") == 0) {
        return 1;
    }
    GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_CE=\"%s\" (expected 0 or 1)\n", __func__, v);
    return -1;
}

static uint64_t pyllama_so_ar_env_min_bytes() {
    const pyllama_so_env_bytes v("GGML_CUDA_AR_CE_MIN_BYTES");
    if (v.text == nullptr) {
        return PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT;
    }
    if (!v.ok || v.value == 0) {
        GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_CE_MIN_BYTES=\"%s\" (expected a byte count >= 1)\n", __func__, v.text);
        return PYLLAMA_SO_AR_CE_MIN_BYTES_DEFAULT;
    }
    return v.value;
}

// 0 (unset): automatic.
static uint64_t pyllama_so_ar_env_chunk_bytes() {
    const pyllama_so_env_bytes v("GGML_CUDA_AR_CE_CHUNK_BYTES");
    if (v.text == nullptr) {
        return 0;
    }
    if (!v.ok || !pyllama_so_ar_chunk_ok(v.value)) {
        GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_CE_CHUNK_BYTES=\"%s\" (expected a power of two from %d to %d)\n",
                      __func__, v.text, PYLLAMA_SO_AR_CE_CHUNK_BYTES_MIN, PYLLAMA_SO_AR_CE_CHUNK_BYTES_MAX);
        return 0;
    }
    return v.value;
}

static uint64_t pyllama_so_ar_env_ll_max_bytes() {
    const pyllama_so_env_bytes v("GGML_CUDA_AR_LL_MAX_BYTES");
    if (v.text == nullptr) {
        return PYLLAMA_SO_AR_LL_MAX_BYTES_DEFAULT;
    }
    if (!v.ok || v.value > PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT) {
        GGML_LOG_WARN("%s: ignoring GGML_CUDA_AR_LL_MAX_BYTES=\"%s\" (expected a byte count from 0 to %d)\n",
                      __func__, v.text, PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT);
        return PYLLAMA_SO_AR_LL_MAX_BYTES_DEFAULT;
    }
    return v.value;
}

static bool pyllama_so_ar_params_ok(const pyllama_so_allreduce_params & p) {
    return p.size == sizeof(pyllama_so_allreduce_params) &&
           p.copy_engines <= 1 &&
           (p.min_bytes < 0 || p.min_bytes >= 1) &&
           (p.chunk_bytes <= 0 || pyllama_so_ar_chunk_ok((unsigned long long) p.chunk_bytes)) &&
           p.ll_max_bytes <= PYLLAMA_SO_AR_LL_MAX_BYTES_LIMIT;
}

int pyllama_so_allreduce_resolve(const pyllama_so_allreduce_params * params, pyllama_so_allreduce_settings * out) {
    pyllama_so_allreduce_params p = {};
    p.size         = sizeof(p);
    p.copy_engines = -1;
    p.min_bytes    = -1;
    p.chunk_bytes  = -1;
    p.ll_max_bytes = -1;
    if (out == nullptr || (params != nullptr && !pyllama_so_ar_params_ok(*params))) {
        return PYLLAMA_SO_AR_EINVAL;
    }
    if (params != nullptr) {
        p = *params;
    }
    // only the variables of the fields left to their default are read (and warned about)
    out->copy_engines = p.copy_engines >= 0 ? p.copy_engines            : pyllama_so_ar_env_mode();
    out->min_bytes    = p.min_bytes    >= 0 ? (uint64_t) p.min_bytes    : pyllama_so_ar_env_min_bytes();
    out->chunk_bytes  = p.chunk_bytes  >= 0 ? (uint64_t) p.chunk_bytes  : pyllama_so_ar_env_chunk_bytes();
    out->ll_max_bytes = p.ll_max_bytes >= 0 ? (uint64_t) p.ll_max_bytes : pyllama_so_ar_env_ll_max_bytes();
    return PYLLAMA_SO_AR_OK;
}
