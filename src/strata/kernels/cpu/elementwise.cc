#include "strata/kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

template <typename S>
void add_inplace(S* y, const S* x, size_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) y[i] = store<S>(load(y[i]) + load(x[i]));
}

template <typename S>
void add_bias(S* y, const S* b, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (parallel : M * N >= kParallelMinWork)
  for (int64_t m = 0; m < M; ++m) {
    S* row = y + m * N;  // (N)
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) row[n] = store<S>(load(row[n]) + load(b[n]));
  }
}

namespace {

// tanh in fp32 written so that the loop calling it vectorises (std::tanh does not): below 0.625
// Cephes' odd polynomial, which keeps the relative error small near 0 where 1 − 2/(e^{2x} + 1)
// cancels; above, that form through exp_approx (exactly ±1 where e^{2x} saturates). Relative
// error a few 1e-7; NaN stays NaN.
inline float tanh_fp32(float x) {
  const float a = std::fabs(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = std::copysign(1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f), x);
  return a < 0.625f ? small : large;
}

}  // namespace

template <typename S>
void softcap_inplace(S* t, size_t n, float cap) {
  const float inv = 1.0f / cap;
#pragma omp parallel for simd schedule(static) if (parallel : int64_t(n) >= kParallelMinWork)
  for (size_t i = 0; i < n; ++i) t[i] = store<S>(cap * tanh_fp32(load(t[i]) * inv));
}

#define INSTANTIATE_S(S)                                     \
  template void add_inplace<S>(S*, const S*, size_t);        \
  template void add_bias<S>(S*, const S*, int64_t, int64_t); \
  template void softcap_inplace<S>(S*, size_t, float);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
