#include "strata/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// Rows of a fused qkv buffer: q (NH heads) then k (KVH heads) then v, rope on q and on k.
constexpr int B = 2, T = 7, NH = 3, KVH = 2, hd = 8;
constexpr int64_t kRow = (NH + 2 * KVH) * hd;
constexpr float kTheta = 10000.0f;

// Hugging Face Llama rotate_half, in double.
std::vector<double> reference(const std::vector<float>& x, int64_t col0, int nheads) {
  std::vector<double> out(x.begin(), x.end());
  int half = hd / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < nheads; ++h)
        for (int i = 0; i < half; ++i) {
          double angle = t * std::pow(double(kTheta), -2.0 * i / hd);
          int64_t lo = (int64_t(b) * T + t) * kRow + col0 + int64_t(h) * hd + i, hi = lo + half;
          out[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
          out[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
        }
  return out;
}

template <typename S>
void apply(std::vector<S>& x) {
  rope_forward(x.data(), B, T, NH, hd, kRow, kTheta);
  rope_forward(x.data() + NH * hd, B, T, KVH, hd, kRow, kTheta);
}

TEST(Rope, ForwardAgainstReference) {
  auto x = test::randn(B * T * kRow, "x");
  auto ref = reference(x, 0, NH);
  std::vector<float> ref_f(ref.begin(), ref.end());
  ref = reference(ref_f, NH * hd, KVH);
  auto out = x;
  apply(out);
  // Angles up to T in fp32: cos/sin of an argument with relative error 2^-24 → ~1e-6.
  EXPECT_LT(rel_err(out, ref), 2e-6);
  // v columns are untouched.
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t c = (NH + KVH) * hd; c < kRow; ++c) EXPECT_EQ(out[r * kRow + c], x[r * kRow + c]);
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
  rope_backward(dx.data(), B, T, NH, hd, kRow, kTheta);
  rope_backward(dx.data() + NH * hd, B, T, KVH, hd, kRow, kTheta);
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
