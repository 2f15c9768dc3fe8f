// Elementwise arithmetic between activations. S: storage type (float, bf16, f16); computation
// is in fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// y (n) += x (n): the residual connection, added in fp32 and rounded to S once.
template <typename S>
void add_inplace(S* y, const S* x, size_t n);

// y (M,N) += b (N) on every row, added in fp32 and rounded to S once (linear_forward's bias).
template <typename S>
void add_bias(S* y, const S* b, int64_t M, int64_t N);

// t (n) = cap · tanh(t / cap) (cap > 0): Gemma 2's final-logit soft cap, relative error of a few
// fp32 ulps before the rounding to S.
template <typename S>
void softcap_inplace(S* t, size_t n, float cap);

}  // namespace strata::kernels
