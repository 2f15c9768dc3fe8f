// Token and position embeddings. S: storage type of activations and parameters (float, bf16,
// f16); G: type parameter gradients accumulate in. Computation is in fp32.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// out (B,T,C) = wte[tokens[b,t]] + (wpe ? wpe[t] : 0); tokens (B,T) in [0, V); wte (V,C);
// wpe (maxT,C) with maxT >= T, or null (rotary models).
template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe, int B, int T,
                       int C);

// dwte (V,C) += dout[b,t] at row tokens[b,t]; dwpe (maxT,C) row t += Σ_b dout[b,t] (dwpe may be
// null); dout (B,T,C). Threads own channel ranges, so repeated tokens add in a fixed order.
template <typename S, typename G>
void embedding_backward(G* dwte, G* dwpe, const S* dout, const int32_t* tokens, int B, int T,
                        int C);

}  // namespace strata::kernels
