#include "strata/kernels/cpu/elementwise.h"

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

#define INSTANTIATE_S(S)                              \
  template void add_inplace<S>(S*, const S*, size_t); \
  template void add_bias<S>(S*, const S*, int64_t, int64_t);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
