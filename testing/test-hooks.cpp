// The test-only switches: the harness's answers to the product's test hooks. See test-hooks.h.

#include "test-hooks.h"

#include "pyllama-so-test-hooks.h"

#include "ggml-impl.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

// one variable per hook, in the order of enum pyllama_so_test_hook
static const char * const g_switches[PYLLAMA_SO_TEST_HOOK_COUNT] = {
    "GGML_CPU_VIRTUAL_BREAK_EVENT_WAIT", // 1: event waits of CPU virtual backends created from now on return at once
    "GGML_CPU_VIRTUAL_NO_EVENTS",        // 1: the CPU virtual devices report no events
    "GGML_META_LANES_TEST",              // nowait | same_index: the ordering between split-overlap lanes
    "GGML_CUDA_AR_CE_FAIL_ALLOC",        // 1: the copy-engine buffers of comm contexts created from now on fail
};

// what each breaks, for the warning (which must not repeat the product's own messages)
static const char * const g_breaks[PYLLAMA_SO_TEST_HOOK_COUNT] = {
    "event waits of the CPU virtual devices return at once",
    "the CPU virtual devices claim to lack event support",
    "the ordering between split-overlap lanes is broken",
    "the copy-engine AllReduce buffers fail to allocate",
};

static std::atomic<bool> g_warned[PYLLAMA_SO_TEST_HOOK_COUNT];

static int answer(enum pyllama_so_test_hook hook) {
    const char * v = getenv(g_switches[hook]);
    if (v == nullptr || v[0] == '\0') {
        return 0;
    }
    int on = 0;
    switch (hook) {
        case PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_BREAK_EVENT_WAIT:
        case PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_NO_EVENTS:
            on = atoi(v) != 0;
            break;
        case PYLLAMA_SO_TEST_HOOK_META_LANES_ORDER:
            on = strcmp(v, "nowait") == 0     ? PYLLAMA_SO_TEST_LANES_ORDER_NOWAIT :
                 strcmp(v, "same_index") == 0 ? PYLLAMA_SO_TEST_LANES_ORDER_SAME_INDEX : 0;
            break;
        case PYLLAMA_SO_TEST_HOOK_CUDA_AR_CE_FAIL_ALLOC:
            on = strcmp(v, "0") != 0;
            break;
        default:
            break;
    }
    // said once per process: some hooks are asked often (the devices' properties)
    if (on != 0 && !g_warned[hook].exchange(true)) {
        GGML_LOG_WARN("pyllama_so testing: TEST ONLY: %s=%s: %s\n", g_switches[hook], v, g_breaks[hook]);
    }
    return on;
}

void pyllama_so_testing_install_test_hooks(void) {
    pyllama_so_test_hooks_install(answer);
}

const char * const * pyllama_so_testing_test_switches(int * n) {
    *n = PYLLAMA_SO_TEST_HOOK_COUNT;
    return g_switches;
}
