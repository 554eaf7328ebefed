// pyllama_so: the test-hook entry (ggml/include/pyllama-so-test-hooks.h), in ggml-base so that libggml (CPU
// virtual devices), ggml-base (the Meta lanes) and the CUDA backend (copy-engine AllReduce) ask the same one.

#include "pyllama-so-test-hooks.h"

#include <atomic>

static std::atomic<pyllama_so_test_hook_fn> g_test_hook_fn{nullptr};

void pyllama_so_test_hooks_install(pyllama_so_test_hook_fn fn) {
    g_test_hook_fn.store(fn, std::memory_order_release);
}

int pyllama_so_test_hook(enum pyllama_so_test_hook hook) {
    const pyllama_so_test_hook_fn fn = g_test_hook_fn.load(std::memory_order_acquire);
    return fn != nullptr && hook >= 0 && hook < PYLLAMA_SO_TEST_HOOK_COUNT ? fn(hook) : 0;
}
