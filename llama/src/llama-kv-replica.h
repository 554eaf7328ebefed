#pragma once

// KV head replication under LLAMA_SPLIT_MODE_TENSOR (patches/0010-*): a layer with one KV head (MQA: Gemma 3
// 270M/1B, Falcon, StarCoder) cannot give each device whole KV heads of its own. Upstream's split then keeps
// every query head with that one KV head, so one device holds all of the layer's attention. Instead, as
// vLLM does when the tensor-parallel size exceeds the KV heads, each device that gets query heads keeps a
// copy of the KV head: the K/V projections, their biases and norms and the KV cache of the layer are
// mirrored (every device computes and stores the head), and the query heads are split one by one.

#include <cstddef>
#include <cstdint>

struct ggml_tensor;
struct llama_model;

// Whether layer il replicates its KV head over n_devices: an attention layer (not recurrent) with one KV
// head, more than one query head, separate K and V projections (a fused QKV matrix cannot give the query
// part a split and the K/V part a copy) and attention proportions (attn_split, else tensor_split) that give
// two or more devices a share. With one device sharing, upstream's layout is already one copy.
bool llama_kv_replica_layer(const llama_model & model, size_t n_devices, uint32_t il);

// Whether a tensor is the KV side of a replicating layer (attn_k/attn_v weights and biases, the K norm,
// cache_k/cache_v): the split function mirrors it.
bool llama_kv_replica_mirrored(const llama_model & model, size_t n_devices, const ggml_tensor * tensor);

// Query heads per granule of the attention split of layer il: 1 in a replicating layer (each device may get
// any number of query heads), else upstream's n_gqa (the query heads of one KV head stay together).
uint32_t llama_kv_replica_q_group(const llama_model & model, size_t n_devices, uint32_t il);
