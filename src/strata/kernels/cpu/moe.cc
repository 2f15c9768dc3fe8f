#include "strata/kernels/cpu/moe.h"

#include <algorithm>
#include <array>
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

namespace {

// A row's logsumexp of its E logits, and its maximum.
struct RowMax {
  float max, sum;
};
RowMax row_exp_sum(const float* l, int E) {
  float mx = l[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
  return {mx, sum};
}

// t (k): the k experts of the largest key(e), descending; equal keys: the lower expert first.
// g (k): value(t[j]).
template <typename Key, typename Value>
void top_k_of(int32_t* t, float* g, int E, int k, Key key, Value value) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= t[i] == e;
      if (!taken && (best < 0 || key(e) > key(best))) best = e;
    }
    t[j] = best, g[j] = value(best);
  }
}

}  // namespace

void moe_route_forward(float* probs, float* lse, int32_t* top, float* gates, const float* logits,
                       int64_t N, int E, int k, bool norm_topk) {
#pragma omp parallel for schedule(static) if (parallel : N * E >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    const RowMax r = row_exp_sum(l, E);
    const float inv = 1.0f / r.sum;
    for (int e = 0; e < E; ++e) p[e] = std::exp(l[e] - r.max) * inv;
    lse[n] = r.max + std::log(r.sum);
    const auto prob = [&](int e) { return p[e]; };
    float* g = gates + n * k;
    top_k_of(top + n * k, g, E, k, prob, prob);
    if (norm_topk) {
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s += g[j];
      for (int j = 0; j < k; ++j) g[j] /= s;
    }
  }
}

void moe_route_sigmoid_forward(float* probs, float* lse, int32_t* top, float* gates,
                               const float* logits, const float* bias, int64_t N, int E, int k,
                               bool norm_topk, int groups, int topk_groups, float scale) {
  const int per = E / groups;
#pragma omp parallel for schedule(static) if (parallel : N * E >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* s = probs + n * E;
    const RowMax r = row_exp_sum(l, E);  // before s overwrites l (in place)
    lse[n] = r.max + std::log(r.sum);
    for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    // The groups' values: the sum of each group's two largest choices (score + bias).
    auto choice = [&](int e) { return s[e] + (bias != nullptr ? bias[e] : 0.0f); };
    std::array<float, kMaxExpertGroups> value{};
    for (int g = 0; g < groups; ++g) {
      float a = -INFINITY, b = -INFINITY;  // the largest, the second
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float c = choice(e);
        if (c > a) {
          b = a, a = c;
        } else if (c > b) {
          b = c;
        }
      }
      value[size_t(g)] = a + b;
    }
    // The topk_groups best groups keep their choices; the others' count as 0.
    std::array<bool, kMaxExpertGroups> kept{};
    for (int j = 0; j < topk_groups; ++j) {
      int best = -1;
      for (int g = 0; g < groups; ++g) {
        if (!kept[size_t(g)] && (best < 0 || value[size_t(g)] > value[size_t(best)])) best = g;
      }
      kept[size_t(best)] = true;
    }
    float* g = gates + n * k;
    top_k_of(
        top + n * k, g, E, k, [&](int e) { return kept[size_t(e / per)] ? choice(e) : 0.0f; },
        [&](int e) { return s[e]; });
    if (norm_topk) {
      float total = 0.0f;
      for (int j = 0; j < k; ++j) total += g[j];
      total += 1e-20f;
      for (int j = 0; j < k; ++j) g[j] /= total;
    }
    for (int j = 0; j < k; ++j) g[j] *= scale;
  }
}

void moe_route_sigmoid_backward(float* dlogits, const float* dgates, const float* scores,
                                const int32_t* top, const float* coef, int64_t N, int E, int k,
                                bool norm_topk, float scale, int64_t T) {
#pragma omp parallel for schedule(static) if (parallel : N * E >= kParallelMinWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* s = scores + n * E;
    const int32_t* t = top + n * k;
    const float* dg = dgates + n * k;
    float* d = dlogits + n * E;  // first the gradient of the scores
    std::fill(d, d + E, 0.0f);
    if (coef != nullptr) {  // Σ_e coef_e · s_e / S, S = Σ_i s_i + 1e-20 over every expert
      const float* c = coef + n / T * E;
      float total = 0.0f, dot = 0.0f;
      for (int e = 0; e < E; ++e) total += s[e], dot += c[e] * s[e];
      total += 1e-20f;
      for (int e = 0; e < E; ++e) d[e] = (c[e] - dot / total) / total;
    }
    if (norm_topk) {  // gate_j = scale · s_j / S, S = Σ_i s_i + 1e-20 over the chosen
      float total = 0.0f, dot = 0.0f;
      for (int j = 0; j < k; ++j) total += s[t[j]], dot += dg[j] * s[t[j]];
      total += 1e-20f;
      for (int j = 0; j < k; ++j) d[t[j]] += scale * (dg[j] - dot / total) / total;
    } else {
      for (int j = 0; j < k; ++j) d[t[j]] += scale * dg[j];
    }
    for (int e = 0; e < E; ++e) d[e] *= s[e] * (1.0f - s[e]);  // through the sigmoid
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
                       int k, int64_t T, bool normalized) {
  const int64_t B = N / T;
  for (int64_t b = 0; b < B; ++b) {
    float* c = stats + b * 2 * E;  // counts, then Σ probs
    float* ps = c + E;
    std::fill(c, c + 2 * E, 0.0f);
    for (int64_t n = b * T; n < (b + 1) * T; ++n) {
      const float* p = probs + n * E;
      for (int j = 0; j < k; ++j) c[top[n * k + j]] += 1.0f;
      float total = 1.0f;
      if (normalized) {
        total = 1e-20f;
        for (int e = 0; e < E; ++e) total += p[e];
      }
      for (int e = 0; e < E; ++e) ps[e] += normalized ? p[e] / total : p[e];
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
