// The bf16/fp16 sum that MPI runs for a half-precision wire: fp32 add, round to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/comm/wire_reduce.h"
#include "strata/core/dtype.h"

namespace strata::comm {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename H>
void expect_matches_scalar_reference(DType t) {
  // Every 16-bit pattern against random partners, at a length that leaves a SIMD tail.
  const size_t n = 65536 * 4 + 5;
  std::vector<uint16_t> a(n), b(n), sum(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = uint16_t(i);
    b[i] = uint16_t(mix(i));
  }
  sum = a;
  detail::sum_into(sum.data(), b.data(), n, t);
  for (size_t i = 0; i < n; ++i) {
    const float exact = to_f32(H{a[i]}) + to_f32(H{b[i]});
    const H want = from_f32<H>(exact);
    if (std::isnan(exact)) {
      ASSERT_TRUE(std::isnan(to_f32(H{sum[i]}))) << i;
    } else {
      ASSERT_EQ(sum[i], want.bits) << dtype_name(t) << " " << a[i] << " + " << b[i];
    }
  }
}

TEST(WireSum, Bf16AddsInFp32AndRoundsToNearestEven) {
  expect_matches_scalar_reference<bf16>(DType::BF16);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even wins.
  uint16_t x = f32_to_bf16(1.0f).bits, y = f32_to_bf16(0.00390625f).bits;
  detail::sum_into(&x, &y, 1, DType::BF16);
  EXPECT_EQ(bf16_to_f32(bf16{x}), 1.0f);
}

TEST(WireSum, Fp16AddsInFp32AndRoundsToNearestEven) {
  expect_matches_scalar_reference<f16>(DType::F16);
  uint16_t x = f32_to_f16(60000.0f).bits, y = f32_to_f16(10000.0f).bits;
  detail::sum_into(&x, &y, 1, DType::F16);
  EXPECT_TRUE(std::isinf(f16_to_f32(f16{x})));  // overflow saturates to inf, as on a GPU
}

TEST(WireSum, Fp32IsAPlainSum) {
  float x[3] = {1, 2, 3}, y[3] = {0.5f, -2, 1e-8f};
  detail::sum_into(x, y, 3, DType::F32);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[2], 3.0f);
}

}  // namespace
}  // namespace strata::comm
