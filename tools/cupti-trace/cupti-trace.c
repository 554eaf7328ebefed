// A minimal GPU tracer for machines without Nsight Systems: loaded by the CUDA driver through
// CUDA_INJECTION64_PATH, it records CUPTI activity (kernels, copies, memsets, runtime API calls) and
// writes one CSV line per record at exit, for scripts/so-timeline.
//
//   CUDA_INJECTION64_PATH=libcupti-trace.so CUPTI_TRACE_OUT=trace.csv python -m pyllama_so.bench ...
//
// Columns: kind,device,stream,start_ns,end_ns,bytes,name. kind is kernel, memcpy, memset or api; for
// api rows, device holds the host thread id's low 32 bits and stream -1. CUPTI's record structs are
// versioned: the build passes the newest typedefs of the installed headers as CT_KERNEL_T, CT_MEMCPY_T,
// CT_MEMSET_T (see scripts/gpu_check/traces.py).

// the activity and callback headers alone: cupti.h also pulls in every API parameter struct, which
// needs CUDA headers of the same release as CUPTI
#include <cupti_activity.h>
#include <cupti_callbacks.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CT_KERNEL_T
#error "define CT_KERNEL_T, CT_MEMCPY_T and CT_MEMSET_T to the installed CUpti_Activity* typedefs"
#endif

#define CT_BUFFER_SIZE (8u << 20)

static FILE * ct_out = NULL;

static void ct_check(CUptiResult res, const char * what) {
    if (res != CUPTI_SUCCESS) {
        const char * msg = NULL;
        cuptiGetResultString(res, &msg);
        fprintf(stderr, "cupti-trace: %s: %s\n", what, msg ? msg : "unknown error");
    }
}

static const char * ct_copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "H2D";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "D2H";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "D2D";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "P2P";
        default:                              return "other";
    }
}

static void CUPTIAPI ct_buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    // CUPTI wants 8-byte aligned buffers; malloc gives at least that
    *buffer      = (uint8_t *) malloc(CT_BUFFER_SIZE);
    *size        = *buffer ? CT_BUFFER_SIZE : 0;
    *max_records = 0;
}

static void ct_write(const CUpti_Activity * rec) {
    switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
            const CT_KERNEL_T * k = (const CT_KERNEL_T *) rec;
            fprintf(ct_out, "kernel,%u,%u,%llu,%llu,0,%s\n", k->deviceId, k->streamId,
                    (unsigned long long) k->start, (unsigned long long) k->end, k->name ? k->name : "?");
        } break;
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CT_MEMCPY_T * m = (const CT_MEMCPY_T *) rec;
            fprintf(ct_out, "memcpy,%u,%u,%llu,%llu,%llu,%s\n", m->deviceId, m->streamId,
                    (unsigned long long) m->start, (unsigned long long) m->end,
                    (unsigned long long) m->bytes, ct_copy_kind(m->copyKind));
        } break;
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CT_MEMSET_T * m = (const CT_MEMSET_T *) rec;
            fprintf(ct_out, "memset,%u,%u,%llu,%llu,%llu,memset\n", m->deviceId, m->streamId,
                    (unsigned long long) m->start, (unsigned long long) m->end, (unsigned long long) m->bytes);
        } break;
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            const CUpti_ActivityAPI * a = (const CUpti_ActivityAPI *) rec;
            const char * name = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
            fprintf(ct_out, "api,%u,-1,%llu,%llu,0,%s\n", (unsigned) a->threadId,
                    (unsigned long long) a->start, (unsigned long long) a->end, name ? name : "?");
        } break;
        default:
            break;
    }
}

static void CUPTIAPI ct_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t * buffer, size_t size, size_t valid) {
    (void) ctx; (void) stream; (void) size;
    CUpti_Activity * rec = NULL;
    while (ct_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        ct_write(rec);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0) {
        fprintf(stderr, "cupti-trace: %zu records dropped\n", dropped);
    }
    free(buffer);
}

static void ct_finish(void) {
    ct_check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    if (ct_out) {
        fclose(ct_out);
        ct_out = NULL;
    }
}

// called by the CUDA driver once, at cuInit, for the library named in CUDA_INJECTION64_PATH
int InitializeInjection(void) {
    const char * path = getenv("CUPTI_TRACE_OUT");
    ct_out = fopen(path && *path ? path : "cupti-trace.csv", "w");
    if (!ct_out) {
        perror("cupti-trace: cannot open the output");
        return 0;
    }
    fprintf(ct_out, "kind,device,stream,start_ns,end_ns,bytes,name\n");
    ct_check(cuptiActivityRegisterCallbacks(ct_buffer_requested, ct_buffer_completed), "register callbacks");
    ct_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
    ct_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
    ct_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
    ct_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
    atexit(ct_finish);
    return 1;
}
