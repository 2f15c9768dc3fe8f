#include "strata/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strata {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors): counter words c0..c3 map to
// (counter_lo = c1:c0, counter_hi = c3:c2), key words k0, k1 to key = k1:k0.
TEST(Philox, MatchesRandom123KnownAnswers) {
  using A = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32(0, 0, 0), (A{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32(~0ull, ~0ull, ~0ull), (A{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull),
            (A{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Rng, SameKeyAndIndexGiveSameValue) {
  uint64_t k = rng_key(42, "layers.0.attn.qkv.weight");
  EXPECT_EQ(k, rng_key(42, "layers.0.attn.qkv.weight"));
  for (uint64_t i : {0ull, 1ull, 12345ull, 1ull << 40}) {
    EXPECT_EQ(rng_uniform(k, i), rng_uniform(k, i));
    EXPECT_EQ(rng_normal(k, i), rng_normal(k, i));
  }
}

TEST(Rng, DifferentNamesAndSeedsDiffer) {
  uint64_t a = rng_key(42, "wte"), b = rng_key(42, "wpe"), c = rng_key(43, "wte");
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  int same_ab = 0, same_ac = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_ab += rng_normal(a, i) == rng_normal(b, i);
    same_ac += rng_normal(a, i) == rng_normal(c, i);
  }
  EXPECT_LE(same_ab, 1);
  EXPECT_LE(same_ac, 1);
}

TEST(Rng, UniformIsInOpenUnitInterval) {
  uint64_t k = rng_key(7, "u");
  double sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    float u = rng_uniform(k, uint64_t(i));
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // σ of the mean ≈ 0.29/√n ≈ 0.0009
}

TEST(Rng, NormalHasUnitMomentsOver1e5Samples) {
  const uint64_t n = 100000;
  std::vector<float> x(n);
  rng_fill_normal(x.data(), rng_key(1, "normal"), 0, n, 0.0f, 1.0f);
  double mean = 0.0, sq = 0.0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) sq += (v - mean) * (v - mean);
  double std = std::sqrt(sq / n);
  // Within 1%: σ of the mean is 0.003, of the std 0.0022.
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std, 1.0, 0.01);
}

TEST(Rng, FillIsSliceable) {
  const uint64_t n = 50000, off = 12345;  // above fill's parallel threshold
  uint64_t k = rng_key(5, "w");
  std::vector<float> all(n + off), part(n);
  rng_fill_normal(all.data(), k, 0, n + off, 0.5f, 0.02f);
  rng_fill_normal(part.data(), k, off, n, 0.5f, 0.02f);
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(part[i], all[off + i]);
  EXPECT_EQ(all[3], 0.5f + 0.02f * rng_normal(k, 3));
}

}  // namespace
}  // namespace strata
