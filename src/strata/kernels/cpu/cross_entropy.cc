#include "strata/kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

// The soft cap's derivative at a capped logit z: d/du cap·tanh(u/cap) = 1 − (z/cap)², with
// inv_cap = 1/cap; exactly 1 without a cap (inv_cap 0), so that the product is then unchanged.
inline float cap_slope(float z, float inv_cap) {
  const float t = z * inv_cap;
  return inv_cap > 0.0f ? 1.0f - t * t : 1.0f;
}

// out (cols) = the dlogits of x's columns [c0, c0 + cols) (x: a row of the local vocabulary):
// exp(x − mx) · dloss / sum, at the target's column (exp(xt − mx) / sum − 1) · dloss (target < 0:
// not in this row's columns), each times cap_slope(x), 0 from column `valid` on; each rounded to
// S, stored as D. Reads each column before writing it, so out may alias x's columns.
template <typename S, typename D>
void row_dlogits(D* out, const S* x, int64_t c0, int64_t cols, int64_t valid, int64_t target,
                 float xt, float mx, float sum, float dloss, float inv_cap) {
  const float scale = dloss / sum;
  const int64_t live = std::clamp<int64_t>(valid - c0, 0, cols);
#pragma omp simd
  for (int64_t j = 0; j < live; ++j) {
    const float z = load(x[c0 + j]);
    out[j] = store<D>(load(store<S>(exp_approx(z - mx) * scale * cap_slope(z, inv_cap))));
  }
  for (int64_t j = live; j < cols; ++j) out[j] = store<D>(0.0f);
  if (target >= c0 && target < c0 + live) {
    const float dt = (exp_approx(xt - mx) / sum - 1.0f) * dloss * cap_slope(xt, inv_cap);
    out[target - c0] = store<D>(load(store<S>(dt)));
  }
}

}  // namespace

template <typename S>
void cross_entropy_stats(float* losses, float* stats, const S* logits, const int32_t* targets,
                         int N, int V) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * V >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const S* x = logits + int64_t(n) * V;  // (V)
    const int target = targets[n];
    const RowStats st = target < 0 ? RowStats{0.0f, 1.0f} : row_stats(x, V);
    const float xt = target < 0 ? 0.0f : load(x[target]);
    losses[n] = target < 0 ? 0.0f : std::log(st.sum) + st.max - xt;
    stats[n] = st.max, stats[N + n] = st.sum, stats[2 * N + n] = xt;
  }
}

template <typename S, typename D>
void ce_dlogits(D* out, int64_t ldo, const S* logits, const int32_t* targets, const float* stats,
                int N, int V, int64_t c0, int64_t cols, int64_t v0, int valid, float dloss,
                float softcap) {
  const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
#pragma omp parallel for schedule(static) if (parallel : int64_t(N) * cols >= kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    D* o = out + int64_t(n) * ldo;         // (cols)
    const S* x = logits + int64_t(n) * V;  // (V)
    if (targets[n] < 0) {
      for (int64_t j = 0; j < cols; ++j) o[j] = store<D>(0.0f);
      continue;
    }
    const int64_t local = int64_t(targets[n]) - v0;
    const bool owned = local >= 0 && local < valid;
    row_dlogits(o, x, c0, cols, valid, owned ? local : -1, stats[2 * N + n], stats[n], stats[N + n],
                dloss, inv_cap);
  }
}

template <typename S>
void cross_entropy_forward_backward(float* losses, S* logits, const int32_t* targets, int N, int V,
                                    float dloss) {
  std::vector<float> stats(size_t(3) * size_t(N));
  cross_entropy_stats(losses, stats.data(), logits, targets, N, V);
  ce_dlogits(logits, V, logits, targets, stats.data(), N, V, 0, V, 0, V, dloss, 0.0f);
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

void vocab_ce_finish(float* losses, const int32_t* targets, const float* gmax, const float* sums,
                     int N) {
  for (int n = 0; n < N; ++n) {
    losses[n] = targets[n] < 0 ? 0.0f : std::log(sums[n]) + gmax[n] - sums[N + n];
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
  template void cross_entropy_stats<S>(float*, float*, const S*, const int32_t*, int, int);     \
  template void ce_dlogits<S, S>(S*, int64_t, const S*, const int32_t*, const float*, int, int, \
                                 int64_t, int64_t, int64_t, int, float, float);
STRATA_FOR_EACH_S(INSTANTIATE_S)
// Half-precision logits with fp32 dlogits (for products that run in fp32).
template void ce_dlogits<bf16, float>(float*, int64_t, const bf16*, const int32_t*, const float*,
                                      int, int, int64_t, int64_t, int64_t, int, float, float);
template void ce_dlogits<f16, float>(float*, int64_t, const f16*, const int32_t*, const float*, int,
                                     int, int64_t, int64_t, int64_t, int, float, float);

}  // namespace strata::kernels
