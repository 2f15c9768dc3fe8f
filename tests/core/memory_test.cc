#include "strata/core/memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace strata {
namespace {

TEST(Buffer, IsAlignedZeroedAndCounted) {
  auto& tr = MemoryTracker::instance();
  size_t before = tr.current(MemCategory::Activations);
  {
    Buffer b(MemCategory::Activations, 1000);
    EXPECT_EQ(b.bytes(), 1000u);
    EXPECT_EQ(b.category(), MemCategory::Activations);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(b.as<uint8_t>()[i], 0);
    EXPECT_EQ(tr.current(MemCategory::Activations), before + 1000);
  }
  EXPECT_EQ(tr.current(MemCategory::Activations), before);
}

TEST(MemoryTracker, TracksCurrentAndPeakPerCategory) {
  auto& tr = MemoryTracker::instance();
  tr.reset_peaks();
  size_t grads0 = tr.current(MemCategory::Grads), opt0 = tr.current(MemCategory::OptimizerState);
  size_t total0 = tr.current_total();
  {
    Buffer a(MemCategory::Grads, 4096);
    {
      Buffer b(MemCategory::Grads, 1024);
      Buffer c(MemCategory::OptimizerState, 512);
      EXPECT_EQ(tr.current(MemCategory::Grads), grads0 + 5120);
      EXPECT_EQ(tr.current(MemCategory::OptimizerState), opt0 + 512);
      EXPECT_EQ(tr.current_total(), total0 + 5632);
    }
    EXPECT_EQ(tr.current(MemCategory::Grads), grads0 + 4096);
    EXPECT_EQ(tr.peak(MemCategory::Grads), grads0 + 5120);
    EXPECT_EQ(tr.peak(MemCategory::OptimizerState), opt0 + 512);
    EXPECT_GE(tr.peak_total(), total0 + 5632);
    tr.reset_peaks();
    EXPECT_EQ(tr.peak(MemCategory::Grads), grads0 + 4096);
  }
  EXPECT_EQ(tr.current(MemCategory::Grads), grads0);
  EXPECT_EQ(tr.current_total(), total0);
}

TEST(Buffer, MoveTransfersOwnershipOnce) {
  auto& tr = MemoryTracker::instance();
  size_t before = tr.current(MemCategory::Params);
  Buffer a(MemCategory::Params, 256);
  void* p = a.data();
  Buffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.bytes(), 256u);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(tr.current(MemCategory::Params), before + 256);

  Buffer c(MemCategory::Params, 64);
  c = std::move(b);  // c's own 64 bytes are released
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(tr.current(MemCategory::Params), before + 256);
  c = Buffer();
  EXPECT_EQ(tr.current(MemCategory::Params), before);
}

TEST(Memory, NamesAndFormatting) {
  EXPECT_STREQ(mem_category_name(MemCategory::OptimizerState), "optimizer_state");
  EXPECT_STREQ(mem_category_name(MemCategory::Workspace), "workspace");
  EXPECT_FALSE(format_bytes(12900000).empty());
}

}  // namespace
}  // namespace strata
