// Rotary position embedding, Hugging Face Llama "rotate_half" convention. S: storage type
// (float, bf16, f16). For head dim hd, element i < hd/2 pairs with i + hd/2 and rotates by
// angle = pos · inv_freq[i], inv_freq[i] = 1 / theta^(2i/hd), all in fp32 as HF computes them:
//   out[i] = x[i]·cos − x[i+hd/2]·sin,  out[i+hd/2] = x[i+hd/2]·cos + x[i]·sin.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// x: B·T rows with row stride row_stride (elements); each row holds `groups` groups of heads, group
// g from column g·group_stride, and the first nheads heads (hd elements each) of every group are
// rotated: on the grouped qkv layout (attention.h) groups = KVH, nheads = rep + 1 (the queries
// and the key, never the value), group_stride = (rep+2)·hd. Row r has position pos[r % T]
// (pos: context parallelism's parts of longer sequences), or r % T without pos. In place.
// hd must be even and at most 1024.
template <typename S>
void rope_forward(S* x, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                  int64_t row_stride, float theta, const int32_t* pos = nullptr);

// dx: same layout; applies the inverse rotation in place (the gradient of rope_forward).
template <typename S>
void rope_backward(S* dx, int B, int T, int groups, int nheads, int hd, int64_t group_stride,
                   int64_t row_stride, float theta, const int32_t* pos = nullptr);

}  // namespace strata::kernels
