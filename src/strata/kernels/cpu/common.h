// What the CPU kernels share: the dtype combinations they are compiled for, and the amount of
// work below which a loop stays on one thread.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// Elements (of a simple pointwise loop) below which starting a parallel region costs more than
// it saves. Results never depend on it: every kernel gives the same bits on any thread count.
inline constexpr int64_t kParallelMinWork = int64_t(1) << 15;

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
