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

// The serial and the vocabulary-parallel forms share these, so that with one rank they agree.
template <typename S>
float row_max(const S* x, int V) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; ++j) mx = std::max(mx, load(x[j]));
  return mx;
}

template <typename S>
float row_sumexp(const S* x, int V, float mx) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < V; ++j) sum += exp_approx(load(x[j]) - mx);
  return sum;
}

template <typename S>
RowStats row_stats(const S* x, int V) {
  float mx = row_max(x, V);
  return {mx, row_sumexp(x, V, mx)};
}

// x (V) = exp(x − max) · dloss / sum, the target's (exp(xt − max) / sum − 1) · dloss (target < 0:
// this row holds no target).
template <typename S>
void row_dlogits(S* x, int V, int target, float xt, float mx, float sum, float dloss) {
  float scale = dloss / sum;
#pragma omp simd
  for (int j = 0; j < V; ++j) x[j] = store<S>(exp_approx(load(x[j]) - mx) * scale);
  if (target >= 0) x[target] = store<S>((exp_approx(xt - mx) / sum - 1.0f) * dloss);
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
    row_dlogits(x, V, target, xt, st.max, st.sum, dloss);
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

template <typename S>
void vocab_ce_max(float* rowmax, const S* logits, int N, int V, int valid) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) rowmax[n] = row_max(logits + int64_t(n) * V, valid);
}

template <typename S>
void vocab_ce_sums(float* sums, const S* logits, const int32_t* targets, const float* gmax, int N,
                   int V, int64_t v0, int valid) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = logits + int64_t(n) * V;  // (V)
    const int64_t local = int64_t(targets[n]) - v0;
    sums[n] = targets[n] < 0 ? 0.0f : row_sumexp(x, valid, gmax[n]);
    sums[N + n] = targets[n] >= 0 && local >= 0 && local < valid ? load(x[local]) : 0.0f;
  }
}

template <typename S>
void vocab_ce_finish(float* losses, S* logits, const int32_t* targets, const float* gmax,
                     const float* sums, int N, int V, int64_t v0, int valid, bool train,
                     float dloss) {
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    S* x = logits + int64_t(n) * V;  // (V)
    const int target = targets[n];
    const float xt = sums[N + n];
    losses[n] = target < 0 ? 0.0f : std::log(sums[n]) + gmax[n] - xt;
    if (!train) continue;
    if (target < 0) {
#pragma omp simd
      for (int j = 0; j < V; ++j) x[j] = store<S>(0.0f);
      continue;
    }
    const int64_t local = int64_t(target) - v0;
    const bool owned = local >= 0 && local < valid;
    row_dlogits(x, valid, owned ? int(local) : -1, xt, gmax[n], sums[n], dloss);
#pragma omp simd
    for (int j = valid; j < V; ++j) x[j] = store<S>(0.0f);
  }
}

void max_rows(float* out, const float* in, int K, int64_t N) {
#pragma omp parallel for simd schedule(static) if (parallel : K * N >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    float mx = -INFINITY;
    for (int k = 0; k < K; ++k) mx = std::max(mx, in[k * N + n]);
    out[n] = mx;
  }
}

#define INSTANTIATE_S(S)                                                                        \
  template void cross_entropy_forward_backward<S>(float*, S*, const int32_t*, int, int, float); \
  template void cross_entropy_forward<S>(float*, const S*, const int32_t*, int, int);           \
  template void vocab_ce_max<S>(float*, const S*, int, int, int);                               \
  template void vocab_ce_sums<S>(float*, const S*, const int32_t*, const float*, int, int,      \
                                 int64_t, int);                                                 \
  template void vocab_ce_finish<S>(float*, S*, const int32_t*, const float*, const float*, int, \
                                   int, int64_t, int, bool, float);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
