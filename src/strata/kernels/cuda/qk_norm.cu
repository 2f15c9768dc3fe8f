// q/k normalisation on the grouped QKV layout (ops.h), with the formulas of the CPU backend
// (kernels/cpu/qk_norm.h): y = (w_offset + w)·x·rstd, rstd = 1/sqrt(Σx²/W + eps), fp32
// arithmetic, each output rounded once to its dtype; the value heads pass through.
//
// The forward and the input gradient take a warp per head, a block per row: per head the warp
// reduces its own head's sums; whole, the rstd and dot sums come from the caller (reduced over
// the tensor-parallel ranks), and a block per row computes this rank's part of them. The gains'
// gradients sum over rows (and, per head, over the heads that share them) in a fixed partition,
// as in norm.cu: row blocks write fp32 partials, then one thread per gain value adds them in
// order into dwq/dwk. No atomics: the same inputs give the same bits.
#include <algorithm>
#include <cstdint>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 256;  // a row's block: 8 warps
constexpr int kWarps = kThreads / 32;

// The grouped layout and the options. A row holds groups · (rep + 2) heads of hd; heads of a kind
// are numbered in row order: query heads h = g·rep + r, key heads h = g.
struct Layout {
  int groups, rep, hd;
  bool per_head;
  float eps, off;  // off: the gain's offset, −0 for none (addition's identity, as norm.cu)
  float q_width, k_width;  // the values a query (key) norm spans
};

enum Kind { kQuery = 0, kKey = 1, kValue = 2 };

__device__ __forceinline__ int64_t row_width(const Layout& L) {
  return int64_t(L.groups) * (L.rep + 2) * L.hd;
}
// Head j of a row (in row order): its kind and its number among the heads of that kind.
__device__ __forceinline__ Kind kind_of(const Layout& L, int j, int* h) {
  const int g = j / (L.rep + 2), r = j % (L.rep + 2);
  if (r < L.rep) {
    *h = g * L.rep + r;
    return kQuery;
  }
  *h = g;
  return r == L.rep ? kKey : kValue;
}
// The column of head h of kind k.
__device__ __forceinline__ int64_t head_col(const Layout& L, int k, int h) {
  const int g = k == kQuery ? h / L.rep : h, r = k == kQuery ? h % L.rep : L.rep;
  return (int64_t(g) * (L.rep + 2) + r) * L.hd;
}
// Where row n's rstd of head h of kind k is: (N, groups·(rep+1)) per head, (N, 2) whole.
__device__ __forceinline__ int64_t stat(const Layout& L, int64_t n, int k, int h) {
  if (!L.per_head) return 2 * n + k;
  return n * (int64_t(L.groups) * (L.rep + 1)) + (k == kQuery ? h : L.groups * L.rep + h);
}
__device__ __forceinline__ int64_t gain_col(const Layout& L, int h) {
  return L.per_head ? 0 : int64_t(h) * L.hd;
}

// --- whole mode's row sums: a block per row ----------------------------------------------------

// sumsq (N, 2): Σ q², Σ k² over row blockIdx.x's heads.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    sumsq_kernel(float* sumsq, const S* qkv, const Layout L) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x, row = row_width(L);
  const S* x = qkv + n * row;
  float sq = 0.0f, sk = 0.0f;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    const int r = int(c / L.hd) % (L.rep + 2);
    const float v = to_f(x[c]);
    if (r < L.rep) {
      sq += v * v;
    } else if (r == L.rep) {
      sk += v * v;
    }
  }
  const float q = block_sum(sq, shared), k = block_sum(sk, shared);
  if (threadIdx.x == 0) {
    sumsq[2 * n] = q;
    sumsq[2 * n + 1] = k;
  }
}

// dot (N, 2): Σ dout·gain·x·rstd over row blockIdx.x's query (key) values.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    dot_kernel(float* dot, const S* dout, const S* qkv, const S* wq, const S* wk, const float* rstd,
               const Layout L) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x, row = row_width(L);
  const S* x = qkv + n * row;
  const S* dy = dout + n * row;
  const float rq = rstd[2 * n], rk = rstd[2 * n + 1];
  float sq = 0.0f, sk = 0.0f;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) {
    const int j = int(c / L.hd), d = int(c % L.hd);
    int h;
    const Kind k = kind_of(L, j, &h);
    if (k == kQuery) {
      sq += (L.off + to_f(wq[gain_col(L, h) + d])) * to_f(dy[c]) * to_f(x[c]) * rq;
    } else if (k == kKey) {
      sk += (L.off + to_f(wk[gain_col(L, h) + d])) * to_f(dy[c]) * to_f(x[c]) * rk;
    }
  }
  const float q = block_sum(sq, shared), k = block_sum(sk, shared);
  if (threadIdx.x == 0) {
    dot[2 * n] = q;
    dot[2 * n + 1] = k;
  }
}

// --- forward and input gradient: a warp per head ------------------------------------------------

// out, qkv (N, row); rstd written; sumsq (N, 2) whole. Row blockIdx.x.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(S* out, float* rstd, const S* qkv, const S* wq, const S* wk, const float* sumsq,
                   const Layout L) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = blockIdx.x, row = row_width(L);
  const S* x = qkv + n * row;
  S* y = out + n * row;
  for (int j = warp; j < L.groups * (L.rep + 2); j += kWarps) {
    int h;
    const Kind k = kind_of(L, j, &h);
    const int64_t c = int64_t(j) * L.hd;
    if (k == kValue) {
      for (int d = lane; d < L.hd; d += 32) y[c + d] = x[c + d];
      continue;
    }
    float r;
    if (L.per_head) {
      float ss = 0.0f;
      for (int d = lane; d < L.hd; d += 32) {
        const float v = to_f(x[c + d]);
        ss += v * v;
      }
      r = 1.0f / sqrtf(warp_sum(ss) / float(L.hd) + L.eps);
    } else {
      r = 1.0f / sqrtf(sumsq[2 * n + k] / (k == kQuery ? L.q_width : L.k_width) + L.eps);
    }
    if (lane == 0 && (L.per_head || h == 0)) rstd[stat(L, n, k, h)] = r;
    const S* w = (k == kQuery ? wq : wk) + gain_col(L, h);
    for (int d = lane; d < L.hd; d += 32)
      y[c + d] = from_f<S>(to_f(x[c + d]) * r * (L.off + to_f(w[d])));
  }
}

// dqkv (N, row) = the input gradient, dout for the value heads; dot (N, 2) whole. Row blockIdx.x.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    dx_kernel(S* dqkv, const S* dout, const S* qkv, const S* wq, const S* wk, const float* rstd,
              const float* dot, const Layout L) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n = blockIdx.x, row = row_width(L);
  const S* x = qkv + n * row;
  const S* dy = dout + n * row;
  S* dx = dqkv + n * row;
  for (int j = warp; j < L.groups * (L.rep + 2); j += kWarps) {
    int h;
    const Kind k = kind_of(L, j, &h);
    const int64_t c = int64_t(j) * L.hd;
    if (k == kValue) {
      for (int d = lane; d < L.hd; d += 32) dx[c + d] = dy[c + d];
      continue;
    }
    const S* w = (k == kQuery ? wq : wk) + gain_col(L, h);
    const float r = rstd[stat(L, n, k, h)];
    float s;
    if (L.per_head) {
      s = 0.0f;
      for (int d = lane; d < L.hd; d += 32) {
        s += (L.off + to_f(w[d])) * to_f(dy[c + d]) * to_f(x[c + d]) * r;
      }
      s = warp_sum(s);
    } else {
      s = dot[2 * n + k];
    }
    const float mean = s / (L.per_head ? float(L.hd) : k == kQuery ? L.q_width : L.k_width);
    for (int d = lane; d < L.hd; d += 32) {
      const float xhat = to_f(x[c + d]) * r;
      dx[c + d] = from_f<S>(((L.off + to_f(w[d])) * to_f(dy[c + d]) - xhat * mean) * r);
    }
  }
}

// --- the gains' gradients: row blocks, then their combination -----------------------------------
constexpr int kGainThreads = 128;
constexpr int kRowsPerBlock = 32;
constexpr int kMaxRowBlocks = 256;

// Gain value j of the Jq query then Jk key gain values (Jq = Jk = hd per head; this rank's
// groups·rep·hd and groups·hd whole): part[blockIdx.y][j] = Σ over the rows of row block
// blockIdx.y (of gridDim.y over N) and the heads that share gain j, of dy·x·rstd.
template <typename S>
__global__ void __launch_bounds__(kGainThreads)
    gain_partials_kernel(float* part, const S* dout, const S* qkv, const float* rstd, int N, int Jq,
                         int Jk, const Layout L) {
  const int j = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= Jq + Jk) return;
  const int k = j < Jq ? kQuery : kKey, jj = j < Jq ? j : j - Jq;
  const int nheads = k == kQuery ? L.groups * L.rep : L.groups;
  const int d = jj % L.hd;
  const int h0 = L.per_head ? 0 : jj / L.hd, h1 = L.per_head ? nheads : h0 + 1;
  const int n0 = int(int64_t(N) * blockIdx.y / gridDim.y);
  const int n1 = int(int64_t(N) * (blockIdx.y + 1) / gridDim.y);
  const int64_t row = row_width(L);
  float s = 0.0f;
  for (int n = n0; n < n1; ++n) {
    for (int h = h0; h < h1; ++h) {
      const int64_t c = int64_t(n) * row + head_col(L, k, h) + d;
      s += to_f(dout[c]) * (to_f(qkv[c]) * rstd[stat(L, n, k, h)]);
    }
  }
  part[int64_t(blockIdx.y) * (Jq + Jk) + j] = s;
}

// dwq (Jq), dwk (Jk) += Σ_blk part[blk], blocks in order; part (P, Jq + Jk).
template <typename G>
__global__ void gain_combine_kernel(G* dwq, G* dwk, const float* part, int P, int Jq, int Jk) {
  const int j = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= Jq + Jk) return;
  float s = 0.0f;
  for (int blk = 0; blk < P; ++blk) s += part[int64_t(blk) * (Jq + Jk) + j];
  G* g = j < Jq ? dwq + j : dwk + (j - Jq);
  *g = from_f<G>(to_f(*g) + s);
}

Layout layout(const AttentionShape& s, const QkNorm& n) {
  Layout L;
  L.groups = s.groups;
  L.rep = s.rep;
  L.hd = s.hd;
  L.per_head = n.per_head;
  L.eps = n.eps;
  L.off = n.w_offset == 0.0f ? -0.0f : n.w_offset;
  L.q_width = float(n.q_width);
  L.k_width = float(n.k_width);
  return L;
}

// The rows of a call: B·T, one block each.
unsigned row_count(const AttentionShape& s) {
  return unsigned(int64_t(s.B) * s.T);
}

}  // namespace

void qk_norm_sumsq(Tensor sumsq, Tensor qkv, const AttentionShape& s) {
  const Layout L = layout(s, QkNorm{});
  with_type("qk_norm_sumsq", qkv.dtype, [&](auto z) {
    using S = decltype(z);
    sumsq_kernel<S>
        <<<row_count(s), kThreads, 0, compute_stream()>>>(dev<float>(sumsq), dev<const S>(qkv), L);
    STRATA_CUDA_LAUNCHED();
  });
}

void qk_norm_forward(Tensor out, Tensor rstd, Tensor qkv, Tensor wq, Tensor wk, Tensor sumsq,
                     const AttentionShape& s, const QkNorm& n) {
  const Layout L = layout(s, n);
  with_type("qk_norm_forward", qkv.dtype, [&](auto z) {
    using S = decltype(z);
    forward_kernel<S><<<row_count(s), kThreads, 0, compute_stream()>>>(
        dev<S>(out), dev<float>(rstd), dev<const S>(qkv), dev<const S>(wq), dev<const S>(wk),
        n.per_head ? nullptr : dev<const float>(sumsq), L);
    STRATA_CUDA_LAUNCHED();
  });
}

void qk_norm_backward_dot(Tensor dot, Tensor dout, Tensor qkv, Tensor wq, Tensor wk, Tensor rstd,
                          const AttentionShape& s, const QkNorm& n) {
  const Layout L = layout(s, n);
  with_type("qk_norm_backward_dot", qkv.dtype, [&](auto z) {
    using S = decltype(z);
    dot_kernel<S><<<row_count(s), kThreads, 0, compute_stream()>>>(
        dev<float>(dot), dev<const S>(dout), dev<const S>(qkv), dev<const S>(wq), dev<const S>(wk),
        dev<const float>(rstd), L);
    STRATA_CUDA_LAUNCHED();
  });
}

void qk_norm_backward(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor dout, Tensor qkv, Tensor wq,
                      Tensor wk, Tensor rstd, Tensor dot, const AttentionShape& s,
                      const QkNorm& n) {
  const Layout L = layout(s, n);
  const int N = int(row_count(s));
  const int Jq = int(dwq.numel()), Jk = int(dwk.numel());
  const int P = std::clamp((N + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxRowBlocks);
  const cudaStream_t stream = compute_stream();
  with_types("qk_norm_backward", qkv.dtype, dwq.dtype, [&](auto z, auto g) {
    using S = decltype(z);
    using G = decltype(g);
    dx_kernel<S><<<unsigned(N), kThreads, 0, stream>>>(
        dev<S>(dqkv), dev<const S>(dout), dev<const S>(qkv), dev<const S>(wq), dev<const S>(wk),
        dev<const float>(rstd), n.per_head ? nullptr : dev<const float>(dot), L);
    STRATA_CUDA_LAUNCHED();
    float* part = static_cast<float*>(scratch(size_t(P) * size_t(Jq + Jk) * sizeof(float)));
    gain_partials_kernel<S>
        <<<dim3(blocks_for(Jq + Jk, kGainThreads), unsigned(P)), kGainThreads, 0, stream>>>(
            part, dev<const S>(dout), dev<const S>(qkv), dev<const float>(rstd), N, Jq, Jk, L);
    STRATA_CUDA_LAUNCHED();
    gain_combine_kernel<G><<<blocks_for(Jq + Jk, kGainThreads), kGainThreads, 0, stream>>>(
        dev<G>(dwq), dev<G>(dwk), part, P, Jq, Jk);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace strata::ops::cuda
