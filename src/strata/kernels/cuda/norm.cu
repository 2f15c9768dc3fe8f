// LayerNorm and RMSNorm over the last dimension (ops.h), with the formulas of the CPU backend
// (kernels/cpu/norm.cc): fp32 arithmetic, each output rounded once to its dtype, two passes for
// the variance, dx and the parameter gradients accumulated (+=).
//
// Rows are independent for the forward and for dx: one block per row, its sums reduced by
// block_sum. The parameter gradients (C) sum over the N rows in a fixed partition, as on the CPU:
// row blocks write fp32 partials (P, parts, C), then one thread per column adds the P partials in
// order into dw/db. The fused backward runs the split forms' kernels one after the other, so it
// gives their bits by construction.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

// --- packs of a row ------------------------------------------------------------------------------
// A thread takes a row kVec elements at a time (one 16-byte load). Rows whose width or address
// does not allow the load take the same packs element by element (kVector false), so which thread
// sums which element, and in what order, does not depend on alignment.
template <typename S>
constexpr int kVec = int(16 / sizeof(S));

template <typename S>
struct alignas(16) Pack {
  S v[kVec<S>];
};

// Elements [c, c + kVec) of a row of C as fp32; those past C read as 0.
template <bool kVector, typename S>
__device__ __forceinline__ void load_pack(float (&f)[kVec<S>], const S* p, int c, int C) {
  if constexpr (kVector) {
    const Pack<S> v = *reinterpret_cast<const Pack<S>*>(p + c);
#pragma unroll
    for (int k = 0; k < kVec<S>; ++k) f[k] = to_f(v.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kVec<S>; ++k) f[k] = c + k < C ? to_f(p[c + k]) : 0.0f;
  }
}

template <bool kVector, typename S>
__device__ __forceinline__ void store_pack(S* p, const float (&f)[kVec<S>], int c, int C) {
  if constexpr (kVector) {
    Pack<S> v;
#pragma unroll
    for (int k = 0; k < kVec<S>; ++k) v.v[k] = from_f<S>(f[k]);
    *reinterpret_cast<Pack<S>*>(p + c) = v;
  } else {
#pragma unroll
    for (int k = 0; k < kVec<S>; ++k) {
      if (c + k < C) p[c + k] = from_f<S>(f[k]);
    }
  }
}

// Whether element k of the pack at c lies in the row.
template <bool kVector>
__device__ __forceinline__ bool in_row(int c, int k, int C) {
  return kVector || c + k < C;
}

// --- forward and input gradient: one block per row -----------------------------------------------
// blockDim.x (a multiple of 32) threads step through the row's packs: thread t takes packs t,
// t + blockDim.x, ...

// out, x (N, C); w, b (C), b optional; mean, rstd (N) optional. Row blockIdx.x.
template <typename S, bool kVector>
__global__ void layernorm_forward_kernel(S* out, float* mean, float* rstd, const S* x, const S* w,
                                         const S* b, int C, float eps) {
  constexpr int V = kVec<S>;
  __shared__ float shared[32];
  const int64_t row = int64_t(blockIdx.x) * C;
  float sum = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float xv[V];
    load_pack<kVector>(xv, x + row, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (in_row<kVector>(c, k, C)) sum += xv[k];
    }
  }
  const float m = block_sum(sum, shared) / float(C);
  float var = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float xv[V];
    load_pack<kVector>(xv, x + row, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = xv[k] - m;
      if (in_row<kVector>(c, k, C)) var += d * d;
    }
  }
  const float r = 1.0f / sqrtf(block_sum(var, shared) / float(C) + eps);
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float xv[V], wv[V], y[V];
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) y[k] = (xv[k] - m) * r * wv[k];
    if (b != nullptr) {
      float bv[V];
      load_pack<kVector>(bv, b, c, C);
#pragma unroll
      for (int k = 0; k < V; ++k) y[k] += bv[k];
    }
    store_pack<kVector>(out + row, y, c, C);
  }
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[blockIdx.x] = m;
    if (rstd != nullptr) rstd[blockIdx.x] = r;
  }
}

// out, x (N, C); w (C), the gain off + w (off: gain_offset's); rstd (N) optional. Row
// blockIdx.x.
template <typename S, bool kVector>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* x, const S* w, int C,
                                       float eps, float off) {
  constexpr int V = kVec<S>;
  __shared__ float shared[32];
  const int64_t row = int64_t(blockIdx.x) * C;
  float ss = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float xv[V];
    load_pack<kVector>(xv, x + row, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (in_row<kVector>(c, k, C)) ss += xv[k] * xv[k];
    }
  }
  const float r = 1.0f / sqrtf(block_sum(ss, shared) / float(C) + eps);
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float xv[V], wv[V], y[V];
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) y[k] = xv[k] * r * (off + wv[k]);
    store_pack<kVector>(out + row, y, c, C);
  }
  if (threadIdx.x == 0 && rstd != nullptr) rstd[blockIdx.x] = r;
}

// dx (N, C) += the input gradient; dy, x (N, C); w (C); mean, rstd (N). Row blockIdx.x.
template <typename S, bool kVector>
__global__ void layernorm_dx_kernel(S* dx, const S* dy, const S* x, const S* w, const float* mean,
                                    const float* rstd, int C) {
  constexpr int V = kVec<S>;
  __shared__ float shared[32];
  const int64_t row = int64_t(blockIdx.x) * C;
  const float m = mean[blockIdx.x], r = rstd[blockIdx.x];
  float dn_sum = 0.0f, dn_xhat_sum = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float g[V], xv[V], wv[V];
    load_pack<kVector>(g, dy + row, c, C);
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float dn = wv[k] * g[k];
      if (in_row<kVector>(c, k, C)) {
        dn_sum += dn;
        dn_xhat_sum += dn * (xv[k] - m) * r;
      }
    }
  }
  const float dn_mean = block_sum(dn_sum, shared) / float(C);
  const float dn_xhat_mean = block_sum(dn_xhat_sum, shared) / float(C);
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float g[V], xv[V], wv[V], d[V];
    load_pack<kVector>(g, dy + row, c, C);
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
    load_pack<kVector>(d, dx + row, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xhat = (xv[k] - m) * r;
      d[k] += (wv[k] * g[k] - dn_mean - xhat * dn_xhat_mean) * r;
    }
    store_pack<kVector>(dx + row, d, c, C);
  }
}

// dx (N, C) += the input gradient; dy, x (N, C); w (C), the gain off + w; rstd (N). Row
// blockIdx.x.
template <typename S, bool kVector>
__global__ void rmsnorm_dx_kernel(S* dx, const S* dy, const S* x, const S* w, const float* rstd,
                                  int C, float off) {
  constexpr int V = kVec<S>;
  __shared__ float shared[32];
  const int64_t row = int64_t(blockIdx.x) * C;
  const float r = rstd[blockIdx.x];
  float dn_xhat_sum = 0.0f;
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float g[V], xv[V], wv[V];
    load_pack<kVector>(g, dy + row, c, C);
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if (in_row<kVector>(c, k, C)) dn_xhat_sum += (off + wv[k]) * g[k] * xv[k] * r;
    }
  }
  const float dn_xhat_mean = block_sum(dn_xhat_sum, shared) / float(C);
  for (int c = threadIdx.x * V; c < C; c += blockDim.x * V) {
    float g[V], xv[V], wv[V], d[V];
    load_pack<kVector>(g, dy + row, c, C);
    load_pack<kVector>(xv, x + row, c, C);
    load_pack<kVector>(wv, w, c, C);
    load_pack<kVector>(d, dx + row, c, C);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xhat = xv[k] * r;
      d[k] += ((off + wv[k]) * g[k] - xhat * dn_xhat_mean) * r;
    }
    store_pack<kVector>(dx + row, d, c, C);
  }
}

// --- parameter gradients: row blocks, then their combination -------------------------------------
constexpr int kRowWarps = 8;  // warps of a row block's kernel block, on rows n0 + warp + 8j

// First row of block blk of P over N rows (sizes differ by at most one, as on the CPU).
__device__ __forceinline__ int block_begin(int blk, int P, int N) {
  return int(int64_t(N) * blk / P);
}

// Block (32·kRowWarps threads) (bx, by): columns [c0, c0 + 32·kVec), c0 = 32·kVec·bx, a lane per
// pack, over the rows of row block by (of gridDim.y), each warp on every kRowWarps-th row; the
// warps' sums then add in warp order. part (P, parts, C): per row block Σ dy·xhat, then for
// LayerNorm (kLayer; xhat = (x − mean)·rstd, else x·rstd) Σ dy. dy, x (N, C); mean, rstd (N).
template <typename S, bool kLayer, bool kVector>
__global__ void __launch_bounds__(32 * kRowWarps)
    norm_partials_kernel(float* part, const S* dy, const S* x, const float* mean, const float* rstd,
                         int N, int C) {
  constexpr int V = kVec<S>, kCols = 32 * V, kParts = kLayer ? 2 : 1;
  __shared__ float sums[kParts][kRowWarps][kCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = int(blockIdx.x) * kCols, c = c0 + lane * V;
  const int n0 = block_begin(int(blockIdx.y), int(gridDim.y), N);
  const int n1 = block_begin(int(blockIdx.y) + 1, int(gridDim.y), N);
  float dw[V] = {}, db[V] = {};
  if (c < C) {
    for (int n = n0 + warp; n < n1; n += kRowWarps) {
      const int64_t row = int64_t(n) * C;
      float g[V], xv[V];
      load_pack<kVector>(g, dy + row, c, C);
      load_pack<kVector>(xv, x + row, c, C);
      const float r = rstd[n];
      if constexpr (kLayer) {
        const float m = mean[n];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          dw[k] += g[k] * ((xv[k] - m) * r);
          db[k] += g[k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) dw[k] += g[k] * (xv[k] * r);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    sums[0][warp][lane * V + k] = dw[k];
    if constexpr (kLayer) sums[1][warp][lane * V + k] = db[k];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kParts * kCols; j += blockDim.x) {
    const int p = j / kCols, col = j % kCols;
    if (c0 + col >= C) continue;
    float s = sums[p][0][col];
#pragma unroll
    for (int w = 1; w < kRowWarps; ++w) s += sums[p][w][col];
    part[(int64_t(blockIdx.y) * kParts + p) * C + c0 + col] = s;
  }
}

// dw (C) += Σ_blk part[blk][0], db (C, gridDim.y == 2) += Σ_blk part[blk][1], blocks in order;
// part (P, parts, C).
template <typename G>
__global__ void norm_combine_kernel(G* dw, G* db, const float* part, int P, int parts, int C) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  G* g = blockIdx.y == 0 ? dw : db;
  const float* src = part + int64_t(blockIdx.y) * C + c;
  const int64_t stride = int64_t(parts) * C;
  float s = 0.0f;
  for (int blk = 0; blk < P; ++blk) s += src[blk * stride];
  g[c] = from_f<G>(to_f(g[c]) + s);
}

// --- launches ------------------------------------------------------------------------------------
constexpr int kMaxRowThreads = 256;  // a row's block: C = 4096 in bf16 is 512 packs, two each
// The row blocks of the parameter gradients aim at this many kernel blocks (one full wave on a
// 132-SM Hopper: 8 blocks of 256 threads per SM), at most kMaxRowBlocks (the length of each
// column's serial combination) and at most one per kRowWarps rows. A function of (N, C, dtype)
// alone, never of the GPU or of alignment: the partition fixes the bits.
constexpr int kTargetBlocks = 1024;
constexpr int kMaxRowBlocks = 128;
constexpr int kCombineThreads = 256;

int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Threads of a row's block: one per pack up to kMaxRowThreads, a whole number of warps.
int row_threads(int C, int vec) {
  return std::min(kMaxRowThreads, ceil_div(ceil_div(C, vec), 32) * 32);
}

int row_blocks(int N, int col_blocks) {
  return std::max(
      1, std::min({ceil_div(kTargetBlocks, col_blocks), ceil_div(N, kRowWarps), kMaxRowBlocks}));
}

// The offset added to an RMSNorm gain weight: w_offset, or −0 for none, addition's identity
// (−0 + w is w, a −0 w included), so that w_offset 0 gives the plain gain's bits (as the CPU's
// gain_offset).
float gain_offset(float w_offset) {
  return w_offset == 0.0f ? -0.0f : w_offset;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether rows of C elements of S at these addresses take 16-byte loads (kVector).
template <typename S>
bool vector_rows(int C, std::initializer_list<const void*> ptrs) {
  if (C % kVec<S> != 0) return false;
  for (const void* p : ptrs) {
    if (!aligned16(p)) return false;
  }
  return true;
}

// f(std::true_type{}) or f(std::false_type{}): the vector path as a template argument.
template <typename F>
void with_vector(bool vector, F&& f) {
  if (vector) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// (N, C) of a norm: C parameters per row of x.
struct NormSize {
  int N, C;
};
NormSize norm_size(const Tensor& x, const Tensor& w) {
  const int64_t C = w.numel();
  return {int(x.numel() / C), int(C)};
}

// dw, db (C) += the parameter gradients (db: LayerNorm, optional); scratch the caller's
// (norm_backward_scratch_floats), used where it holds the partials (P, parts, C), else the
// runtime's.
template <bool kLayer>
void norm_weight(const char* op, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                 Tensor mean, Tensor rstd) {
  const NormSize n = norm_size(x, dw);
  if (n.N == 0) return;
  const cudaStream_t stream = compute_stream();
  with_types(op, x.dtype, dw.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    constexpr int kParts = kLayer ? 2 : 1;
    const int col_blocks = ceil_div(n.C, 32 * kVec<S>);
    const int P = row_blocks(n.N, col_blocks);
    const size_t floats = size_t(P) * kParts * size_t(n.C);
    float* part = scratch.data != nullptr && size_t(scratch.numel()) >= floats
                      ? dev<float>(scratch)
                      : static_cast<float*>(cuda::scratch(floats * sizeof(float)));
    with_vector(vector_rows<S>(n.C, {dy.data, x.data}), [&](auto v) {
      norm_partials_kernel<S, kLayer, decltype(v)::value>
          <<<dim3(unsigned(col_blocks), unsigned(P)), 32 * kRowWarps, 0, stream>>>(
              part, dev<const S>(dy), dev<const S>(x), dev<const float>(mean),
              dev<const float>(rstd), n.N, n.C);
      STRATA_CUDA_LAUNCHED();
    });
    const dim3 grid(blocks_for(n.C, kCombineThreads), kLayer && db.data != nullptr ? 2 : 1);
    norm_combine_kernel<G>
        <<<grid, kCombineThreads, 0, stream>>>(dev<G>(dw), dev<G>(db), part, P, kParts, n.C);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                       float eps) {
  const NormSize n = norm_size(x, w);
  if (n.N == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("layernorm_forward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_vector(vector_rows<S>(n.C, {out.data, x.data, w.data, b.data}), [&](auto v) {
      layernorm_forward_kernel<S, decltype(v)::value>
          <<<unsigned(n.N), row_threads(n.C, kVec<S>), 0, stream>>>(
              dev<S>(out), dev<float>(mean), dev<float>(rstd), dev<const S>(x), dev<const S>(w),
              dev<const S>(b), n.C, eps);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset) {
  const NormSize n = norm_size(x, w);
  if (n.N == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("rmsnorm_forward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_vector(vector_rows<S>(n.C, {out.data, x.data, w.data}), [&](auto v) {
      rmsnorm_forward_kernel<S, decltype(v)::value>
          <<<unsigned(n.N), row_threads(n.C, kVec<S>), 0, stream>>>(
              dev<S>(out), dev<float>(rstd), dev<const S>(x), dev<const S>(w), n.C, eps,
              gain_offset(w_offset));
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void layernorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor mean, Tensor rstd) {
  const NormSize n = norm_size(x, w);
  if (n.N == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("layernorm_backward_input", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_vector(vector_rows<S>(n.C, {dx.data, dy.data, x.data, w.data}), [&](auto v) {
      layernorm_dx_kernel<S, decltype(v)::value>
          <<<unsigned(n.N), row_threads(n.C, kVec<S>), 0, stream>>>(
              dev<S>(dx), dev<const S>(dy), dev<const S>(x), dev<const S>(w),
              dev<const float>(mean), dev<const float>(rstd), n.C);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void rmsnorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor rstd, float w_offset) {
  const NormSize n = norm_size(x, w);
  if (n.N == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("rmsnorm_backward_input", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_vector(vector_rows<S>(n.C, {dx.data, dy.data, x.data, w.data}), [&](auto v) {
      rmsnorm_dx_kernel<S, decltype(v)::value>
          <<<unsigned(n.N), row_threads(n.C, kVec<S>), 0, stream>>>(
              dev<S>(dx), dev<const S>(dy), dev<const S>(x), dev<const S>(w),
              dev<const float>(rstd), n.C, gain_offset(w_offset));
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void layernorm_backward_weight(Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                               Tensor mean, Tensor rstd) {
  norm_weight<true>("layernorm_backward_weight", dw, db, scratch, dy, x, mean, rstd);
}

void rmsnorm_backward_weight(Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor rstd) {
  norm_weight<false>("rmsnorm_backward_weight", dw, Tensor{}, scratch, dy, x, Tensor{}, rstd);
}

void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                        Tensor w, Tensor mean, Tensor rstd) {
  layernorm_backward_input(dx, dy, x, w, mean, rstd);
  layernorm_backward_weight(dw, db, scratch, dy, x, mean, rstd);
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor w,
                      Tensor rstd, float w_offset) {
  rmsnorm_backward_input(dx, dy, x, w, rstd, w_offset);
  rmsnorm_backward_weight(dw, scratch, dy, x, rstd);
}

}  // namespace strata::ops::cuda
