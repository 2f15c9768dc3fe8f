// Gemma 2's final-logit soft cap through the kernel interface (ops.h): softcap_inplace against
// cap·tanh(x/cap) in double, and the cross-entropy of the capped logits, whose dlogits
// (cross_entropy_stats, then ce_dlogits with the cap) are the gradient w.r.t. the logits before
// the cap: against central differences of that loss in double, in place, by column ranges and
// over two vocabulary shards. Without a cap ce_dlogits keeps its formula bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/vec.h"
#include "strata/kernels/ops.h"

namespace strata::ops {
namespace {

using test::rel_err;

using test::tokens;
using test::view;

constexpr float kCap = 30.0f;

// Logits spread over the cap's whole range: linear near 0, saturated past it.
std::vector<float> wide_logits(size_t n) {
  return test::randn(n, "raw logits", 25.0f);
}

template <typename S>
void check_softcap(double tol) {
  auto x = wide_logits(1003);
  x[0] = 0.0f, x[1] = 1e-20f, x[2] = -3e-4f, x[3] = 0.6f, x[4] = -0.65f, x[5] = 1e4f;
  x = test::rounded<S>(x);
  auto t = test::to_dtype<S>(x);
  softcap_inplace(view(t, {int64_t(t.size())}), kCap);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = kCap * std::tanh(double(x[i]) / kCap);
    ASSERT_LE(std::fabs(test::as_double(t[i]) - want), tol * std::fabs(want))
        << "x=" << x[i] << " at " << i;
  }
}

// fp32 to a few ulps relative (small inputs included, where tanh must not cancel); half
// precision within one rounding.
TEST(Softcap, AgainstDoubleReference) {
  check_softcap<float>(1e-6);
  check_softcap<bf16>(0x1p-8);
  check_softcap<f16>(0x1p-11);
}

TEST(Softcap, SaturatesInfinitiesAndKeepsNaN) {
  std::vector<float> t = {std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  softcap_inplace(view(t, {3}), kCap);
  EXPECT_EQ(t[0], kCap);
  EXPECT_EQ(t[1], -kCap);
  EXPECT_TRUE(std::isnan(t[2]));
}

TEST(Softcap, RefusesACapThatIsNotPositive) {
  std::vector<float> t(4, 1.0f);
  for (float cap : {0.0f, -30.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    EXPECT_THROW(softcap_inplace(view(t, {4}), cap), Error) << cap;
  }
  std::vector<float> stats = {0.0f, 1.0f, 0.0f};
  std::vector<int32_t> tgt = {1};
  EXPECT_THROW(ce_dlogits(view(t, {1, 4}), 4, view(t, {1, 4}), tokens(tgt), view(stats, {3, 1}), 0,
                          4, 0, 4, 1.0f, -1.0f),
               Error);
  EXPECT_EQ(t, std::vector<float>(4, 1.0f));
}

TEST(Softcap, DryRunTouchesNothing) {
  std::vector<float> t = {50.0f, -2.0f, 0.5f}, stats = {0.0f, 1.0f, 0.0f};
  std::vector<int32_t> tgt = {1};
  const auto before = t;
  DryRun dry;
  softcap_inplace(view(t, {3}), kCap);
  softcap_inplace(view(t, {3}), 0.0f);  // not even checked
  ce_dlogits(view(t, {1, 3}), 3, view(t, {1, 3}), tokens(tgt), view(stats, {3, 1}), 0, 3, 0, 3,
             1.0f, kCap);
  EXPECT_TRUE(test::bit_equal(t, before));
}

// --- the capped cross-entropy's gradient
// ----------------------------------------------------------

constexpr int64_t N = 5, V = 37;

std::vector<int32_t> ce_targets() {
  auto t = test::randint(N, "capped targets", int(V));
  t[1] = -1;  // ignored
  t[3] = int32_t(V - 1);
  return t;
}

// Σ_n dloss · CE(cap·tanh(z_n/cap), target_n) over rows z (N, V), in double.
double capped_loss(const std::vector<double>& z, const std::vector<int32_t>& tgt, double dloss) {
  double total = 0.0;
  std::vector<double> c(V);
  for (int64_t n = 0; n < N; ++n) {
    if (tgt[n] < 0) continue;
    for (int64_t j = 0; j < V; ++j) c[j] = kCap * std::tanh(z[n * V + j] / kCap);
    const double mx = *std::max_element(c.begin(), c.end());
    double sum = 0.0;
    for (double v : c) sum += std::exp(v - mx);
    total += dloss * (std::log(sum) + mx - c[tgt[n]]);
  }
  return total;
}

// Central differences of capped_loss w.r.t. every raw logit, in double (eps 1e-4: the error is
// far below fp32's).
std::vector<double> numeric_dlogits(const std::vector<float>& raw, const std::vector<int32_t>& tgt,
                                    double dloss) {
  std::vector<double> z(raw.begin(), raw.end()), g(z.size());
  const double eps = 1e-4;
  for (size_t i = 0; i < z.size(); ++i) {
    const double saved = z[i];
    z[i] = saved + eps;
    const double lp = capped_loss(z, tgt, dloss);
    z[i] = saved - eps;
    const double lm = capped_loss(z, tgt, dloss);
    z[i] = saved;
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

struct Capped {
  std::vector<float> raw;
  std::vector<int32_t> tgt;
  std::vector<double> want, want_losses;
  float dloss = 0.375f;
  Capped() : raw(wide_logits(N * V)), tgt(ce_targets()) {
    want = numeric_dlogits(raw, tgt, dloss);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<int32_t> one(N, -1);
      one[n] = tgt[n];
      want_losses.push_back(capped_loss(std::vector<double>(raw.begin(), raw.end()), one, 1.0));
    }
  }
};

TEST(SoftcapCrossEntropy, InPlaceDlogitsAreTheRawLogitsGradient) {
  Capped c;
  auto logits = c.raw;
  std::vector<float> losses(N), stats(3 * N);
  softcap_inplace(view(logits, {N, V}), kCap);
  cross_entropy_stats(view(losses, {N}), view(stats, {3, N}), view(logits, {N, V}), tokens(c.tgt));
  EXPECT_LT(rel_err(losses, c.want_losses), 1e-6);
  ce_dlogits(view(logits, {N, V}), V, view(logits, {N, V}), tokens(c.tgt), view(stats, {3, N}), 0,
             V, 0, V, c.dloss, kCap);
  EXPECT_LT(rel_err(logits, c.want), 1e-5);
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(logits[1 * V + j], 0.0f) << "ignored row";
}

// Columns [c0, c0 + cols) into fp32 rows of a wider stride, and in place over the logits in
// ranges of 10, each range reading logits the earlier ones left untouched.
TEST(SoftcapCrossEntropy, ColumnRangesInPlaceAndIntoFp32) {
  Capped c;
  auto logits = c.raw;
  std::vector<float> losses(N), stats(3 * N);
  softcap_inplace(view(logits, {N, V}), kCap);
  cross_entropy_stats(view(losses, {N}), view(stats, {3, N}), view(logits, {N, V}), tokens(c.tgt));
  const int64_t c0 = 11, cols = 19, ldo = cols + 2;
  std::vector<float> part(N * ldo, 7.0f);
  ce_dlogits(view(part, {N, ldo}), ldo, view(logits, {N, V}), tokens(c.tgt), view(stats, {3, N}),
             c0, cols, 0, V, c.dloss, kCap);
  std::vector<float> got;
  std::vector<double> want;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < cols; ++j) {
      got.push_back(part[n * ldo + j]);
      want.push_back(c.want[n * V + c0 + j]);
    }
    for (int64_t j = cols; j < ldo && n + 1 < N; ++j) EXPECT_EQ(part[n * ldo + j], 7.0f);
  }
  EXPECT_LT(rel_err(got, want), 1e-5);
  for (int64_t r0 = 0; r0 < V; r0 += 10) {
    const int64_t n = std::min<int64_t>(10, V - r0);
    const Tensor columns(logits.data() + r0, DType::F32, {(N - 1) * V + n});
    ce_dlogits(columns, V, view(logits, {N, V}), tokens(c.tgt), view(stats, {3, N}), r0, n, 0, V,
               c.dloss, kCap);
  }
  EXPECT_LT(rel_err(logits, c.want), 1e-5);
}

// Two shards of 20 columns, the second with 3 padding columns (1e4 before the cap, never
// counted, dlogits 0): the vocab_ce_* steps on the capped shards, reductions done as ranks would.
TEST(SoftcapCrossEntropy, VocabularyParallelHalves) {
  Capped c;
  const int64_t Vl = 20;
  auto valid = [&](int k) { return std::min<int64_t>(V - k * Vl, Vl); };
  std::vector<std::vector<float>> shard(2, std::vector<float>(N * Vl, 1e4f));
  for (int k = 0; k < 2; ++k) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < valid(k); ++j) shard[k][n * Vl + j] = c.raw[n * V + k * Vl + j];
    softcap_inplace(view(shard[k], {N, Vl}), kCap);
  }
  std::vector<float> maxima(2 * N), stats(3 * N, 0.0f), part(2 * N), losses(N);
  for (int k = 0; k < 2; ++k) {
    vocab_ce_max(Tensor(maxima.data() + k * N, DType::F32, {N}), view(shard[k], {N, Vl}), valid(k));
  }
  const Tensor gmax(stats.data(), DType::F32, {N}), sums(stats.data() + N, DType::F32, {2, N});
  max_rows(gmax, view(maxima, {2, N}));
  for (int k = 0; k < 2; ++k) {
    vocab_ce_sums(view(part, {2, N}), view(shard[k], {N, Vl}), tokens(c.tgt), gmax, k * Vl,
                  valid(k));
    for (int64_t i = 0; i < 2 * N; ++i) stats[N + i] += part[i];
  }
  vocab_ce_finish(view(losses, {N}), tokens(c.tgt), gmax, sums);
  EXPECT_LT(rel_err(losses, c.want_losses), 1e-6);
  std::vector<float> got(N * V);
  for (int k = 0; k < 2; ++k) {
    ce_dlogits(view(shard[k], {N, Vl}), Vl, view(shard[k], {N, Vl}), tokens(c.tgt),
               view(stats, {3, N}), 0, Vl, k * Vl, valid(k), c.dloss, kCap);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vl; ++j) {
        if (j < valid(k)) {
          got[n * V + k * Vl + j] = shard[k][n * Vl + j];
        } else {
          EXPECT_EQ(shard[k][n * Vl + j], 0.0f) << "padding column " << j << " row " << n;
        }
      }
  }
  EXPECT_LT(rel_err(got, c.want), 1e-5);
}

// Without a cap, ce_dlogits is the formula it always was, bit for bit: exp(x − max)·(dloss/sum)
// and (exp(xt − max)/sum − 1)·dloss at the target, rounded once to S; −inf logits give 0.
template <typename S>
void check_uncapped_bits() {
  auto raw = test::randn(N * V, "uncapped", 3.0f);
  auto tgt = ce_targets();
  const int64_t masked = 2 * V + (tgt[2] == 4 ? 5 : 4);  // a −inf logit, not the target
  raw[masked] = -std::numeric_limits<float>::infinity();
  auto logits = test::to_dtype<S>(raw);
  std::vector<float> losses(N), stats(3 * N);
  cross_entropy_stats(view(losses, {N}), view(stats, {3, N}), view(logits, {N, V}), tokens(tgt));
  const float dloss = 0.375f;
  std::vector<S> want(N * V);
  for (int64_t n = 0; n < N; ++n) {
    const float mx = stats[n], sum = stats[N + n], scale = dloss / sum;
    for (int64_t j = 0; j < V; ++j) {
      const float z = kernels::load(logits[n * V + j]);
      const float d = tgt[n] < 0    ? 0.0f
                      : j == tgt[n] ? (kernels::exp_approx(z - mx) / sum - 1.0f) * dloss
                                    : kernels::exp_approx(z - mx) * scale;
      want[n * V + j] = kernels::store<S>(d);
    }
  }
  auto explicit_zero = logits;
  ce_dlogits(view(logits, {N, V}), V, view(logits, {N, V}), tokens(tgt), view(stats, {3, N}), 0, V,
             0, V, dloss);
  ce_dlogits(view(explicit_zero, {N, V}), V, view(explicit_zero, {N, V}), tokens(tgt),
             view(stats, {3, N}), 0, V, 0, V, dloss, 0.0f);
  EXPECT_TRUE(test::bit_equal(logits, want));
  EXPECT_TRUE(test::bit_equal(explicit_zero, want));
  EXPECT_EQ(kernels::load(logits[masked]), 0.0f);
}

TEST(SoftcapCrossEntropy, NoCapKeepsTheDlogitsBitForBit) {
  check_uncapped_bits<float>();
  check_uncapped_bits<bf16>();
}

}  // namespace
}  // namespace strata::ops
