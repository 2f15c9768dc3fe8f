// LayerNorm and RMSNorm over the last dimension. S: storage type of activations and parameters
// (float, bf16, f16); G: type parameter gradients accumulate in. Statistics are fp32.
//
// Backward adds into dinp (it is the residual stream's gradient, as in llm.c) and into the
// parameter gradients. dweight/dbias are reduced over rows in a fixed partition — row blocks
// summed into `scratch`, then the blocks combined in order — so results do not depend on the
// number of threads.
#pragma once

#include <cstddef>

#include "strata/core/dtype.h"

namespace strata::kernels {

// Floats of scratch that layernorm_backward / rmsnorm_backward need for N rows of width C.
size_t norm_backward_scratch_floats(int N, int C);

// out (N,C), mean/rstd (N) saved for backward (either may be null in evaluation); inp (N,C);
// weight (C); bias (C) or null.
template <typename S>
void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight,
                       const S* bias, int N, int C, float eps);

// dinp (N,C) +=; dweight (C) +=; dbias (C) += or null; scratch (norm_backward_scratch_floats);
// dout, inp (N,C); weight (C); mean/rstd (N) from the forward.
template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, float* scratch, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int N, int C);

// The two halves of layernorm_backward apart, bit for bit what it gives: dinp (N,C) +=;
// dweight, dbias (C) += (dbias may be null).
template <typename S>
void layernorm_backward_input(S* dinp, const S* dout, const S* inp, const S* weight,
                              const float* mean, const float* rstd, int N, int C);
template <typename S, typename G>
void layernorm_backward_weight(G* dweight, G* dbias, float* scratch, const S* dout, const S* inp,
                               const float* mean, const float* rstd, int N, int C);

// The offset to add to an RMSNorm gain weight, in fp32: w_offset itself, or −0 for none, which is
// addition's identity (−0 + w is w, a −0 w included), so that w_offset 0 gives the plain gain's
// bits.
inline float gain_offset(float w_offset) {
  return w_offset == 0.0f ? -0.0f : w_offset;
}

// out (N,C) = inp · rstd · (w_offset + weight) with rstd = 1/sqrt(mean(inp²) + eps); rstd (N) or
// null. The gain is formed in fp32 (Gemma's 1 + w loses nothing to S).
template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int N, int C, float eps,
                     float w_offset = 0.0f);

// dinp (N,C) +=; dweight (C) +=; scratch (norm_backward_scratch_floats); dout, inp (N,C).
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, float* scratch, const S* dout, const S* inp,
                      const S* weight, const float* rstd, int N, int C, float w_offset = 0.0f);

// The two halves of rmsnorm_backward apart, bit for bit what it gives (the weight's gradient does
// not depend on w_offset).
template <typename S>
void rmsnorm_backward_input(S* dinp, const S* dout, const S* inp, const S* weight,
                            const float* rstd, int N, int C, float w_offset = 0.0f);
template <typename S, typename G>
void rmsnorm_backward_weight(G* dweight, float* scratch, const S* dout, const S* inp,
                             const float* rstd, int N, int C);

}  // namespace strata::kernels
