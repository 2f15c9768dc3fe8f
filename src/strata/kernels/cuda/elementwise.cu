// The elementwise calls of the CUDA backend (backend.h): dtype conversion, the residual and bias
// additions, scaling, the logits' soft cap, the fp64 sums (the gradient norm's Σ x², the loss's
// Σ x) and the token checks. The same formulas as the CPU backend (core/dtype.cc convert,
// kernels/cpu/elementwise.cc, optimizer.cc, embedding.cc), in fp32 with one rounding on store.
//
// Elementwise kernels are grid-stride loops over packs of 16 bytes (one vector load or store where
// the address allows; views may be slices at any element offset, so each pack checks). The sums
// are deterministic: a fixed grid of kReduceBlocks blocks whose threads own fixed packs, fp64
// partials per block through block_sum's fixed tree, then one block sums the partials in the
// same tree; the same input gives the same bits on every run, whatever its address.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

using namespace packs;  // NOLINT(build/namespaces): the backend's own helpers

constexpr int kThreads = 256;
// The most blocks a grid-stride launch takes: several waves of kThreads on any sm_80/sm_90 GPU.
constexpr unsigned kMaxBlocks = 4096;
// The fixed grid of the sums (and the thread count of the block that sums their partials).
constexpr int kReduceBlocks = 1024;
// The fixed grid of the token scans (and the thread count of the block that combines them).
constexpr int kTokenBlocks = 256;

// Elements of T per 16 bytes; a kernel over several types takes the smallest.
template <typename... T>
constexpr int kPack = int(16 / std::max({sizeof(T)...}));

// A grid-stride launch over n elements in packs of V.
unsigned grid_for(int64_t n, int V) {
  return std::min(blocks_for((n + V - 1) / V, kThreads), kMaxBlocks);
}

// dst (n) = src (n) converted: through fp32, which holds every bf16 and fp16 value exactly, so
// one rounding.
template <int V, typename D, typename S>
__global__ void __launch_bounds__(kThreads) convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    const int m = pack_size<V>(i, n);
    float a[V];
    load_pack(a, src + i, m);
    store_pack(dst + i, a, m);
  }
}

// y (n) += x (n).
template <int V, typename S>
__global__ void __launch_bounds__(kThreads) add_kernel(S* y, const S* x, int64_t n) {
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    const int m = pack_size<V>(i, n);
    float a[V], b[V];
    load_pack(a, y + i, m);
    load_pack(b, x + i, m);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] += b[j];
    store_pack(y + i, a, m);
  }
}

// y (total / N, N) += b (N) on every row; a pack may span two rows.
template <int V, typename S>
__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(S* y, const S* b, int64_t total, int64_t N) {
  for (int64_t i = thread_index() * V; i < total; i += thread_count() * V) {
    const int m = pack_size<V>(i, total);
    float a[V];
    load_pack(a, y + i, m);
    int64_t c = i % N;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      a[j] += to_f(b[c]);
      c = c + 1 == N ? 0 : c + 1;
    }
    store_pack(y + i, a, m);
  }
}

// t (n) *= s.
template <int V, typename S>
__global__ void __launch_bounds__(kThreads) scale_kernel(S* t, int64_t n, float s) {
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    const int m = pack_size<V>(i, n);
    float a[V];
    load_pack(a, t + i, m);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] *= s;
    store_pack(t + i, a, m);
  }
}

// t (n) = cap · tanh(t / cap), with inv = 1/cap (as the CPU's softcap_inplace).
template <int V, typename S>
__global__ void __launch_bounds__(kThreads) softcap_kernel(S* t, int64_t n, float cap, float inv) {
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    const int m = pack_size<V>(i, n);
    float a[V];
    load_pack(a, t + i, m);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = cap * tanhf(a[j] * inv);
    store_pack(t + i, a, m);
  }
}

// partial[block] = this block's share of Σ x² (kSquare) or Σ x over x (n), in fp64. The pack of
// V elements a thread owns does not depend on the address, so neither does the sum's order.
template <bool kSquare, int V, typename T>
__global__ void __launch_bounds__(kThreads) sum_partials(const T* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    float a[V];
    load_pack(a, x + i, pack_size<V>(i, n));  // lanes past n are 0 and add nothing
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const double d = a[j];
      s += kSquare ? d * d : d;
    }
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *out = Σ partial (kReduceBlocks), one per thread of the one block.
__global__ void __launch_bounds__(kReduceBlocks) sum_finish(const double* partial, double* out) {
  __shared__ double shared[32];
  const double s = block_sum(partial[threadIdx.x], shared);
  if (threadIdx.x == 0) *out = s;
}

// Σ over x (n) of x² or x in fp64, read back to the host (the stream's work so far included).
template <bool kSquare, typename T>
double fp64_sum(const T* x, int64_t n) {
  if (n == 0) return 0.0;
  constexpr int V = kPack<T>;
  double* partial = static_cast<double*>(scratch(sizeof(double) * (kReduceBlocks + 1)));
  double* total = partial + kReduceBlocks;
  const cudaStream_t stream = compute_stream();
  sum_partials<kSquare, V><<<kReduceBlocks, kThreads, 0, stream>>>(x, n, partial);
  STRATA_CUDA_LAUNCHED();
  sum_finish<<<1, kReduceBlocks, 0, stream>>>(partial, total);
  STRATA_CUDA_LAUNCHED();
  double result = 0.0;
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  synchronize_compute();
  return result;
}

// The token scans as (identity, per-token value, combination): the smallest index of a token
// outside [lo, hi) (none: INT64_MAX), and the count of tokens >= 0. Integer minima and sums are
// exact, so any order gives the same result.
struct FirstOutside {
  int64_t lo, hi;
  static constexpr int64_t kIdentity = INT64_MAX;
  __device__ int64_t item(int64_t i, int32_t token) const {
    return token < lo || token >= hi ? i : kIdentity;
  }
  __device__ static int64_t combine(int64_t a, int64_t b) { return a < b ? a : b; }
};
struct CountNonnegative {
  static constexpr int64_t kIdentity = 0;
  __device__ int64_t item(int64_t, int32_t token) const { return token >= 0 ? 1 : 0; }
  __device__ static int64_t combine(int64_t a, int64_t b) { return a + b; }
};

// Op::combine over the block (blockDim.x a multiple of 32); thread 0 gets the result.
template <typename Op>
__device__ __forceinline__ int64_t block_combine(int64_t v, int64_t* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : Op::kIdentity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// partial[block] = Op over this block's share of tokens (n).
template <typename Op>
__global__ void __launch_bounds__(kThreads)
    token_partials(const int32_t* tokens, int64_t n, Op op, int64_t* partial) {
  __shared__ int64_t shared[32];
  int64_t v = Op::kIdentity;
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    v = Op::combine(v, op.item(i, tokens[i]));
  }
  v = block_combine<Op>(v, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

// *out = Op over partial (kTokenBlocks), one per thread of the one block.
template <typename Op>
__global__ void __launch_bounds__(kTokenBlocks) token_finish(const int64_t* partial, int64_t* out) {
  __shared__ int64_t shared[32];
  const int64_t v = block_combine<Op>(partial[threadIdx.x], shared);
  if (threadIdx.x == 0) *out = v;
}

// Op over tokens (n, device), read back to the host.
template <typename Op>
int64_t scan_tokens(const int32_t* tokens, int64_t n, Op op) {
  int64_t* partial = static_cast<int64_t*>(scratch(sizeof(int64_t) * (kTokenBlocks + 1)));
  int64_t* total = partial + kTokenBlocks;
  const cudaStream_t stream = compute_stream();
  token_partials<Op><<<kTokenBlocks, kThreads, 0, stream>>>(tokens, n, op, partial);
  STRATA_CUDA_LAUNCHED();
  token_finish<Op><<<1, kTokenBlocks, 0, stream>>>(partial, total);
  STRATA_CUDA_LAUNCHED();
  int64_t result = 0;
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(&result, total, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  synchronize_compute();
  return result;
}

}  // namespace

void copy(Tensor dst, Tensor src) {
  const int64_t n = src.numel();
  if (n == 0) return;  // an empty shard may have no address
  const cudaStream_t stream = compute_stream();
  if (dst.dtype == src.dtype) {  // int32 included
    // cudaMemcpyDefault: either side may be pinned host memory viewed as the device's (the
    // activation checkpoints activation_checkpointing.cpu_checkpointing keeps on the host).
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, stream));
    return;
  }
  with_type("copy", dst.dtype, [&](auto d) {
    with_type("copy", src.dtype, [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      if constexpr (!std::is_same_v<D, S>) {
        constexpr int V = kPack<D, S>;
        convert_kernel<V>
            <<<grid_for(n, V), kThreads, 0, stream>>>(dev<D>(dst), dev<const S>(src), n);
        STRATA_CUDA_LAUNCHED();
      }
    });
  });
}

void add_inplace(Tensor y, Tensor x) {
  const int64_t n = y.numel();
  with_type("add_inplace", y.dtype, [&](auto s) {
    using S = decltype(s);
    constexpr int V = kPack<S>;
    add_kernel<V><<<grid_for(n, V), kThreads, 0, compute_stream()>>>(dev<S>(y), dev<const S>(x), n);
    STRATA_CUDA_LAUNCHED();
  });
}

void add_bias(Tensor y, Tensor b) {
  const int64_t total = y.numel(), N = b.numel();
  with_type("add_bias", y.dtype, [&](auto s) {
    using S = decltype(s);
    constexpr int V = kPack<S>;
    add_bias_kernel<V><<<grid_for(total, V), kThreads, 0, compute_stream()>>>(
        dev<S>(y), dev<const S>(b), total, N);
    STRATA_CUDA_LAUNCHED();
  });
}

void scale_inplace(Tensor t, float s) {
  const int64_t n = t.numel();
  with_type("scale_inplace", t.dtype, [&](auto z) {
    using S = decltype(z);
    constexpr int V = kPack<S>;
    scale_kernel<V><<<grid_for(n, V), kThreads, 0, compute_stream()>>>(dev<S>(t), n, s);
    STRATA_CUDA_LAUNCHED();
  });
}

void softcap_inplace(Tensor t, float cap) {
  const int64_t n = t.numel();
  if (n == 0) return;  // an empty shard may have no address
  with_type("softcap_inplace", t.dtype, [&](auto z) {
    using S = decltype(z);
    constexpr int V = kPack<S>;
    softcap_kernel<V>
        <<<grid_for(n, V), kThreads, 0, compute_stream()>>>(dev<S>(t), n, cap, 1.0f / cap);
    STRATA_CUDA_LAUNCHED();
  });
}

double sum_squares(Tensor t) {
  double result = 0.0;
  with_type("sum_squares", t.dtype, [&](auto z) {
    using S = decltype(z);
    result = fp64_sum<true>(dev<const S>(t), t.numel());
  });
  return result;
}

double sum(Tensor t) {
  return fp64_sum<false>(dev<const float>(t), t.numel());
}

int64_t find_token_outside(const int32_t* t, int64_t n, int64_t lo, int64_t hi) {
  if (n == 0) return -1;
  const int64_t first = scan_tokens(t, n, FirstOutside{lo, hi});
  return first == FirstOutside::kIdentity ? -1 : first;
}

int64_t count_nonnegative(const int32_t* t, int64_t n) {
  if (n == 0) return 0;
  return scan_tokens(t, n, CountNonnegative{});
}

}  // namespace strata::ops::cuda
