// Tests read device memory as any host code must: through the kernel interface (kernels/ops.h),
// so that they pass on the guarded test device (core/device_memory.h).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/kernels/ops.h"

namespace strata::test {

// n elements of dtype t at device address p, as they are stored.
inline std::vector<uint8_t> device_bytes(const void* p, DType t, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(t));
  ops::copy_to_host(out.data(), Tensor(const_cast<void*>(p), t, {n}));
  return out;
}

// The same converted to fp32 (element offset `offset` of p onward).
inline std::vector<float> device_f32(const void* p, DType t, int64_t n, int64_t offset = 0) {
  std::vector<float> out(static_cast<size_t>(n));
  ops::copy(
      Tensor(out.data(), DType::F32, {n}),
      Tensor(static_cast<char*>(const_cast<void*>(p)) + size_t(offset) * dtype_size(t), t, {n}));
  return out;
}

}  // namespace strata::test
