#include "strata/kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

template <typename S>
void gather_rows(S* out, const S* x, const int32_t* rows, int64_t R, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel : R * C >= kParallelMinWork)
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(out + r * C, x + int64_t(rows[r]) * C, sizeof(S) * size_t(C));
  }
}

void moe_route_forward(float* probs, float* lse, int32_t* top, float* gates, const float* logits,
                       int64_t N, int E, int k, bool norm_topk) {
#pragma omp parallel for schedule(static) if (parallel : N * E >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    lse[n] = mx + std::log(sum);
    // Top k by probability, descending; equal probabilities: the lower expert first.
    int32_t* t = top + n * k;
    float* g = gates + n * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= t[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      t[j] = best, g[j] = p[best];
    }
    if (norm_topk) {
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s += g[j];
      for (int j = 0; j < k; ++j) g[j] /= s;
    }
  }
}

void moe_plan(int32_t* counts, int32_t* pos, int32_t* rows, const int32_t* top, const float* probs,
              int64_t N, int E, int k, int64_t capacity, int64_t group, bool by_probs) {
  // Capacity: within each group of rows, an expert keeps its first `capacity` choices by
  // probability (then by row and choice) or by position; the rest are dropped (pos -1).
  // Workspace grown to the largest call and kept: a step allocates nothing.
  static thread_local std::vector<int64_t> order, next;
  std::fill(pos, pos + N * k, 0);
  if (capacity > 0) {
    for (int64_t g0 = 0; g0 < N; g0 += group) {
      const int64_t g1 = std::min(N, g0 + group);
      order.clear();
      for (int64_t i = g0 * k; i < g1 * k; ++i) order.push_back(i);
      const auto key = [&](int64_t i) { return probs[i / k * E + top[i]]; };
      // By expert, then probability (by_probs), then row and choice: a total order, so std::sort
      // (which, unlike a stable sort, needs no buffer) gives one result.
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        if (top[a] != top[b]) return top[a] < top[b];
        if (by_probs && key(a) != key(b)) return key(a) > key(b);
        return a < b;
      });
      int64_t taken = 0;
      for (size_t j = 0; j < order.size(); ++j) {
        if (j == 0 || top[order[j]] != top[order[j - 1]]) taken = 0;
        if (taken++ >= capacity) pos[order[j]] = -1;
      }
    }
  }
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < N * k; ++i) {
    if (pos[i] >= 0) ++counts[top[i]];
  }
  next.assign(size_t(E), 0);
  for (int e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e - 1)] + counts[e - 1];
  // Within an expert, its rows in token order (then choice order).
  for (int64_t i = 0; i < N * k; ++i) {
    if (pos[i] < 0) continue;
    const int64_t at = next[size_t(top[i])]++;
    pos[i] = int32_t(at);
    rows[at] = int32_t(i / k);
  }
}

void moe_balance_stats(float* stats, const float* probs, const int32_t* top, int64_t N, int E,
                       int k, int64_t T) {
  const int64_t B = N / T;
  for (int64_t b = 0; b < B; ++b) {
    float* c = stats + b * 2 * E;  // counts, then Σ probs
    float* ps = c + E;
    std::fill(c, c + 2 * E, 0.0f);
    for (int64_t n = b * T; n < (b + 1) * T; ++n) {
      for (int j = 0; j < k; ++j) c[top[n * k + j]] += 1.0f;
      for (int e = 0; e < E; ++e) ps[e] += probs[n * E + e];
    }
  }
}

void moe_route_backward(float* dlogits, const float* dgates, const float* probs, const float* lse,
                        const int32_t* top, const float* gates, const float* coef, int64_t N, int E,
                        int k, bool norm_topk, int64_t T, float z) {
#pragma omp parallel for schedule(static) if (parallel : N * E >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    const int32_t* t = top + n * k;
    const float* dg = dgates + n * k;
    float* d = dlogits + n * E;  // first the gradient of the probabilities
    if (coef != nullptr) {
      std::copy(coef + n / T * E, coef + (n / T + 1) * E, d);
    } else {
      std::fill(d, d + E, 0.0f);
    }
    if (norm_topk) {  // gate_j = p_j / Σ_i p_i over the chosen
      const float* g = gates + n * k;
      float s = 0.0f, dot = 0.0f;
      for (int j = 0; j < k; ++j) s += p[t[j]], dot += dg[j] * g[j];
      for (int j = 0; j < k; ++j) d[t[j]] += (dg[j] - dot) / s;
    } else {
      for (int j = 0; j < k; ++j) d[t[j]] += dg[j];
    }
    // Through the softmax, plus the z-loss's z·lse² (its gradient 2·z·lse·p).
    float pd = 0.0f;
    for (int e = 0; e < E; ++e) pd += p[e] * d[e];
    const float zl = 2.0f * z * lse[n];
    for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - pd + zl);
  }
}

template <typename S>
void moe_combine(S* out, const S* y, const int32_t* pos, const float* w, int64_t N, int k,
                 int64_t C) {
#pragma omp parallel for schedule(static) if (parallel : N * k * C >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    S* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        if (pos[n * k + j] < 0) continue;  // dropped
        const float v = load(y[int64_t(pos[n * k + j]) * C + c]);
        acc += w != nullptr ? w[n * k + j] * v : v;
      }
      o[c] = store<S>(acc);
    }
  }
}

template <typename S>
void moe_combine_backward(S* dy, float* dw, const S* dout, const S* y, const int32_t* pos,
                          const float* w, int64_t N, int k, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel : N * k * C >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const S* d = dout + n * C;
    for (int j = 0; j < k; ++j) {
      const int64_t r = pos[n * k + j];
      if (r < 0) {  // dropped: its gate does not reach the output
        dw[n * k + j] = 0.0f;
        continue;
      }
      const float wj = w[n * k + j];
      const S* yr = y + r * C;
      S* dr = dy + r * C;
      float dot = 0.0f;
      for (int64_t c = 0; c < C; ++c) {
        const float dv = load(d[c]);
        dot += dv * load(yr[c]);
        dr[c] = store<S>(wj * dv);
      }
      dw[n * k + j] = dot;
    }
  }
}

template <typename S>
void moe_gate_forward(S* out, const S* s, float* g, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (parallel : N * C >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float gn = g[n] = 1.0f / (1.0f + std::exp(-g[n]));
    S* o = out + n * C;
    const S* sn = s + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = store<S>(load(o[c]) + gn * load(sn[c]));
  }
}

template <typename S>
void moe_gate_backward(S* ds, float* dg, const S* dout, const S* s, const float* g, int64_t N,
                       int64_t C) {
#pragma omp parallel for schedule(static) if (parallel : N * C >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const S* d = dout + n * C;
    const S* sn = s + n * C;
    S* o = ds + n * C;
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      const float dv = load(d[c]);
      dot += dv * load(sn[c]);
      o[c] = store<S>(g[n] * dv);
    }
    dg[n] = dot * g[n] * (1.0f - g[n]);  // through the sigmoid, to the gate's logit
  }
}

#define INSTANTIATE_S(S)                                                                           \
  template void gather_rows<S>(S*, const S*, const int32_t*, int64_t, int64_t);                    \
  template void moe_combine<S>(S*, const S*, const int32_t*, const float*, int64_t, int, int64_t); \
  template void moe_combine_backward<S>(S*, float*, const S*, const S*, const int32_t*,            \
                                        const float*, int64_t, int, int64_t);                      \
  template void moe_gate_forward<S>(S*, const S*, float*, int64_t, int64_t);                       \
  template void moe_gate_backward<S>(S*, float*, const S*, const S*, const float*, int64_t,        \
                                     int64_t);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
