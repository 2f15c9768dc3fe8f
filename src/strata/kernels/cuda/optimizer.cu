// The optimizer steps of the CUDA backend (backend.h): Adam/AdamW and SGD over flat views, with
// the CPU backend's formulas in its order of operations (kernels/cpu/optimizer.cc), the
// step-dependent constants computed on the host as it computes them. Grid-stride loops over packs
// of kPack elements (16 bytes of the fp32 master and moments; a vector load or store where the
// address allows, since shards start at any element).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

using namespace packs;  // NOLINT(build/namespaces): the backend's own helpers

constexpr int kThreads = 256;
// The most blocks of a launch: several waves of kThreads on any sm_80/sm_90 GPU.
constexpr unsigned kMaxBlocks = 4096;
// Elements per pack: 16 bytes of fp32 (8 of bf16 or fp16).
constexpr int kPack = 4;

unsigned grid_for(int64_t n) {
  return std::min(blocks_for((n + kPack - 1) / kPack, kThreads), kMaxBlocks);
}

// What an Adam step computes from AdamArgs, on the host as the CPU computes it.
struct AdamConstants {
  float step_size;  // lr / (1 − β1^t)
  float bc2_sqrt;   // sqrt(1 − β2^t)
  float decay;      // AdamW's 1 − lr·wd (1 for Adam)
  float l2;         // Adam's wd added to the gradient (0 for AdamW)
  float beta1, beta2, eps, grad_scale;
};

// master, m, v (n) fp32 updated; param (n, S; null when master is the parameter) = master
// rounded; grad (n, G).
template <typename S, typename G>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(float* master, S* param, const G* grad, float* m, float* v, int64_t n,
                AdamConstants k) {
  for (int64_t i = thread_index() * kPack; i < n; i += thread_count() * kPack) {
    const int count = pack_size<kPack>(i, n);
    float p[kPack], g[kPack], mi[kPack], vi[kPack];
    load_pack(p, master + i, count);
    load_pack(g, grad + i, count);
    load_pack(mi, m + i, count);
    load_pack(vi, v + i, count);
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      const float gj = g[j] * k.grad_scale + k.l2 * p[j];
      p[j] *= k.decay;
      mi[j] = k.beta1 * mi[j] + (1.0f - k.beta1) * gj;
      vi[j] = k.beta2 * vi[j] + (1.0f - k.beta2) * gj * gj;
      p[j] -= k.step_size * mi[j] / (sqrtf(vi[j]) / k.bc2_sqrt + k.eps);
    }
    store_pack(m + i, mi, count);
    store_pack(v + i, vi, count);
    store_pack(master + i, p, count);
    if (param != nullptr) store_pack(param + i, p, count);
  }
}

// Which momentum update an SGD step does: none, torch's first step (the buffer starts as g; its
// old contents are never read), or the running one.
enum class Momentum { None, First, Running };

struct SgdConstants {
  float lr, momentum, weight_decay, grad_scale;
  bool nesterov;
};

// master (n) fp32 updated; param (n, S; null when master is the parameter) = master rounded;
// grad (n, G); buf (n) fp32, untouched (and may be null) without momentum.
template <Momentum kMode, typename S, typename G>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(float* master, S* param, const G* grad, float* buf, int64_t n, SgdConstants k) {
  for (int64_t i = thread_index() * kPack; i < n; i += thread_count() * kPack) {
    const int count = pack_size<kPack>(i, n);
    float p[kPack], g[kPack], b[kPack];
    load_pack(p, master + i, count);
    load_pack(g, grad + i, count);
    if constexpr (kMode == Momentum::Running) load_pack(b, buf + i, count);
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      float gj = g[j] * k.grad_scale + k.weight_decay * p[j];
      if constexpr (kMode != Momentum::None) {
        float bj = gj;
        if constexpr (kMode == Momentum::Running) bj += k.momentum * b[j];
        b[j] = bj;
        gj = k.nesterov ? gj + k.momentum * bj : bj;
      }
      p[j] -= k.lr * gj;
    }
    if constexpr (kMode != Momentum::None) store_pack(buf + i, b, count);
    store_pack(master + i, p, count);
    if (param != nullptr) store_pack(param + i, p, count);
  }
}

}  // namespace

void adam_step(Tensor master, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamArgs& a) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const AdamConstants k{
      .step_size = float(a.lr / (1.0 - std::pow(double(a.beta1), double(a.step)))),
      .bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), double(a.step)))),
      .decay = a.adamw ? 1.0f - a.lr * a.weight_decay : 1.0f,
      .l2 = a.adamw ? 0.0f : a.weight_decay,
      .beta1 = a.beta1,
      .beta2 = a.beta2,
      .eps = a.eps,
      .grad_scale = a.grad_scale,
  };
  // Without param, master is the parameter (S = fp32) and is stored once.
  const DType target = param.data != nullptr ? param.dtype : DType::F32;
  with_types("adam_step", target, grad.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    adam_kernel<S, G><<<grid_for(n), kThreads, 0, compute_stream()>>>(
        dev<float>(master), dev<S>(param), dev<const G>(grad), dev<float>(m), dev<float>(v), n, k);
    STRATA_CUDA_LAUNCHED();
  });
}

void sgd_step(Tensor master, Tensor param, Tensor grad, Tensor buf, const SgdArgs& a) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const SgdConstants k{.lr = a.lr,
                       .momentum = a.momentum,
                       .weight_decay = a.weight_decay,
                       .grad_scale = a.grad_scale,
                       .nesterov = a.nesterov};
  const DType target = param.data != nullptr ? param.dtype : DType::F32;
  with_types("sgd_step", target, grad.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    const auto launch = [&](auto kernel) {
      kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
          dev<float>(master), dev<S>(param), dev<const G>(grad), dev<float>(buf), n, k);
      STRATA_CUDA_LAUNCHED();
    };
    if (a.momentum == 0.0f) {
      launch(sgd_kernel<Momentum::None, S, G>);
    } else if (a.step <= 1) {
      launch(sgd_kernel<Momentum::First, S, G>);
    } else {
      launch(sgd_kernel<Momentum::Running, S, G>);
    }
  });
}

}  // namespace strata::ops::cuda
