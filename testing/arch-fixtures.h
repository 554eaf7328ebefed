#pragma once

// Fixtures for the per-architecture tests (tests/multi_device/test_archs.py, python -m pyllama_so.archs),
// equivalent to upstream's tests/test-llama-archs.cpp. Test harness only: built into
// libpyllama-so-testing, never into libllama.

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pyllama_so_arch_flag {
    PYLLAMA_SO_ARCH_KNOWN         = 1u << 0,
    PYLLAMA_SO_ARCH_SUPPORTED     = 1u << 1, // upstream runs it (else its rows are SKIP)
    PYLLAMA_SO_ARCH_MOE           = 1u << 2, // has a MoE variant
    PYLLAMA_SO_ARCH_MOE_MANDATORY = 1u << 3, // has no dense variant
    PYLLAMA_SO_ARCH_ENCODE        = 1u << 4, // needs an encode pass before decoding
    PYLLAMA_SO_ARCH_SM_TENSOR     = 1u << 5, // LLAMA_SPLIT_MODE_TENSOR implemented
    PYLLAMA_SO_ARCH_SAVER         = 1u << 6, // llama_model_saver can write it
    PYLLAMA_SO_ARCH_MQA           = 1u << 7, // has an MQA variant (ours: one KV head for four query heads)
};

// architectures in upstream's table (excluded ones left out), in upstream's order
size_t       pyllama_so_arch_count(void);
const char * pyllama_so_arch_name(size_t i);
uint32_t     pyllama_so_arch_flags(const char * arch);

// GGUF metadata of a tiny model of this architecture; free with gguf_free; NULL for an unknown name.
// mqa: four query heads and one KV head in every attention layer (not with moe)
struct gguf_context * pyllama_so_arch_metadata(const char * arch, bool moe, bool mqa);

#ifdef __cplusplus
}
#endif
