#include "strata/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "strata/core/check.h"

namespace strata {
namespace {

float bits_f32(uint32_t u) {
  return std::bit_cast<float>(u);
}
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f).bits, 0x3f80);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  // Just above and below a tie round to the nearer neighbour.
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808001)).bits, 0x3f81);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f807fff)).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(-1.0f - 0x1p-8f).bits, 0xbf80);
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(f32_to_bf16(kInf).bits, 0x7f80);
  EXPECT_EQ(f32_to_bf16(-kInf).bits, 0xff80);
  EXPECT_EQ(f32_to_bf16(-0.0f).bits, 0x8000);
  // The largest float rounds past bf16's largest finite value: overflow to Inf.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  // NaNs stay NaN, even one whose payload sits only in the bits rounding drops.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f80ffffu}) {
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_f32(nan))))) << std::hex << nan;
  }
  // Subnormal floats round like any other value.
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00008000)).bits, 0x0000);  // tie, even
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00018000)).bits, 0x0002);  // tie, even
}

TEST(Bf16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(bf16{uint16_t(h)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f).bits, h);
  }
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f).bits, 0x3c00);      // tie → even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);  // tie → even (up)
  EXPECT_EQ(f32_to_f16(1.0f + 0x1.2p-11f).bits, 0x3c01);    // above the tie
  EXPECT_EQ(f32_to_f16(-2.5f).bits, 0xc100);
}

TEST(F16, OverflowAndSpecials) {
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);    // largest finite
  EXPECT_EQ(f32_to_f16(65519.996f).bits, 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);    // the midpoint: ties to even = Inf
  EXPECT_EQ(f32_to_f16(1e10f).bits, 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(f32_to_f16(kInf).bits, 0x7c00);
  EXPECT_EQ(f32_to_f16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(bits_f32(0x7f800001)))));
  EXPECT_EQ(f16_to_f32(f16{0x7c00}), kInf);
  EXPECT_EQ(f16_to_f32(f16{0xfc00}), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_f32(f16{0x7c01})));
}

TEST(F16, Subnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f).bits, 0x0001);      // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f).bits, 0x0000);      // half of it: tie → even (0)
  EXPECT_EQ(f32_to_f16(0x1.8p-25f).bits, 0x0001);    // above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f).bits, 0x0002);  // 1.5 units: tie → even (2)
  EXPECT_EQ(f32_to_f16(0x1p-26f).bits, 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-24f).bits, 0x8001);
  EXPECT_EQ(f32_to_f16(0x1p-14f).bits, 0x0400);             // smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-24f).bits, 0x03ff);  // largest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-26f).bits, 0x0400);  // rounds up into the normals
  EXPECT_EQ(f16_to_f32(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(f16{0x03ff}), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(f16_to_f32(f16{0x8200}), -0x1p-15f);
}

TEST(F16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(f16{uint16_t(h)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f).bits, h);
  }
}

TEST(Convert, AllPairsMatchScalarConversions) {
  const size_t n = 100000;  // above the parallel threshold
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = std::ldexp(float(i % 977) - 488.0f, int(i % 41) - 20);
  std::vector<bf16> b(n);
  std::vector<f16> h(n), h2(n);
  std::vector<float> back(n);
  convert(b.data(), DType::BF16, src.data(), DType::F32, n);
  convert(h.data(), DType::F16, src.data(), DType::F32, n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(b[i].bits, f32_to_bf16(src[i]).bits);
    ASSERT_EQ(h[i].bits, f32_to_f16(src[i]).bits);
  }
  convert(h2.data(), DType::F16, b.data(), DType::BF16, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(h2[i].bits, f32_to_f16(bf16_to_f32(b[i])).bits);
  convert(back.data(), DType::F32, h.data(), DType::F16, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], f16_to_f32(h[i]));
  convert(back.data(), DType::F32, src.data(), DType::F32, n);  // same type: a copy
  EXPECT_EQ(back, src);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_EQ(parse_dtype("bfloat16", "x"), DType::BF16);
  EXPECT_EQ(parse_dtype("half", "x"), DType::F16);
  EXPECT_EQ(parse_dtype("float32", "x"), DType::F32);
  EXPECT_THROW(parse_dtype("fp8", "train.dtype"), InputError);
  static_assert(dtype_of<bf16>() == DType::BF16 && dtype_of<f16>() == DType::F16);
  EXPECT_EQ(to_f32(from_f32<bf16>(1.5f)), 1.5f);
  EXPECT_EQ(to_f32(from_f32<f16>(-0.25f)), -0.25f);
}

}  // namespace
}  // namespace strata
