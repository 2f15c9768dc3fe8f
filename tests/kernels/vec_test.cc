// The vectorisable conversions and exp the kernels use, against core/dtype.h and libm.
#include "strata/kernels/cpu/vec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace strata::kernels {
namespace {

TEST(Vec, HalfLoadsMatchCoreForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = load(f16{uint16_t(h)}), b = f16_to_f32(f16{uint16_t(h)});
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << h;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(load(bf16{uint16_t(h)})),
              std::bit_cast<uint32_t>(bf16_to_f32(bf16{uint16_t(h)})));
  }
}

// Every 997th float bit pattern (all exponents, signs, NaNs, subnormals), plus the rounding
// boundaries around every f16/bf16 value near ties, through a vectorised loop.
TEST(Vec, StoresMatchCoreRounding) {
  std::vector<float> x;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 997)
    x.push_back(std::bit_cast<float>(uint32_t(u)));
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(f16{uint16_t(h)});
    uint32_t b = std::bit_cast<uint32_t>(f);
    for (int d = -2; d <= 2; ++d) x.push_back(std::bit_cast<float>(b + 0x1000u + uint32_t(d)));
    uint32_t bb = uint32_t(h) << 16;
    for (int d = -2; d <= 2; ++d) x.push_back(std::bit_cast<float>(bb + 0x8000u + uint32_t(d)));
  }
  for (float s : {65504.0f, 65519.99f, 65520.0f, 1e9f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f}) {
    x.push_back(s);
    x.push_back(-s);
  }
  std::vector<f16> h(x.size());
  std::vector<bf16> b(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) h[i] = store<f16>(x[i]);
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) b[i] = store<bf16>(x[i]);
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    bad += h[i].bits != f32_to_f16(x[i]).bits;
    bad += b[i].bits != f32_to_bf16(x[i]).bits;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Vec, ExpApproxIsAccurate) {
  std::vector<float> x;
  for (float v = -87.0f; v < 88.0f; v += 0.00731f) x.push_back(v);
  std::vector<float> y(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) y[i] = exp_approx(x[i]);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = std::exp(double(x[i]));
    worst = std::max(worst, std::fabs(y[i] - ref) / ref);
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_EQ(exp_approx(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_approx(-100.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(exp_approx(100.0f), 1e38f);
}

}  // namespace
}  // namespace strata::kernels
