// The guarded test device (core/device_memory.h): device memory is out of the host's reach except
// through the kernel interface. Runs with STRATA_GUARDED_DEVICE=1 (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "strata/core/device_memory.h"
#include "strata/core/memory.h"
#include "strata/kernels/ops.h"

namespace strata {
namespace {

constexpr const char* kHostTouch = "host code touched guarded device memory";

TEST(GuardedDevice, IsSelectedByTheEnvironment) {
  ASSERT_TRUE(device_memory::guarded()) << "run with STRATA_GUARDED_DEVICE=1";
  Buffer b(MemCategory::Params, 100);
  EXPECT_TRUE(device_memory::contains(b.data()));
  Buffer h = Buffer::host(MemCategory::CommBuffers, 100);
  EXPECT_FALSE(device_memory::contains(h.data()));
}

TEST(GuardedDevice, KernelsReadAndWriteIt) {
  Buffer b(MemCategory::Params, 6 * sizeof(float));
  const Tensor t(b.data(), DType::F32, {6});
  const std::vector<float> in = {1, 2, 3, 4, 5, 6};
  ops::copy_from_host(t, in.data());
  ops::scale_inplace(t, 2.0f);
  std::vector<float> out(6);
  ops::copy_to_host(out.data(), t);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_DOUBLE_EQ(ops::sum(t), 42.0);
}

TEST(GuardedDevice, ReusedMemoryReadsAsZeros) {
  std::vector<float> out(4096, 1.0f);
  const void* first = nullptr;
  {
    Buffer b(MemCategory::Activations, out.size() * sizeof(float));
    first = b.data();
    const std::vector<float> ones(out.size(), 1.0f);
    ops::copy_from_host(Tensor(b.data(), DType::F32, {int64_t(out.size())}), ones.data());
  }
  Buffer b(MemCategory::Activations, out.size() * sizeof(float));
  // First fit: the new block reuses the pages just released (perhaps joined to a free block
  // before them).
  const char* at = static_cast<const char*>(b.data());
  EXPECT_TRUE(at <= first && static_cast<const char*>(first) < at + b.bytes());
  ops::copy_to_host(out.data(), Tensor(b.data(), DType::F32, {int64_t(out.size())}));
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

TEST(GuardedDevice, HostMemoryStaysOpen) {
  Buffer h = Buffer::host(MemCategory::CommBuffers, 64);
  static_cast<volatile char*>(h.data())[3] = 7;
  EXPECT_EQ(static_cast<char*>(h.data())[3], 7);
}

// The point of the device: a host access outside the kernel interface fails loudly, naming
// itself, instead of working on the CPU and breaking on a GPU.
TEST(GuardedDeviceDeathTest, HostWriteFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Buffer b(MemCategory::Grads, 64);
        static_cast<volatile float*>(b.data())[1] = 1.0f;
      },
      kHostTouch);
}

TEST(GuardedDeviceDeathTest, HostReadFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Buffer b(MemCategory::MasterParams, 64);
        const Tensor t(b.data(), DType::F32, {16});
        ops::fill_zero(t);  // allowed: a kernel
        volatile float x = static_cast<const volatile float*>(b.data())[0];
        (void)x;
      },
      kHostTouch);
}

TEST(GuardedDeviceDeathTest, AccessEndsWithTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Buffer b(MemCategory::Params, 64);
        {
          const device_memory::Access open;
          static_cast<volatile float*>(b.data())[0] = 1.0f;  // inside a scope: allowed
        }
        static_cast<volatile float*>(b.data())[0] = 2.0f;
      },
      kHostTouch);
}

}  // namespace
}  // namespace strata
