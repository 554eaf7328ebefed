#pragma once

// Attention split (llama_model_params::attn_split, patches/0006-*): under LLAMA_SPLIT_MODE_TENSOR the
// tensors whose split follows the attention output (Q/K/V weights and biases, fused QKV, QK norms, the
// attention gate and sinks, the KV cache) are split by attn_split instead of tensor_split, so the
// attention heads and their KV cache can be placed apart from the FFN and the rest of the model.

struct ggml_tensor;
struct llama_model;

// The proportions for a tensor whose split is defined by tensor_axis_0 (upstream's tensor_config): the
// model's attn_split when tensor_axis_0 is an attention output ("blk.N.attn_output.weight") and attn_split
// is set and not all zero, else nullptr (the caller keeps tensor_split). Rounding to whole heads stays
// upstream's (get_split_granularity): each boundary is rounded down to the head granularity.
const float * llama_attn_split_for(const llama_model & model, const ggml_tensor * tensor_axis_0);
