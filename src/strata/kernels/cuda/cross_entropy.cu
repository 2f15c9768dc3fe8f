// Softmax cross-entropy on the GPU (backend.h): the CPU backend's formulas
// (kernels/cpu/cross_entropy.cc), with its exp polynomial, so that the two agree to rounding.
//
// Every kernel that reads logits runs one block of kRowThreads per row. A row is walked in 16-byte
// packs from its first 16-byte boundary, with the few columns before it and after the last whole
// pack taken one at a time, so any row stride loads vectorised. Each thread reduces its share in
// registers, then the block reduces the threads' values with common.cuh's fixed trees: which
// thread sees which columns, and in which order, depends only on the row's length and its address
// mod 16, so the same call on the same buffers gives the same bits every run (no atomics).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

// Rows of a 256K vocabulary (bf16) are then 32 packs of 8 per thread.
constexpr int kRowThreads = 1024;
constexpr int kThreads = 256;  // per-row kernels without a row walk (one thread per row)

// The CPU's exp_approx (kernels/cpu/vec.h): Cephes expf on x − n·ln2, relative error below 2e-7;
// 0 below −87.3, the largest float above 88.37, NaN for NaN. nvcc fuses its multiply-adds, so it
// may differ from the CPU's in the last bit, never more.
__device__ __forceinline__ float exp_approx(float x) {
  float xc = x > 88.37f ? 88.37f : x;  // comparisons with NaN are false: NaN stays
  xc = xc < -87.3f ? -87.3f : xc;
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // n = round(x/ln2) in t's low bits
  const float n = t - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = __uint_as_float((__float_as_uint(t) - 0x4b400000u + 127u) << 23);
  return x < -87.3f ? 0.0f : p * scale;
}

// v rounded to the logits' type S, then stored as D (S itself, or fp32: the exact widening).
template <typename S, typename D>
__device__ __forceinline__ D round_to(float v) {
  if constexpr (std::is_same_v<S, D>) {
    return from_f<S>(v);
  } else {
    return from_f<D>(to_f(from_f<S>(v)));
  }
}

// --- row walks ----------------------------------------------------------------------------------

template <typename S>
constexpr int kPack = 16 / int(sizeof(S));  // elements of S in one 16-byte load

template <typename S>
__device__ __forceinline__ void load_pack(float (&v)[kPack<S>], const S* p) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  S s[kPack<S>];
  memcpy(s, &w, sizeof(w));
#pragma unroll
  for (int k = 0; k < kPack<S>; ++k) v[k] = to_f(s[k]);
}

// K values of D at p, 16-byte aligned: one or two 16-byte stores (K·sizeof(D) is 16 or 32).
// __stwb (st.global.wb, the default caching) because nvcc splits a plain uint4 store of values
// built in registers into narrower ones.
template <typename D, int K>
__device__ __forceinline__ void store_pack(D* p, const D (&d)[K]) {
  static_assert(K * sizeof(D) % 16 == 0);
#pragma unroll
  for (int i = 0; i < int(K * sizeof(D) / 16); ++i) {
    uint4 w;
    memcpy(&w, d + i * (16 / sizeof(D)), sizeof(w));
    __stwb(reinterpret_cast<uint4*>(p) + i, w);
  }
}

// Columns [0, len) of a row at x: `head` single columns up to x's first 16-byte boundary, then
// `packs` aligned packs of kPack<S>, then `tail` single columns (head, tail < kPack<S>). Columns
// within a row are int: the dispatch bounds V by INT_MAX (fewer registers than int64_t).
struct RowSplit {
  int head, packs, tail;
};
template <typename S>
__device__ __forceinline__ RowSplit split_row(const S* x, int len) {
  const int off = int(reinterpret_cast<uintptr_t>(x) % 16 / sizeof(S));
  const int head = min(off == 0 ? 0 : kPack<S> - off, len);
  const int packs = (len - head) / kPack<S>;
  return {head, packs, len - head - packs * kPack<S>};
}

// Calls f(j, v) on this thread's share of columns [0, len) of the row at x: v is the float[kPack]
// of the pack starting at column j, or the float[1] of the single column j. Pack i belongs to
// thread i mod blockDim.x, single column i of the head or of the tail to thread i. kReverse walks
// from the row's end, so that a forward walk right after finds the row's start still in L2
// (llm.c's fused classifier).
template <bool kReverse, typename S, typename F>
__device__ __forceinline__ void visit_row(const S* x, int len, F&& f) {
  constexpr int W = kPack<S>;
  const RowSplit sp = split_row(x, len);
  const int t = int(threadIdx.x), T = int(blockDim.x);
  const auto single = [&](int j) {
    const float v[1] = {to_f(x[j])};
    f(j, v);
  };
  const auto pack = [&](int i) {
    const int j = sp.head + i * W;
    float v[W];
    load_pack(v, x + j);
    f(j, v);
  };
  if constexpr (kReverse) {
    if (t < sp.tail) single(len - sp.tail + t);
    for (int i = sp.packs - 1 - t; i >= 0; i -= T) pack(i);
    if (t < sp.head) single(t);
  } else {
    if (t < sp.head) single(t);
    for (int i = t; i < sp.packs; i += T) pack(i);
    if (t < sp.tail) single(len - sp.tail + t);
  }
}

// The online softmax: a running max m and s = Σ exp(x − m) over the columns seen, s rescaled when
// m grows (once per pack, not per column).
struct Online {
  float m = -INFINITY, s = 0.0f;

  template <int K>
  __device__ __forceinline__ void add(const float (&v)[K]) {
    float mk = m;
#pragma unroll
    for (int k = 0; k < K; ++k) mk = fmaxf(mk, v[k]);
    if (mk != m) {  // m = −inf has s = 0, and exp_approx(−inf) = 0: no NaN from −inf − −inf
      s *= exp_approx(m - mk);
      m = mk;
    }
    // While every column seen is −inf (or NaN, which fmaxf skips), m is −inf and x − m would be
    // −inf − −inf = NaN: such columns add exp(x − 0) instead, 0 for −inf (as on the CPU, against
    // its finite row max) and NaN for NaN.
    const float ref = m == -INFINITY ? 0.0f : m;
#pragma unroll
    for (int k = 0; k < K; ++k) s += exp_approx(v[k] - ref);
  }

  // The block's (max, Σ exp(x − max)), in every thread. Threads with no columns (m = −inf) add 0.
  __device__ __forceinline__ Online merged(float* shared) const {
    const float bm = block_max(m, shared);
    const float part = m == bm ? s : s * exp_approx(m - bm);
    return {bm, block_sum(part, shared)};
  }
};

template <typename D>
__device__ __forceinline__ void zero_row(D* o, int cols) {
  for (int j = int(threadIdx.x); j < cols; j += int(blockDim.x)) o[j] = from_f<D>(0.0f);
}

// The soft cap's derivative at a capped logit z: d/du cap·tanh(u/cap) = 1 − (z/cap)², with
// inv_cap = 1/cap; exactly 1 without a cap (inv_cap 0), so that the product is then unchanged.
__device__ __forceinline__ float cap_slope(float z, float inv_cap) {
  const float t = z * inv_cap;
  return inv_cap > 0.0f ? 1.0f - t * t : 1.0f;
}

// o (cols) = the dlogits of x (cols), one row's columns [c0, c0 + cols), from its statistics:
// exp(x − mx)·dloss/sum, (exp(xt − mx)/sum − 1)·dloss at column `target` (relative to c0; outside
// [0, live) where the target is not among them), each times cap_slope(x), 0 from column `live` on;
// each rounded to S and stored as D. Each thread reads a column before it writes it, so o may be
// x itself.
template <typename S, typename D>
__device__ __forceinline__ void row_dlogits(D* o, const S* x, int cols, int live, int target,
                                            float xt, float mx, float sum, float dloss,
                                            float inv_cap) {
  const float scale = dloss / sum;
  const float dt = (exp_approx(xt - mx) / sum - 1.0f) * dloss * cap_slope(xt, inv_cap);
  // The packs follow x's alignment; o's stores vectorise where o has the same phase (always when
  // o is x).
  const bool packed_out = reinterpret_cast<uintptr_t>(o + split_row(x, cols).head) % 16 == 0;
  visit_row<false>(x, cols, [&](int j, const auto& v) {
    constexpr int K = int(std::extent_v<std::remove_reference_t<decltype(v)>>);
    D d[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = j + k;
      // unconditional: selects, not branches
      const float e = exp_approx(v[k] - mx) * scale * cap_slope(v[k], inv_cap);
      d[k] = round_to<S, D>(c >= live ? 0.0f : c == target ? dt : e);
    }
    if constexpr (K > 1) {
      if (packed_out) {
        store_pack(o + j, d);
        return;
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) o[j + k] = d[k];
  });
}

// --- kernels ------------------------------------------------------------------------------------

enum class Writes { kLoss, kStats };

// One block per row of logits (N, V), rows in reverse: the lm-head GEMM that just wrote them
// finished with the last rows, which are then still in L2. losses (N); kStats: stats (3, N) = max,
// Σ exp(x − max), target logit ({0, 1, 0} for ignored rows), which ce_dlogits_kernel takes.
template <typename S, Writes kWrites>
__global__ void __launch_bounds__(kRowThreads, 2)
    ce_rows_kernel(float* losses, float* stats, const S* logits, const int32_t* targets, int N,
                   int V) {
  __shared__ float shared[32];
  const int n = int(gridDim.x - 1 - blockIdx.x);
  const S* x = logits + int64_t(n) * V;  // (V)
  const int target = targets[n];
  if (target < 0) {
    if (threadIdx.x == 0) {
      losses[n] = 0.0f;
      if constexpr (kWrites == Writes::kStats) {
        stats[n] = 0.0f, stats[int64_t(N) + n] = 1.0f, stats[2 * int64_t(N) + n] = 0.0f;
      }
    }
    return;
  }
  // A target past the vocabulary (check_tokens' to refuse, above the kernels) gives a NaN loss,
  // never a read outside the row.
  const float xt = target < V ? to_f(x[target]) : NAN;
  Online own;
  visit_row<true>(x, V, [&](int, const auto& v) { own.add(v); });
  const Online row = own.merged(shared);
  if (threadIdx.x == 0) {
    losses[n] = logf(row.s) + row.m - xt;
    if constexpr (kWrites == Writes::kStats) {
      stats[n] = row.m, stats[int64_t(N) + n] = row.s, stats[2 * int64_t(N) + n] = xt;
    }
  }
}

// out (N, cols), row stride ldo = the dlogits of columns [c0, c0 + cols) of logits (N, V) from
// stats (3, N). Targets are global columns: this rank's valid ones are [v0, v0 + valid).
template <typename S, typename D>
__global__ void __launch_bounds__(kRowThreads, 2)
    ce_dlogits_kernel(D* out, int64_t ldo, const S* logits, const int32_t* targets,
                      const float* stats, int N, int V, int c0, int cols, int64_t v0, int valid,
                      float dloss, float inv_cap) {
  const int n = int(blockIdx.x);
  D* o = out + n * ldo;                       // (cols)
  const S* x = logits + int64_t(n) * V + c0;  // (cols)
  if (targets[n] < 0) {
    zero_row(o, cols);
    return;
  }
  const int64_t local = targets[n] - v0;
  const int target = local >= 0 && local < valid ? int(local) - c0 : -1;
  const int live = min(max(valid - c0, 0), cols);
  row_dlogits(o, x, cols, live, target, stats[2 * int64_t(N) + n], stats[n], stats[int64_t(N) + n],
              dloss, inv_cap);
}

// rowmax (N) = max over the first `valid` columns of logits (N, V); rows in reverse, as
// ce_rows_kernel, so that vocab_ce_sums (rows forward) starts on rows still in L2.
template <typename S>
__global__ void __launch_bounds__(kRowThreads, 2)
    vocab_max_kernel(float* rowmax, const S* logits, int V, int valid) {
  __shared__ float shared[32];
  const int n = int(gridDim.x - 1 - blockIdx.x);
  float m = -INFINITY;
  visit_row<true>(logits + int64_t(n) * V, valid, [&](int, const auto& v) {
    for (float e : v) m = fmaxf(m, e);
  });
  m = block_max(m, shared);
  if (threadIdx.x == 0) rowmax[n] = m;
}

// sums (2, N): Σ exp(x − gmax) over the first `valid` columns of logits (N, V), and the target's
// logit where this rank holds it (global column v0 + local), else 0; both 0 for ignored targets.
template <typename S>
__global__ void __launch_bounds__(kRowThreads, 2)
    vocab_sums_kernel(float* sums, const S* logits, const int32_t* targets, const float* gmax,
                      int N, int V, int64_t v0, int valid) {
  __shared__ float shared[32];
  const int n = int(blockIdx.x);
  const S* x = logits + int64_t(n) * V;  // (V)
  const int target = targets[n];
  if (target < 0) {
    if (threadIdx.x == 0) sums[n] = 0.0f, sums[int64_t(N) + n] = 0.0f;
    return;
  }
  const float g = gmax[n];
  float s = 0.0f;
  visit_row<false>(x, valid, [&](int, const auto& v) {
    for (float e : v) s += exp_approx(e - g);
  });
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    const int64_t local = target - v0;
    sums[n] = s;
    sums[int64_t(N) + n] = local >= 0 && local < valid ? to_f(x[local]) : 0.0f;
  }
}

// losses (N) = log(sums[0]) + gmax − sums[1] (0 for ignored targets).
__global__ void __launch_bounds__(kThreads)
    vocab_finish_kernel(float* losses, const int32_t* targets, const float* gmax, const float* sums,
                        int N) {
  const int n = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (n >= N) return;
  losses[n] = targets[n] < 0 ? 0.0f : logf(sums[n]) + gmax[n] - sums[int64_t(N) + n];
}

// out (N) = max over k of in (K, N), k ascending; `mx < v ? v : mx` is the CPU's std::max.
__global__ void __launch_bounds__(kThreads)
    max_rows_kernel(float* out, const float* in, int K, int64_t N) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float mx = -INFINITY;
  for (int k = 0; k < K; ++k) {
    const float v = in[k * N + n];
    mx = mx < v ? v : mx;
  }
  out[n] = mx;
}

// The serial kernels' launch: N = targets' count, V = the logits' row length.
template <Writes kWrites>
void launch_rows(const char* op, Tensor losses, Tensor stats, Tensor logits, Tensor targets) {
  const int64_t N = targets.numel(), V = logits.numel() / N;
  with_type(op, logits.dtype, [&](auto s) {
    using S = decltype(s);
    ce_rows_kernel<S, kWrites><<<unsigned(N), kRowThreads, 0, compute_stream()>>>(
        dev<float>(losses), dev<float>(stats), dev<const S>(logits), dev<const int32_t>(targets),
        int(N), int(V));
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace

// The dispatch (ops_loss_optim.cc) has checked the shapes: N = targets.numel() > 0 (rowmax's or
// out's for vocab_ce_max and max_rows), V = the logits' numel / N, all within int.

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  launch_rows<Writes::kLoss>("cross_entropy_forward", losses, Tensor(), logits, targets);
}

void cross_entropy_stats(Tensor losses, Tensor stats, Tensor logits, Tensor targets) {
  launch_rows<Writes::kStats>("cross_entropy_stats", losses, stats, logits, targets);
}

void ce_dlogits(Tensor out, int64_t ldo, Tensor logits, Tensor targets, Tensor stats, int64_t c0,
                int64_t cols, int64_t v0, int64_t valid, float dloss, float softcap) {
  const int64_t N = targets.numel(), V = logits.numel() / N;
  const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
  with_type("ce_dlogits", logits.dtype, [&](auto s) {
    using S = decltype(s);
    const auto launch = [&](auto* o) {
      using D = std::remove_pointer_t<decltype(o)>;
      ce_dlogits_kernel<S, D><<<unsigned(N), kRowThreads, 0, compute_stream()>>>(
          o, ldo, dev<const S>(logits), dev<const int32_t>(targets), dev<const float>(stats),
          int(N), int(V), int(c0), int(cols), v0, int(valid), dloss, inv_cap);
      STRATA_CUDA_LAUNCHED();
    };
    if (out.dtype == DType::F32) {
      launch(dev<float>(out));
    } else {
      launch(dev<S>(out));
    }
  });
}

void vocab_ce_max(Tensor rowmax, Tensor logits, int64_t valid) {
  const int64_t N = rowmax.numel(), V = logits.numel() / N;
  with_type("vocab_ce_max", logits.dtype, [&](auto s) {
    using S = decltype(s);
    vocab_max_kernel<S><<<unsigned(N), kRowThreads, 0, compute_stream()>>>(
        dev<float>(rowmax), dev<const S>(logits), int(V), int(valid));
    STRATA_CUDA_LAUNCHED();
  });
}

void vocab_ce_sums(Tensor sums, Tensor logits, Tensor targets, Tensor gmax, int64_t v0,
                   int64_t valid) {
  const int64_t N = targets.numel(), V = logits.numel() / N;
  with_type("vocab_ce_sums", logits.dtype, [&](auto s) {
    using S = decltype(s);
    vocab_sums_kernel<S><<<unsigned(N), kRowThreads, 0, compute_stream()>>>(
        dev<float>(sums), dev<const S>(logits), dev<const int32_t>(targets), dev<const float>(gmax),
        int(N), int(V), v0, int(valid));
    STRATA_CUDA_LAUNCHED();
  });
}

void vocab_ce_finish(Tensor losses, Tensor targets, Tensor gmax, Tensor sums) {
  const int64_t N = targets.numel();
  vocab_finish_kernel<<<blocks_for(N, kThreads), kThreads, 0, compute_stream()>>>(
      dev<float>(losses), dev<const int32_t>(targets), dev<const float>(gmax),
      dev<const float>(sums), int(N));
  STRATA_CUDA_LAUNCHED();
}

void max_rows(Tensor out, Tensor in) {
  const int64_t N = out.numel();
  max_rows_kernel<<<blocks_for(N, kThreads), kThreads, 0, compute_stream()>>>(
      dev<float>(out), dev<const float>(in), int(in.numel() / N), N);
  STRATA_CUDA_LAUNCHED();
}

}  // namespace strata::ops::cuda
