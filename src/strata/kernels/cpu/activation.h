// Pointwise activations. S: storage type (float, bf16, f16); computation is in fp32.
#pragma once

#include <cstddef>

#include "strata/core/dtype.h"

namespace strata::kernels {

// out (n) = GELU(inp) with the tanh approximation (PyTorch approximate='tanh'):
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), evaluated as x·sigmoid(2·√(2/π)·(x + 0.044715·x³)).
template <typename S>
void gelu_forward(S* out, const S* inp, size_t n);

// dinp (n) = dout · GELU'(inp); dinp may alias dout.
template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, size_t n);

// inp (N,2F) interleaved: column 2f is gate f, 2f+1 is up f (llama's fused gate|up rows,
// param_spec.h); out (N,F) = silu(gate) · up.
template <typename S>
void swiglu_forward(S* out, const S* inp, int N, int F);

// dinp (N,2F) written, interleaved like inp; dout (N,F); inp (N,2F) as in the forward.
template <typename S>
void swiglu_backward(S* dinp, const S* dout, const S* inp, int N, int F);

// GeGLU over the same interleaved layout: out (N,F) = GELU(gate) · up, GELU the tanh
// approximation of gelu_forward (Hugging Face's gelu_pytorch_tanh: Gemma's MLP).
template <typename S>
void geglu_forward(S* out, const S* inp, int N, int F);

// dinp (N,2F) written, interleaved like inp; dout (N,F); inp (N,2F) as in the forward.
template <typename S>
void geglu_backward(S* dinp, const S* dout, const S* inp, int N, int F);

}  // namespace strata::kernels
