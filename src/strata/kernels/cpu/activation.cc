#include "strata/kernels/cpu/activation.h"

#include <cstdint>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluA = 0.044715f;

inline float gelu(float x) {
  float u = kGeluC * (x + kGeluA * x * x * x);
  return x * sigmoid(2.0f * u);
}

// With s = sigmoid(2u) = (1 + tanh u)/2: d/dx [x·s] = s + x·2s(1-s)·u'.
inline float gelu_grad(float x) {
  float u = kGeluC * (x + kGeluA * x * x * x);
  float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  float s = sigmoid(2.0f * u);
  return s + x * 2.0f * s * (1.0f - s) * du;
}

}  // namespace

template <typename S>
void gelu_forward(S* out, const S* inp, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) out[i] = store<S>(gelu(load(inp[i])));
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) dinp[i] = store<S>(gelu_grad(load(inp[i])) * load(dout[i]));
}

// (gate, up) pairs are adjacent, so a row is irrelevant: pair i of the N·F is out[i].
template <typename S>
void swiglu_forward(S* out, const S* inp, int N, int F) {
  const int64_t n = int64_t(N) * F;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    float g = load(inp[2 * i]);
    out[i] = store<S>(g * sigmoid(g) * load(inp[2 * i + 1]));
  }
}

// silu'(g) = s·(1 + g·(1 - s)) with s = sigmoid(g).
template <typename S>
void swiglu_backward(S* dinp, const S* dout, const S* inp, int N, int F) {
  const int64_t n = int64_t(N) * F;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    float g = load(inp[2 * i]), u = load(inp[2 * i + 1]), d = load(dout[i]);
    float s = sigmoid(g);
    dinp[2 * i] = store<S>(d * u * s * (1.0f + g * (1.0f - s)));
    dinp[2 * i + 1] = store<S>(d * g * s);
  }
}

// (gate, up) pairs as in SwiGLU.
template <typename S>
void geglu_forward(S* out, const S* inp, int N, int F) {
  const int64_t n = int64_t(N) * F;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) out[i] = store<S>(gelu(load(inp[2 * i])) * load(inp[2 * i + 1]));
}

template <typename S>
void geglu_backward(S* dinp, const S* dout, const S* inp, int N, int F) {
  const int64_t n = int64_t(N) * F;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    float g = load(inp[2 * i]), u = load(inp[2 * i + 1]), d = load(dout[i]);
    dinp[2 * i] = store<S>(d * u * gelu_grad(g));
    dinp[2 * i + 1] = store<S>(d * gelu(g));
  }
}

#define INSTANTIATE_S(S)                                              \
  template void gelu_forward<S>(S*, const S*, size_t);                \
  template void gelu_backward<S>(S*, const S*, const S*, size_t);     \
  template void swiglu_forward<S>(S*, const S*, int, int);            \
  template void swiglu_backward<S>(S*, const S*, const S*, int, int); \
  template void geglu_forward<S>(S*, const S*, int, int);             \
  template void geglu_backward<S>(S*, const S*, const S*, int, int);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
