#pragma once

// The test-only switches (docs/multi-gpu.md, "Test-only switches"): environment variables that break product
// code on purpose, so that the tests can show they would catch the bug. The product never reads them: it asks
// its test hooks (ggml/include/pyllama-so-test-hooks.h), and this harness answers from the variables, read
// each time the product asks. Test harness only: built into libpyllama-so-testing.

#ifdef __cplusplus
extern "C" {
#endif

// Installs the answers into the product. Called when pyllama_so.testing is imported; idempotent.
void pyllama_so_testing_install_test_hooks(void);

// The variables, one per hook, in the order of enum pyllama_so_test_hook; *n receives their count.
const char * const * pyllama_so_testing_test_switches(int * n);

#ifdef __cplusplus
}
#endif
