#include "strata/kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "strata/core/check.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

void check_targets(const int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    STRATA_CHECK(targets[n] < V, "target ", targets[n], " at row ", n,
                 " is outside the vocabulary of ", V, " tokens");
  }
}

struct RowStats {
  float max;
  float sum;  // Σ exp(x − max)
};

template <typename S>
RowStats row_stats(const S* x, int V) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; ++j) mx = std::max(mx, load(x[j]));
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; ++j) sum += exp_approx(load(x[j]) - mx);
  return {mx, sum};
}

}  // namespace

template <typename S>
void cross_entropy_forward_backward(float* losses, S* logits, const int32_t* targets, int N, int V,
                                    float dloss) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    S* x = logits + int64_t(n) * V;  // (V)
    int target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
#pragma omp simd
      for (int j = 0; j < V; ++j) x[j] = store<S>(0.0f);
      continue;
    }
    RowStats st = row_stats(x, V);
    float xt = load(x[target]);
    losses[n] = std::log(st.sum) + st.max - xt;
    float scale = dloss / st.sum;
#pragma omp simd
    for (int j = 0; j < V; ++j) x[j] = store<S>(exp_approx(load(x[j]) - st.max) * scale);
    x[target] = store<S>((exp_approx(xt - st.max) / st.sum - 1.0f) * dloss);
  }
}

template <typename S>
void cross_entropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = logits + int64_t(n) * V;  // (V)
    int target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
      continue;
    }
    RowStats st = row_stats(x, V);
    losses[n] = std::log(st.sum) + st.max - load(x[target]);
  }
}

#define INSTANTIATE_S(S)                                                                        \
  template void cross_entropy_forward_backward<S>(float*, S*, const int32_t*, int, int, float); \
  template void cross_entropy_forward<S>(float*, const S*, const int32_t*, int, int);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
