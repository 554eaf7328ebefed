#pragma once

// pyllama_so: the one entry through which the test harness breaks product code on purpose, to show that the
// tests would catch the bug (docs/multi-gpu.md, "Test-only switches"). The product only asks; nothing in it
// answers. The harness (libpyllama-so-testing, loaded with the Python package pyllama_so.testing) installs
// the function that answers, from switches of its own. Without it every hook answers 0: the product's
// behaviour. The libraries that ship (libggml*, libllama) are the same in a test run: only the installed
// answer differs.

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

enum pyllama_so_test_hook {
    PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_BREAK_EVENT_WAIT, // != 0: event waits of the CPU virtual backend being created return at once
    PYLLAMA_SO_TEST_HOOK_CPU_VIRTUAL_NO_EVENTS,        // != 0: the CPU virtual devices report no events (asked with their properties)
    PYLLAMA_SO_TEST_HOOK_META_LANES_ORDER,             // a pyllama_so_test_lanes_order, asked when two Meta backends are linked as lanes
    PYLLAMA_SO_TEST_HOOK_CUDA_AR_CE_FAIL_ALLOC,        // != 0: the copy-engine buffers of the comm context being created fail to allocate
    PYLLAMA_SO_TEST_HOOK_COUNT,
};

enum pyllama_so_test_lanes_order {
    PYLLAMA_SO_TEST_LANES_ORDER_STATE      = 0, // the product's: wait for the other lane's last use of the state
    PYLLAMA_SO_TEST_LANES_ORDER_NOWAIT     = 1, // no cross-lane waits
    PYLLAMA_SO_TEST_LANES_ORDER_SAME_INDEX = 2, // wait only for the other lane's subgraph of the same index
};

// The answer to one hook; called from any thread, when the product reaches the point named above.
typedef int (*pyllama_so_test_hook_fn)(enum pyllama_so_test_hook hook);

// Installs fn (NULL: none). Only the test harness calls this.
GGML_API void pyllama_so_test_hooks_install(pyllama_so_test_hook_fn fn);

// The installed function's answer, or 0 without one.
GGML_API int pyllama_so_test_hook(enum pyllama_so_test_hook hook);

#ifdef __cplusplus
}
#endif
