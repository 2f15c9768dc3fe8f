// The interface's device answers where no GPU is visible (this suite's CI machines): CUDA is
// asked for and refused with the fix named, views and buffers on it fail before touching memory,
// and what a backend keeps or needs is answered per device.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "strata/core/check.h"
#include "strata/core/device.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/ops.h"

namespace strata {
namespace {

bool gpu_visible() {
  return ops::device_count(Device::CUDA) > 0;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSelect, TheCpuIsAlwaysThereAndTheDefault) {
  EXPECT_EQ(ops::device_count(Device::CPU), 1);
  EXPECT_EQ(default_device(), Device::CPU);
  EXPECT_NO_THROW(ops::init_device(Device::CPU, 0));
  EXPECT_STREQ(device_name(Device::CUDA), "cuda");
  EXPECT_STREQ(device_name(Device::CPU), "cpu");
  const ops::Stream s = ops::compute_stream();
  EXPECT_EQ(s.device, Device::CPU);
  EXPECT_EQ(s.kind, ops::StreamKind::Compute);
}

TEST(DeviceSelect, AGpuThatIsNotThereIsAnInputErrorNamingTheFix) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible";
  try {
    ops::init_device(Device::CUDA, 0);
    FAIL() << "init_device(CUDA) succeeded without a GPU";
  } catch (const InputError& e) {
    const std::string m = e.what();
#if STRATA_HAVE_CUDA
    EXPECT_NE(m.find("GPU 0 does not exist: 0 CUDA devices are visible"), std::string::npos) << m;
#else
    EXPECT_NE(m.find("built without the CUDA backend"), std::string::npos) << m;
#endif
  }
}

TEST(DeviceSelect, CudaMemoryAndViewsFailBeforeAGpuIsSelected) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible";
  const std::string alloc = message_of([] { Buffer b(MemCategory::Workspace, 64, Device::CUDA); });
  EXPECT_NE(alloc.find("device memory on CUDA needs the CUDA backend"), std::string::npos) << alloc;
  // A view that claims to be on a GPU never reaches a CPU kernel (its address is not read).
  float host[4] = {1, 2, 3, 4};
  const std::string view =
      message_of([&] { ops::fill_zero(Tensor(host, DType::F32, {4}, Device::CUDA)); });
#if STRATA_HAVE_CUDA
  EXPECT_NE(view.find("before a GPU is selected"), std::string::npos) << view;
#else
  EXPECT_NE(view.find("built without the CUDA backend"), std::string::npos) << view;
#endif
  EXPECT_EQ(host[0], 1.0f);
  // Mixing devices in one call is refused whatever is built.
  const std::string mixed = message_of([&] {
    ops::add_inplace(Tensor(host, DType::F32, {4}, Device::CUDA), Tensor(host, DType::F32, {4}));
  });
  EXPECT_NE(mixed.find("all views of one call must be on one device"), std::string::npos) << mixed;
}

TEST(DeviceSelect, HostMemoryIsTheCpus) {
  float x = 0;
  Buffer b = Buffer::host(MemCategory::Workspace, 64);
  EXPECT_EQ(ops::device_of(&x), Device::CPU);
  EXPECT_EQ(ops::device_of(b.data()), Device::CPU);
  EXPECT_EQ(ops::device_of(nullptr), Device::CPU);
}

TEST(DeviceSelect, WhatAttentionKeepsAndNeedsIsTheBackends) {
  const ops::AttentionShape s{2, 16, 3, 2, 8};  // B, T, groups, rep, hd: 6 query heads
  kernels::set_attention_path(kernels::AttentionPath::Materialized);
  const ops::AttentionSaved cpu = ops::attention_saved(Device::CPU, DType::BF16, s);
  EXPECT_EQ(cpu.dtype, DType::BF16);
  EXPECT_EQ(cpu.numel, 2 * 6 * 16 * 16);  // the probabilities
  EXPECT_GT(ops::attention_backward_scratch_floats(Device::CPU, DType::BF16, s), 0u);
  kernels::set_attention_path(kernels::AttentionPath::Tiled);
  const ops::AttentionSaved tiled = ops::attention_saved(Device::CPU, DType::BF16, s);
  EXPECT_EQ(tiled.dtype, DType::F32);
  EXPECT_EQ(tiled.numel, 2 * 6 * 16);  // a log-sum-exp per query row, as the GPU's
  EXPECT_EQ(ops::attention_backward_scratch_floats(Device::CPU, DType::BF16, s), 0u);
  kernels::set_attention_path(std::nullopt);
  const ops::AttentionSaved gpu = ops::attention_saved(Device::CUDA, DType::BF16, s);
  EXPECT_EQ(gpu.dtype, DType::F32);
  EXPECT_EQ(gpu.numel, 2 * 6 * 16);  // a log-sum-exp per query row
  EXPECT_EQ(ops::attention_backward_scratch_floats(Device::CUDA, DType::BF16, s), 0u);
}

TEST(DeviceSelect, AGpuProductNeverWidensItsOperands) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t rows : {1, 7, 4096}) {
      EXPECT_FALSE(ops::gemm_widens(Device::CUDA, t, rows)) << dtype_name(t) << " " << rows;
    }
  }
  EXPECT_FALSE(ops::gemm_widens(Device::CPU, DType::F32, 7));  // fp32 is never widened
}

}  // namespace
}  // namespace strata
