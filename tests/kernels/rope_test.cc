#include "strata/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// Rows of a fused qkv buffer in the grouped layout: per kv group, rep query heads, the key head,
// the value head. Rope rotates the first rep + 1 heads of every group.
constexpr int B = 2, T = 7, KVH = 2, rep = 2, hd = 8;
constexpr int64_t kGroup = (rep + 2) * hd, kRow = KVH * kGroup;
constexpr float kTheta = 10000.0f;
const ops::Rope kDefault = ops::rope_default(hd, kTheta);

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
  rope_forward(x.data(), B, T, KVH, rep + 1, hd, kGroup, kRow, kDefault.inv_freq,
               kDefault.rotary_dim, kDefault.attention_factor);
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
  rope_backward(dx.data(), B, T, KVH, rep + 1, hd, kGroup, kRow, kDefault.inv_freq,
                kDefault.rotary_dim, kDefault.attention_factor);
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

// rope_default is Hugging Face's unscaled table over all of hd, in fp32: 1 / theta^(2i/hd).
TEST(Rope, DefaultTableIsThetaPowersInFp32) {
  const ops::Rope r = ops::rope_default(128, 500000.0f);
  EXPECT_EQ(r.rotary_dim, 128);
  EXPECT_EQ(r.attention_factor, 1.0f);
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(r.inv_freq[i], 1.0f / std::pow(500000.0f, float(2 * i) / 128.0f)) << i;
  }
  EXPECT_THROW(ops::rope_default(7, kTheta), Error);
}

// A table of the model's (here linear scaling by 4 of a base 500000 table), partial rotary
// (rotary_dim 8 of hd 12, Phi-3's kind), yarn's attention factor and context parallelism's
// positions, through the interface, against rotate_half in double.
struct TableCase {
  static constexpr int B = 2, T = 5, groups = 2, rep = 2, hd = 12, rd = 8;
  static constexpr int64_t row = int64_t(groups) * (rep + 2) * hd;
  std::vector<int32_t> pos = {3, 4, 17, 18, 40};
  ops::Rope rope;
  ops::AttentionShape s{B, T, groups, rep, hd};
  TableCase() {
    rope.rotary_dim = rd;
    rope.attention_factor = 1.25f;
    for (int i = 0; i < rd / 2; ++i) {
      rope.inv_freq[i] = 0.25f / std::pow(500000.0f, float(2 * i) / float(rd));
    }
    s.pos = pos.data();
  }
  Tensor view(std::vector<float>& v) const { return Tensor(v.data(), DType::F32, {B * T, row}); }
  std::vector<double> reference(const std::vector<float>& x) const {
    std::vector<double> out(x.begin(), x.end());
    for (int n = 0; n < B * T; ++n)
      for (int g = 0; g < groups; ++g)
        for (int h = 0; h <= rep; ++h)  // the queries and the key
          for (int i = 0; i < rd / 2; ++i) {
            const double angle = double(pos[n % T]) * double(rope.inv_freq[i]);
            const double c = std::cos(angle) * rope.attention_factor,
                         sn = std::sin(angle) * rope.attention_factor;
            const int64_t lo = n * row + (int64_t(g) * (rep + 2) + h) * hd + i, hi = lo + rd / 2;
            out[lo] = x[lo] * c - x[hi] * sn;
            out[hi] = x[hi] * c + x[lo] * sn;
          }
    return out;
  }
};

TEST(Rope, TablePartialRotaryFactorAndPositions) {
  TableCase k;
  auto x = test::randn(size_t(k.B) * k.T * k.row, "x");
  auto y = x;
  ops::rope_forward(k.view(y), k.s, k.rope);
  const auto ref = k.reference(x);
  EXPECT_LT(rel_err(y, ref), 4e-6);
  // Past rotary_dim and in the value heads nothing moves.
  for (int64_t n = 0; n < k.B * k.T; ++n)
    for (int64_t c = 0; c < k.row; ++c) {
      const int head = int(c / k.hd) % (k.rep + 2), d = int(c % k.hd);
      if (head == k.rep + 1 || d >= k.rd) {
        ASSERT_EQ(y[n * k.row + c], x[n * k.row + c]) << "row " << n << " column " << c;
      }
    }
}

// The backward is the transpose of the forward (not its inverse where attention_factor != 1).
TEST(Rope, TableBackwardMatchesFiniteDifferences) {
  TableCase k;
  auto x = test::randn(size_t(k.B) * k.T * k.row, "x"), w = test::randn(x.size(), "w");
  std::vector<float> out;
  auto loss = [&] {
    out = x;
    ops::rope_forward(k.view(out), k.s, k.rope);
    return test::weighted_sum(w, out.data(), out.size());
  };
  auto dx = w;
  ops::rope_backward(k.view(dx), k.s, k.rope);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-2f)), 1e-3);
}

TEST(Rope, TableRefusesABadRotaryDim) {
  TableCase k;
  auto x = test::randn(size_t(k.B) * k.T * k.row, "x");
  k.rope.rotary_dim = 14;  // more than hd
  EXPECT_THROW(ops::rope_forward(k.view(x), k.s, k.rope), Error);
  k.rope.rotary_dim = 7;  // odd
  EXPECT_THROW(ops::rope_forward(k.view(x), k.s, k.rope), Error);
}

}  // namespace
}  // namespace strata::kernels
