// What the CUDA kernels share (kernels/cuda/*.cu): the storage types of strata's dtypes on the
// device, loads and stores through fp32, the dispatch of a DType to them, and deterministic warp
// and block reductions (a fixed tree: the same inputs give the same bits on the same GPU, whatever
// the launch's timing; no float atomics anywhere in the backend).
//
// Internal to kernels/cuda: device code only sees this header and runtime.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "strata/core/check.h"
#include "strata/core/dtype.h"
#include "strata/core/tensor.h"
#include "strata/kernels/cuda/runtime.h"

namespace strata::ops::cuda {

// --- storage types ------------------------------------------------------------------------------
// fp32, bf16 and fp16 values are stored as float, __nv_bfloat16 and __half; every computation
// runs in fp32 and rounds once on store (round to nearest even, as the CPU backend's
// f32_to_bf16 / f32_to_f16).
__device__ __forceinline__ float to_f(float v) {
  return v;
}
__device__ __forceinline__ float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_f(__half v) {
  return __half2float(v);
}

template <typename S>
__device__ __forceinline__ S from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

// f(S{}) for the device storage type of a float dtype; int32 is not a value dtype.
template <typename F>
inline void with_type(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(__nv_bfloat16{});
      return;
    case DType::F16:
      f(__half{});
      return;
    case DType::I32:
      break;
  }
  STRATA_FAIL(op, ": no CUDA kernel for ", dtype_name(t), " values");
}

// f(S{}, G{}) for the (value, gradient) pairs the CPU backend builds (kernels/cpu/common.h
// STRATA_FOR_EACH_SG): (fp32, fp32), (bf16, fp32), (bf16, bf16), (fp16, fp32), (fp16, fp16).
template <typename F>
inline void with_types(const char* op, DType s, DType g, F&& f) {
  if (s == DType::F32 && g == DType::F32) return f(float{}, float{});
  if (s == DType::BF16 && g == DType::F32) return f(__nv_bfloat16{}, float{});
  if (s == DType::BF16 && g == DType::BF16) return f(__nv_bfloat16{}, __nv_bfloat16{});
  if (s == DType::F16 && g == DType::F32) return f(__half{}, float{});
  if (s == DType::F16 && g == DType::F16) return f(__half{}, __half{});
  STRATA_FAIL(op, ": no CUDA kernel for ", dtype_name(s), " values with ", dtype_name(g),
              " gradients");
}

// The view's elements as T on the device.
template <typename T>
inline T* dev(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// --- packs ------------------------------------------------------------------------------------
// Grid-stride loops over packs of V elements (16 bytes of the widest type): a vector load or store
// where the address allows, element by element where it does not (views may be slices at any
// element offset) and for the last, partial pack.
namespace packs {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// a = the m (<= V) elements at p in fp32, lanes past m 0: one vector load when m == V and p is
// aligned to the pack.
template <int V, typename T>
__device__ __forceinline__ void load_pack(float (&a)[V], const T* p, int m) {
  if (m == V && reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, V>) == 0) {
    const Pack<T, V> q = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = to_f(q.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = j < m ? to_f(p[j]) : 0.0f;
  }
}

// The first m (<= V) lanes of a, rounded to T, at p.
template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, const float (&a)[V], int m) {
  if (m == V && reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, V>) == 0) {
    Pack<T, V> q;
#pragma unroll
    for (int j = 0; j < V; ++j) q.v[j] = from_f<T>(a[j]);
    *reinterpret_cast<Pack<T, V>*>(p) = q;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j < m) p[j] = from_f<T>(a[j]);
    }
  }
}

__device__ __forceinline__ int64_t thread_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() {
  return int64_t(gridDim.x) * blockDim.x;
}
// Elements in the pack starting at i of n.
template <int V>
__device__ __forceinline__ int pack_size(int64_t i, int64_t n) {
  return n - i < V ? int(n - i) : V;
}

}  // namespace packs

// --- reductions ---------------------------------------------------------------------------------
// Butterfly reductions over a full warp: every lane ends with the same value, summed in the same
// order on every run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A sum over the whole block (blockDim.x a multiple of 32, at most 1024): each warp reduces, then
// warp 0 reduces the warps' sums; every thread gets the result. `shared` holds 32 values; the call
// ends with a barrier, so it may be called again at once.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < warps ? shared[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

}  // namespace strata::ops::cuda
