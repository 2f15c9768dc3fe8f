// What the CPU kernels share: the dtype combinations they are compiled for, the amount of work
// below which a loop stays on one thread, and their cached workspaces.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"

namespace strata::kernels {

// Elements (of a simple pointwise loop) below which starting a parallel region costs more than
// it saves. Results never depend on it: every kernel gives the same bits on any thread count.
inline constexpr int64_t kParallelMinWork = int64_t(1) << 15;

// buf as at least `elems` floats of workspace: grown to the largest size asked for (the first
// step's), then reused, so that steady-state steps allocate nothing.
inline float* reserve_floats(Buffer& buf, int64_t elems) {
  const size_t bytes = size_t(elems) * sizeof(float);
  if (buf.bytes() < bytes) buf = Buffer(MemCategory::Workspace, bytes, Device::CPU);
  return buf.as<float>();
}

}  // namespace strata::kernels

// S is the storage type of activations and parameters, G the type parameter gradients
// accumulate in.
#define STRATA_FOR_EACH_S(X) \
  X(float)                   \
  X(::strata::bf16)          \
  X(::strata::f16)

#define STRATA_FOR_EACH_SG(X)       \
  X(float, float)                   \
  X(::strata::bf16, float)          \
  X(::strata::bf16, ::strata::bf16) \
  X(::strata::f16, float)           \
  X(::strata::f16, ::strata::f16)
