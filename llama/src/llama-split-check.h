#pragma once

// Load-time check of a tensor split (LLAMA_SPLIT_MODE_TENSOR), called by patches/0010-* once the model's
// tensors exist and before any is allocated. Upstream's split function (llama_meta_device_get_split_state) and
// the Meta backend's allocation assert their layout rules, so a model they cannot lay out would abort the
// process; this finds those cases first and makes them a load error that names the tensor and the reason.

struct llama_model;

// Throws std::runtime_error("tensor split cannot lay out <tensor>: <reason>") for the first tensor that the
// split cannot place: a fused QKV matrix whose rows are not the Q, K and V rows that the head counts give
// (the split cuts it into those segments), or a slice on axis 0 that is not a whole number of the tensor's
// quantization blocks, or slices that do not add up to the tensor. No-op for other split modes.
void llama_split_check(const llama_model & model);
