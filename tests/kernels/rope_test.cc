#include "strata/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// Rows of a fused qkv buffer in the grouped layout: per kv group, rep query heads, the key head,
// the value head. Rope rotates the first rep + 1 heads of every group.
constexpr int B = 2, T = 7, KVH = 2, rep = 2, hd = 8;
constexpr int64_t kGroup = (rep + 2) * hd, kRow = KVH * kGroup;
constexpr float kTheta = 10000.0f;

// Hugging Face Llama rotate_half, in double, on the query and key heads of every group.
std::vector<double> reference(const std::vector<float>& x) {
  std::vector<double> out(x.begin(), x.end());
  int half = hd / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int g = 0; g < KVH; ++g)
        for (int h = 0; h <= rep; ++h)
          for (int i = 0; i < half; ++i) {
            double angle = t * std::pow(double(kTheta), -2.0 * i / hd);
            int64_t lo = (int64_t(b) * T + t) * kRow + g * kGroup + int64_t(h) * hd + i;
            int64_t hi = lo + half;
            out[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
            out[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
          }
  return out;
}

template <typename S>
void apply(std::vector<S>& x) {
  rope_forward(x.data(), B, T, KVH, rep + 1, hd, kGroup, kRow, kTheta);
}

TEST(Rope, ForwardAgainstReference) {
  auto x = test::randn(B * T * kRow, "x");
  auto ref = reference(x);
  auto out = x;
  apply(out);
  // Angles up to T in fp32: cos/sin of an argument with relative error 2^-24 → ~1e-6.
  EXPECT_LT(rel_err(out, ref), 2e-6);
  // Every group's value head is untouched.
  for (int64_t r = 0; r < B * T; ++r)
    for (int g = 0; g < KVH; ++g)
      for (int64_t c = g * kGroup + (rep + 1) * hd; c < (g + 1) * kGroup; ++c)
        EXPECT_EQ(out[r * kRow + c], x[r * kRow + c]);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  auto x = test::randn(B * T * kRow, "x"), w = test::randn(B * T * kRow, "w");
  std::vector<float> out;
  auto loss = [&] {
    out = x;
    apply(out);
    return test::weighted_sum(w, out.data(), out.size());
  };
  auto dx = w;
  rope_backward(dx.data(), B, T, KVH, rep + 1, hd, kGroup, kRow, kTheta);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-2f)), 1e-3);
}

TEST(Rope, HalfAgainstFp32) {
  auto x = test::randn(B * T * kRow, "x");
  auto expect_close = [&](auto zero, double u) {
    using S = decltype(zero);
    auto xs = test::rounded<S>(x);
    auto t = test::to_dtype<S>(xs);
    apply(t);
    apply(xs);
    // One rounding to S of each output: 2u (u = 2^-8 bf16, 2^-11 fp16) relative to the largest.
    EXPECT_LT(rel_err(t, xs), 2 * u);
  };
  expect_close(bf16{}, 0x1p-8);
  expect_close(f16{}, 0x1p-11);
}

}  // namespace
}  // namespace strata::kernels
