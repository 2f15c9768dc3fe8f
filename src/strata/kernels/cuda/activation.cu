// Pointwise activations (ops.h) with the formulas of the CPU backend (kernels/cpu/activation.cc):
// GELU's tanh approximation written as x·sigmoid(2u), SwiGLU and GeGLU over the interleaved
// (gate f, up f) layout, fp32 arithmetic, each output rounded once to its dtype; gradients
// overwrite.
//
// A thread takes V consecutive outputs: one 16-byte load and store per operand (V = kVec) where
// the count and the addresses allow it, one element (V = 1) otherwise. Each element's arithmetic
// is the same either way: the path changes the memory traffic, not the results.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluA = 0.044715f;
constexpr int kThreads = 256;

// 1 / (1 + e^−x), e^−x capped at e^88.37 as the CPU's exp_approx caps it (kernels/cpu/vec.h):
// far below zero the CPU's sigmoid is 4e-39, not the 0 of an overflowed expf. NaN stays NaN.
__device__ __forceinline__ float sigmoid(float x) {
  const float e = -x > 88.37f ? 88.37f : -x;
  return 1.0f / (1.0f + expf(e));
}

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  return x * sigmoid(2.0f * u);
}

// With s = sigmoid(2u) = (1 + tanh u)/2: d/dx [x·s] = s + x·2s(1-s)·u'.
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  const float s = sigmoid(2.0f * u);
  return s + x * 2.0f * s * (1.0f - s) * du;
}

// --- packs ---------------------------------------------------------------------------------------
template <typename S>
constexpr int kVec = int(16 / sizeof(S));

// V elements of S, 16-byte aligned when they fill 16 bytes.
template <typename S, int V>
struct alignas(sizeof(S) * V) Pack {
  S v[V];
};

template <int V, typename S>
__device__ __forceinline__ Pack<S, V> load(const S* p) {
  return *reinterpret_cast<const Pack<S, V>*>(p);
}
template <int V, typename S>
__device__ __forceinline__ void store(S* p, const Pack<S, V>& v) {
  *reinterpret_cast<Pack<S, V>*>(p) = v;
}

// The first element of this thread's pack of V.
template <int V>
__device__ __forceinline__ int64_t pack_begin() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
}

// --- kernels: a thread per pack of V outputs (n a multiple of V) ---------------------------------

// out, x (n).
template <typename S, int V>
__global__ void gelu_forward_kernel(S* out, const S* x, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  const Pack<S, V> xv = load<V>(x + i);
  Pack<S, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = from_f<S>(gelu(to_f(xv.v[k])));
  store<V>(out + i, y);
}

// dx, x, dy (n); dx may be dy.
template <typename S, int V>
__global__ void gelu_backward_kernel(S* dx, const S* x, const S* dy, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  const Pack<S, V> xv = load<V>(x + i), g = load<V>(dy + i);
  Pack<S, V> d;
#pragma unroll
  for (int k = 0; k < V; ++k) d.v[k] = from_f<S>(gelu_grad(to_f(xv.v[k])) * to_f(g.v[k]));
  store<V>(dx + i, d);
}

// Elements [0, 2V) of p as fp32, in two packs of V: the V (gate, up) pairs of V outputs.
template <int V, typename S>
__device__ __forceinline__ void load_pairs(float (&f)[2 * V], const S* p) {
  const Pack<S, V> lo = load<V>(p), hi = load<V>(p + V);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    f[k] = to_f(lo.v[k]);
    f[V + k] = to_f(hi.v[k]);
  }
}

// out (n = N·F); x (2n): output i from the pair (gate, up) = x[2i], x[2i + 1].
template <typename S, int V>
__global__ void swiglu_forward_kernel(S* out, const S* x, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  float xv[2 * V];
  load_pairs<V>(xv, x + 2 * i);
  Pack<S, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = xv[2 * k], u = xv[2 * k + 1];
    y.v[k] = from_f<S>(g * sigmoid(g) * u);
  }
  store<V>(out + i, y);
}

// dx, x (2n) interleaved as in the forward; dy (n). silu'(g) = s·(1 + g·(1 - s)), s = sigmoid(g).
template <typename S, int V>
__global__ void swiglu_backward_kernel(S* dx, const S* dy, const S* x, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  float xv[2 * V];
  load_pairs<V>(xv, x + 2 * i);
  const Pack<S, V> dv = load<V>(dy + i);
  S d[2 * V];  // the gradients of xv's elements
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = xv[2 * k], u = xv[2 * k + 1], dk = to_f(dv.v[k]);
    const float s = sigmoid(g);
    d[2 * k] = from_f<S>(dk * u * s * (1.0f + g * (1.0f - s)));
    d[2 * k + 1] = from_f<S>(dk * g * s);
  }
  Pack<S, V> lo, hi;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    lo.v[k] = d[k];
    hi.v[k] = d[V + k];
  }
  store<V>(dx + 2 * i, lo);
  store<V>(dx + 2 * i + V, hi);
}

// out (n = N·F); x (2n): output i = gelu(gate)·up from the pair x[2i], x[2i + 1].
template <typename S, int V>
__global__ void geglu_forward_kernel(S* out, const S* x, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  float xv[2 * V];
  load_pairs<V>(xv, x + 2 * i);
  Pack<S, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = from_f<S>(gelu(xv[2 * k]) * xv[2 * k + 1]);
  store<V>(out + i, y);
}

// dx, x (2n) interleaved as in the forward; dy (n).
template <typename S, int V>
__global__ void geglu_backward_kernel(S* dx, const S* dy, const S* x, int64_t n) {
  const int64_t i = pack_begin<V>();
  if (i >= n) return;
  float xv[2 * V];
  load_pairs<V>(xv, x + 2 * i);
  const Pack<S, V> dv = load<V>(dy + i);
  S d[2 * V];  // the gradients of xv's elements
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = xv[2 * k], u = xv[2 * k + 1], dk = to_f(dv.v[k]);
    d[2 * k] = from_f<S>(dk * u * gelu_grad(g));
    d[2 * k + 1] = from_f<S>(dk * gelu(g));
  }
  Pack<S, V> lo, hi;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    lo.v[k] = d[k];
    hi.v[k] = d[V + k];
  }
  store<V>(dx + 2 * i, lo);
  store<V>(dx + 2 * i + V, hi);
}

// --- launches ------------------------------------------------------------------------------------
bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// f(std::integral_constant<int, V>{}) with V = kVec<S> where n outputs split into whole packs
// and every address is 16-byte aligned, else V = 1.
template <typename S, typename F>
void with_pack(int64_t n, std::initializer_list<const void*> ptrs, F&& f) {
  bool vector = n % kVec<S> == 0;
  for (const void* p : ptrs) vector = vector && aligned16(p);
  if (vector) {
    f(std::integral_constant<int, kVec<S>>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace

void gelu_forward(Tensor out, Tensor x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("gelu_forward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {out.data, x.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      gelu_forward_kernel<S, V>
          <<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(dev<S>(out), dev<const S>(x), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void gelu_backward(Tensor dx, Tensor x, Tensor dy) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("gelu_backward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {dx.data, x.data, dy.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      gelu_backward_kernel<S, V><<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(
          dev<S>(dx), dev<const S>(x), dev<const S>(dy), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void swiglu_forward(Tensor out, Tensor x) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("swiglu_forward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {out.data, x.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_forward_kernel<S, V>
          <<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(dev<S>(out), dev<const S>(x), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void swiglu_backward(Tensor dx, Tensor dy, Tensor x) {
  const int64_t n = dy.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("swiglu_backward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {dx.data, dy.data, x.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_backward_kernel<S, V><<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(
          dev<S>(dx), dev<const S>(dy), dev<const S>(x), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void geglu_forward(Tensor out, Tensor x) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("geglu_forward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {out.data, x.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      geglu_forward_kernel<S, V>
          <<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(dev<S>(out), dev<const S>(x), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

void geglu_backward(Tensor dx, Tensor dy, Tensor x) {
  const int64_t n = dy.numel();
  if (n == 0) return;
  const cudaStream_t stream = compute_stream();
  with_type("geglu_backward", x.dtype, [&](auto s) {
    using S = decltype(s);
    with_pack<S>(n, {dx.data, dy.data, x.data}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      geglu_backward_kernel<S, V><<<blocks_for(n / V, kThreads), kThreads, 0, stream>>>(
          dev<S>(dx), dev<const S>(dy), dev<const S>(x), n);
      STRATA_CUDA_LAUNCHED();
    });
  });
}

}  // namespace strata::ops::cuda
