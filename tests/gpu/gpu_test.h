// What the GPU tests share (ctest label `gpu`): a skip where no GPU is visible, device tensors
// made from host vectors and read back, and the comparison of a CUDA op's result with the CPU
// backend's (fp32 within 1e-5 relative, bf16 within 1e-2: issue 23's bounds).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/core/tensor.h"
#include "strata/kernels/ops.h"

namespace strata::gpu_test {

// Whether a CUDA device is visible; selects device 0 the first time it is (ops::init_device).
bool gpu_available();

#define STRATA_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                     \
    if (!::strata::gpu_test::gpu_available()) GTEST_SKIP() << "no CUDA device is visible"; \
  } while (0)

// A tensor of `dims` in `dtype` on `device`, holding `values` (fp32, converted to dtype; int32
// views take the values as integers). Owns its buffer.
struct Held {
  Buffer buf;
  Tensor t;
};
std::unique_ptr<Held> make(Device device, DType dtype, std::initializer_list<int64_t> dims,
                           const std::vector<float>& values);
std::unique_ptr<Held> make_tokens(Device device, std::initializer_list<int64_t> dims,
                                  const std::vector<int32_t>& values);
// A tensor's values read back as fp32 (any device, any float dtype).
std::vector<float> values(const Tensor& t);
// n values in [-scale, scale], deterministic in seed.
std::vector<float> random(size_t n, uint64_t seed, float scale = 1.0f);

// Every element of got within tol of want, relative to max(|want|, 1) (absolute near zero);
// the first mismatch is reported with its index.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double tol);
// The bound for results in dtype t: 1e-5 for fp32, 1e-2 for bf16 and fp16.
double tolerance(DType t);
// The same bits, element by element, any NaN counting as one (a NaN stays a NaN; its payload is
// the backend's).
::testing::AssertionResult identical(const std::vector<float>& got, const std::vector<float>& want);

// Values (or activations and parameters) in s, gradients in g: the pairs the CPU backend builds
// (kernels/cpu/common.h STRATA_FOR_EACH_SG), for value-parameterized tests.
struct SG {
  DType s, g;
};
inline auto sg_pairs() {
  return ::testing::Values(SG{DType::F32, DType::F32}, SG{DType::BF16, DType::F32},
                           SG{DType::BF16, DType::BF16}, SG{DType::F16, DType::F32},
                           SG{DType::F16, DType::F16});
}
std::string sg_name(const ::testing::TestParamInfo<SG>& p);

}  // namespace strata::gpu_test
