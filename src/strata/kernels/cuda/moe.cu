// A mixture of experts' routing, dispatch and combine on the GPU (ops.h), with the CPU backend's
// formulas (kernels/cpu/moe.cc) in fp32 and each output rounded once. The router takes a thread
// per row (E and k are small); the combine a thread per output element, its j-loop in choice
// order; the combine's and the gate's backward a block per row or choice, reduced in a fixed
// tree (common.cuh). The plan (a stable sort of N·k choices by expert, with the capacity's
// ranking) is made on the host by the CPU kernel from the choices copied back: its counts are
// needed there anyway, for the grouped products' sizes. No atomics: the same inputs give the same
// bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/kernels/cpu/moe.h"
#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

unsigned grid(int64_t n) {
  return std::min(blocks_for(n, kThreads), kMaxBlocks);
}

__global__ void __launch_bounds__(kThreads)
    route_kernel(float* probs, float* lse, int32_t* top, float* gates, const float* logits,
                 int64_t N, int E, int k, bool norm) {
  for (int64_t n = packs::thread_index(); n < N; n += packs::thread_count()) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = expf(l[e] - mx));
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    lse[n] = mx + logf(sum);
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
    if (norm) {
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s += g[j];
      for (int j = 0; j < k; ++j) g[j] /= s;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    route_backward_kernel(float* dlogits, const float* dgates, const float* probs, const float* lse,
                          const int32_t* top, const float* gates, const float* coef, int64_t N,
                          int E, int k, bool norm, int64_t T, float z) {
  for (int64_t n = packs::thread_index(); n < N; n += packs::thread_count()) {
    const float* p = probs + n * E;
    const int32_t* t = top + n * k;
    const float* dg = dgates + n * k;
    float* d = dlogits + n * E;
    for (int e = 0; e < E; ++e) d[e] = coef != nullptr ? coef[n / T * E + e] : 0.0f;
    if (norm) {
      const float* g = gates + n * k;
      float s = 0.0f, dot = 0.0f;
      for (int j = 0; j < k; ++j) s += p[t[j]], dot += dg[j] * g[j];
      for (int j = 0; j < k; ++j) d[t[j]] += (dg[j] - dot) / s;
    } else {
      for (int j = 0; j < k; ++j) d[t[j]] += dg[j];
    }
    float pd = 0.0f;
    for (int e = 0; e < E; ++e) pd += p[e] * d[e];
    const float zl = 2.0f * z * lse[n];
    for (int e = 0; e < E; ++e) d[e] = p[e] * (d[e] - pd + zl);
  }
}

// DeepSeek-V3's router (kernels/cpu/moe.cc moe_route_sigmoid_forward's formulas), a thread per row.
__global__ void __launch_bounds__(kThreads)
    sigmoid_route_kernel(float* probs, float* lse, int32_t* top, float* gates, const float* logits,
                         const float* bias, int64_t N, int E, int k, bool norm, int groups,
                         int topk_groups, float scale) {
  const int per = E / groups;
  for (int64_t n = packs::thread_index(); n < N; n += packs::thread_count()) {
    const float* l = logits + n * E;
    float* s = probs + n * E;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      sum += expf(l[e] - mx);
      s[e] = 1.0f / (1.0f + expf(-l[e]));
    }
    lse[n] = mx + logf(sum);
    // Kept groups as bits (at most kMaxExpertGroups = 64).
    uint64_t kept = 0;
    for (int j = 0; j < topk_groups; ++j) {
      int best = -1;
      float best_value = 0.0f;
      for (int g = 0; g < groups; ++g) {
        if ((kept >> g) & 1u) continue;
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const float c = s[e] + (bias != nullptr ? bias[e] : 0.0f);
          if (c > a) {
            b = a, a = c;
          } else if (c > b) {
            b = c;
          }
        }
        if (best < 0 || a + b > best_value) best = g, best_value = a + b;
      }
      kept |= uint64_t(1) << best;
    }
    int32_t* t = top + n * k;
    float* g = gates + n * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float best_value = 0.0f;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= t[i] == e;
        const float c = (kept >> (e / per)) & 1u ? s[e] + (bias != nullptr ? bias[e] : 0.0f) : 0.0f;
        if (!taken && (best < 0 || c > best_value)) best = e, best_value = c;
      }
      t[j] = best, g[j] = s[best];
    }
    if (norm) {
      float total = 0.0f;
      for (int j = 0; j < k; ++j) total += g[j];
      total += 1e-20f;
      for (int j = 0; j < k; ++j) g[j] /= total;
    }
    for (int j = 0; j < k; ++j) g[j] *= scale;
  }
}

__global__ void __launch_bounds__(kThreads)
    sigmoid_route_backward_kernel(float* dlogits, const float* dgates, const float* scores,
                                  const int32_t* top, const float* coef, int64_t N, int E, int k,
                                  bool norm, float scale, int64_t T) {
  for (int64_t n = packs::thread_index(); n < N; n += packs::thread_count()) {
    const float* s = scores + n * E;
    const int32_t* t = top + n * k;
    const float* dg = dgates + n * k;
    float* d = dlogits + n * E;
    for (int e = 0; e < E; ++e) d[e] = 0.0f;
    if (coef != nullptr) {  // the balancing loss's, through the normalised scores
      const float* c = coef + n / T * E;
      float total = 0.0f, dot = 0.0f;
      for (int e = 0; e < E; ++e) total += s[e], dot += c[e] * s[e];
      total += 1e-20f;
      for (int e = 0; e < E; ++e) d[e] = (c[e] - dot / total) / total;
    }
    if (norm) {
      float total = 0.0f, dot = 0.0f;
      for (int j = 0; j < k; ++j) total += s[t[j]], dot += dg[j] * s[t[j]];
      total += 1e-20f;
      for (int j = 0; j < k; ++j) d[t[j]] += scale * (dg[j] - dot / total) / total;
    } else {
      for (int j = 0; j < k; ++j) d[t[j]] += scale * dg[j];
    }
    for (int e = 0; e < E; ++e) d[e] *= s[e] * (1.0f - s[e]);
  }
}

// One thread per (sequence, expert): its choices and the sum of its probability over the
// sequence's rows, in row order.
__global__ void __launch_bounds__(kThreads)
    balance_kernel(float* stats, const float* probs, const int32_t* top, int64_t B, int E, int k,
                   int64_t T, bool normalized) {
  for (int64_t i = packs::thread_index(); i < B * E; i += packs::thread_count()) {
    const int64_t b = i / E;
    const int e = int(i % E);
    float c = 0.0f, ps = 0.0f;
    for (int64_t n = b * T; n < (b + 1) * T; ++n) {
      for (int j = 0; j < k; ++j) c += top[n * k + j] == e ? 1.0f : 0.0f;
      float total = 1.0f;
      if (normalized) {
        total = 1e-20f;
        for (int x = 0; x < E; ++x) total += probs[n * E + x];
      }
      ps += normalized ? probs[n * E + e] / total : probs[n * E + e];
    }
    stats[b * 2 * E + e] = c;
    stats[b * 2 * E + E + e] = ps;
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(S* out, const S* x, const int32_t* rows, int64_t R, int64_t C) {
  for (int64_t i = packs::thread_index(); i < R * C; i += packs::thread_count()) {
    out[i] = x[int64_t(rows[i / C]) * C + i % C];
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(S* out, const S* y, const int32_t* pos, const float* w, int64_t N, int k,
                   int64_t C) {
  for (int64_t i = packs::thread_index(); i < N * C; i += packs::thread_count()) {
    const int64_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = pos[n * k + j];
      if (r < 0) continue;
      const float v = to_f(y[int64_t(r) * C + c]);
      acc += w != nullptr ? w[n * k + j] * v : v;
    }
    out[i] = from_f<S>(acc);
  }
}

// A block per choice (n, j).
template <typename S>
__global__ void __launch_bounds__(kThreads)
    combine_backward_kernel(S* dy, float* dw, const S* dout, const S* y, const int32_t* pos,
                            const float* w, int k, int64_t C) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x, n = i / k;
  const int32_t r = pos[i];
  if (r < 0) {
    if (threadIdx.x == 0) dw[i] = 0.0f;
    return;
  }
  const float wj = w[i];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dv = to_f(dout[n * C + c]);
    dot += dv * to_f(y[int64_t(r) * C + c]);
    dy[int64_t(r) * C + c] = from_f<S>(wj * dv);
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dw[i] = dot;
}

// A block per row: the gate's sigmoid (replacing its logit), then out += g·s.
template <typename S>
__global__ void __launch_bounds__(kThreads) gate_kernel(S* out, const S* s, float* g, int64_t C) {
  const int64_t n = blockIdx.x;
  const float gn = 1.0f / (1.0f + expf(-g[n]));
  __syncthreads();  // every thread has read the logit before it is replaced
  if (threadIdx.x == 0) g[n] = gn;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    out[n * C + c] = from_f<S>(to_f(out[n * C + c]) + gn * to_f(s[n * C + c]));
  }
}

template <typename S>
__global__ void __launch_bounds__(kThreads)
    gate_backward_kernel(S* ds, float* dg, const S* dout, const S* s, const float* g, int64_t C) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float gn = g[n];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dv = to_f(dout[n * C + c]);
    dot += dv * to_f(s[n * C + c]);
    ds[n * C + c] = from_f<S>(gn * dv);
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dg[n] = dot * gn * (1.0f - gn);
}

// Host staging for the plan, grown to the largest call and kept.
template <typename T>
T* staged(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

void moe_route_forward(Tensor probs, Tensor lse, Tensor top, Tensor gates, Tensor logits,
                       const MoeRoute& r, Tensor bias) {
  const int64_t N = logits.numel() / r.experts;
  if (N == 0) return;
  if (r.sigmoid) {
    sigmoid_route_kernel<<<grid(N), kThreads, 0, compute_stream()>>>(
        dev<float>(probs), dev<float>(lse), dev<int32_t>(top), dev<float>(gates),
        dev<const float>(logits), bias.data != nullptr ? dev<const float>(bias) : nullptr, N,
        r.experts, r.top_k, r.norm_topk_prob, r.groups, r.topk_groups, r.scale);
    STRATA_CUDA_LAUNCHED();
    return;
  }
  route_kernel<<<grid(N), kThreads, 0, compute_stream()>>>(
      dev<float>(probs), dev<float>(lse), dev<int32_t>(top), dev<float>(gates),
      dev<const float>(logits), N, r.experts, r.top_k, r.norm_topk_prob);
  STRATA_CUDA_LAUNCHED();
}

void moe_plan(Tensor counts, Tensor pos, Tensor rows, Tensor top, Tensor probs, int experts,
              const MoeCapacity& capacity) {
  static thread_local std::vector<int32_t> h_top, h_pos, h_rows, h_counts;
  static thread_local std::vector<float> h_probs;
  const int64_t nk = top.numel(), k = top.ndim == 2 ? top.dim(1) : 1, N = nk / k;
  int32_t* t = staged(h_top, size_t(nk));
  float* p = capacity.capacity > 0 ? staged(h_probs, size_t(N * experts)) : nullptr;
  copy_to_host(t, top);  // waits for the router's kernels
  if (p != nullptr) copy_to_host(p, probs);
  for (int64_t i = 0; i < nk; ++i) {
    STRATA_CHECK(t[i] >= 0 && t[i] < experts, "moe_plan: expert ", t[i], " of ", experts);
  }
  int32_t* c = staged(h_counts, size_t(experts));
  int32_t* ps = staged(h_pos, size_t(nk));
  int32_t* rs = staged(h_rows, size_t(nk));
  std::fill(rs, rs + nk, 0);
  kernels::moe_plan(c, ps, rs, t, p, N, experts, int(k), capacity.capacity, capacity.group,
                    capacity.by_probs);
  copy_from_host(counts, c);
  copy_from_host(pos, ps);
  copy_from_host(rows, rs);
}

void moe_balance_stats(Tensor stats, Tensor probs, Tensor top, int64_t T, bool normalized) {
  const int64_t E = probs.dim(-1), N = probs.numel() / E, k = top.numel() / N, B = N / T;
  balance_kernel<<<grid(B * E), kThreads, 0, compute_stream()>>>(
      dev<float>(stats), dev<const float>(probs), dev<const int32_t>(top), B, int(E), int(k), T,
      normalized);
  STRATA_CUDA_LAUNCHED();
}

void moe_route_backward(Tensor dlogits, Tensor dgates, Tensor probs, Tensor lse, Tensor top,
                        Tensor gates, Tensor coef, int64_t T, float z, const MoeRoute& r) {
  const int64_t N = probs.numel() / r.experts;
  if (N == 0) return;
  if (r.sigmoid) {
    sigmoid_route_backward_kernel<<<grid(N), kThreads, 0, compute_stream()>>>(
        dev<float>(dlogits), dev<const float>(dgates), dev<const float>(probs),
        dev<const int32_t>(top), coef.data != nullptr ? dev<const float>(coef) : nullptr, N,
        r.experts, r.top_k, r.norm_topk_prob, r.scale, T);
    STRATA_CUDA_LAUNCHED();
    return;
  }
  route_backward_kernel<<<grid(N), kThreads, 0, compute_stream()>>>(
      dev<float>(dlogits), dev<const float>(dgates), dev<const float>(probs), dev<const float>(lse),
      dev<const int32_t>(top), dev<const float>(gates), dev<const float>(coef), N, r.experts,
      r.top_k, r.norm_topk_prob, T, z);
  STRATA_CUDA_LAUNCHED();
}

void gather_rows(Tensor out, Tensor x, Tensor rows) {
  const int64_t C = x.dim(-1), R = rows.numel();
  if (R == 0) return;
  with_type("gather_rows", x.dtype, [&](auto s) {
    using S = decltype(s);
    gather_kernel<<<grid(R * C), kThreads, 0, compute_stream()>>>(dev<S>(out), dev<const S>(x),
                                                                  dev<const int32_t>(rows), R, C);
  });
  STRATA_CUDA_LAUNCHED();
}

void moe_combine(Tensor out, Tensor y, Tensor pos, Tensor w) {
  const int64_t C = out.dim(-1), N = out.numel() / C, k = pos.numel() / N;
  with_type("moe_combine", y.dtype, [&](auto s) {
    using S = decltype(s);
    combine_kernel<<<grid(N * C), kThreads, 0, compute_stream()>>>(
        dev<S>(out), dev<const S>(y), dev<const int32_t>(pos), dev<const float>(w), N, int(k), C);
  });
  STRATA_CUDA_LAUNCHED();
}

void moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor pos, Tensor w) {
  const int64_t C = dout.dim(-1), N = dout.numel() / C, k = pos.numel() / N;
  if (N * k == 0) return;
  with_type("moe_combine_backward", y.dtype, [&](auto s) {
    using S = decltype(s);
    combine_backward_kernel<<<unsigned(N * k), kThreads, 0, compute_stream()>>>(
        dev<S>(dy), dev<float>(dw), dev<const S>(dout), dev<const S>(y), dev<const int32_t>(pos),
        dev<const float>(w), int(k), C);
  });
  STRATA_CUDA_LAUNCHED();
}

void moe_gate_forward(Tensor out, Tensor s, Tensor g) {
  const int64_t C = s.dim(-1), N = s.numel() / C;
  if (N == 0) return;
  with_type("moe_gate_forward", s.dtype, [&](auto v) {
    using S = decltype(v);
    gate_kernel<<<unsigned(N), kThreads, 0, compute_stream()>>>(dev<S>(out), dev<const S>(s),
                                                                dev<float>(g), C);
  });
  STRATA_CUDA_LAUNCHED();
}

void moe_gate_backward(Tensor ds, Tensor dg, Tensor dout, Tensor s, Tensor g) {
  const int64_t C = s.dim(-1), N = s.numel() / C;
  if (N == 0) return;
  with_type("moe_gate_backward", s.dtype, [&](auto v) {
    using S = decltype(v);
    gate_backward_kernel<<<unsigned(N), kThreads, 0, compute_stream()>>>(
        dev<S>(ds), dev<float>(dg), dev<const S>(dout), dev<const S>(s), dev<const float>(g), C);
  });
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::ops::cuda
