// Rotary position embedding, Hugging Face Llama "rotate_half" convention, from a table of
// frequencies (ops::Rope: the model builds it from its RoPE settings). S: storage type (float,
// bf16, f16). Of a head's hd values the first rotary_dim rotate (the rest pass through: partial
// rotary, Phi-3); element i < rotary_dim/2 pairs with i + rotary_dim/2 and rotates by
// angle = pos · inv_freq[i], with c = cos(angle)·attention_factor, s = sin(angle)·attention_factor
// in fp32:
//   out[i] = x[i]·c − x[i+rotary_dim/2]·s,  out[i+rotary_dim/2] = x[i+rotary_dim/2]·c + x[i]·s.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// x: B·T rows with row stride row_stride (elements); each row holds `groups` groups of heads, group
// g from column g·group_stride, and the first nheads heads (hd elements each) of every group are
// rotated: on the grouped qkv layout (attention.h) groups = KVH, nheads = rep + 1 (the queries
// and the key, never the value), group_stride = (rep+2)·hd. Row r of sequence b = r / T is at
// position p = pos[r % T] (pos: context parallelism's parts of longer sequences), or r % T without
// pos, and rotates by p, or with documents (doc_begin (B, seq), ops::AttentionShape's) by its
// position in its document, p − doc_begin[b·seq + p]. In place. inv_freq (rotary_dim/2);
// rotary_dim even, in (0, hd], at most 1024.
template <typename S>
void rope_forward(S* x, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                  int64_t row_stride, const float* inv_freq, int rotary_dim, float attention_factor,
                  const int32_t* pos = nullptr, const int32_t* doc_begin = nullptr, int seq = 0);

// dx: same layout; applies the inverse rotation in place (the gradient of rope_forward).
template <typename S>
void rope_backward(S* dx, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                   int64_t row_stride, const float* inv_freq, int rotary_dim,
                   float attention_factor, const int32_t* pos = nullptr,
                   const int32_t* doc_begin = nullptr, int seq = 0);

}  // namespace strata::kernels
