#include "strata/kernels/cpu/cross_entropy.h"

#include <gtest/gtest.h>

#include <limits>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {
namespace {

using test::rel_err;

constexpr int N = 6, V = 53;

// Row n's loss −log softmax(x)[t] and its gradient (softmax − onehot)·dloss, in double.
void reference(const std::vector<float>& x, const std::vector<int32_t>& tgt, float dloss,
               std::vector<double>& loss, std::vector<double>& grad) {
  loss.assign(N, 0.0);
  grad.assign(size_t(N) * V, 0.0);
  for (int n = 0; n < N; ++n) {
    if (tgt[n] < 0) continue;
    const float* r = &x[size_t(n) * V];
    double mx = *std::max_element(r, r + V), sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(r[j]) - mx);
    loss[n] = std::log(sum) + mx - r[tgt[n]];
    for (int j = 0; j < V; ++j)
      grad[size_t(n) * V + j] = (std::exp(double(r[j]) - mx) / sum - (j == tgt[n])) * dloss;
  }
}

std::vector<int32_t> targets() {
  auto t = test::randint(N, "tgt", V);
  t[2] = -1;  // ignored row
  t[4] = -100;
  return t;
}

TEST(CrossEntropy, AgainstReference) {
  auto x = test::randn(N * V, "logits", 3.0f);
  for (int j = 0; j < V; ++j) x[3 * V + j] += 80.0f;  // large logits: max-subtraction needed
  auto tgt = targets();
  const float dloss = 0.25f;
  std::vector<double> rloss, rgrad;
  reference(x, tgt, dloss, rloss, rgrad);
  std::vector<float> loss(N, -1.0f), eval_loss(N, -1.0f);
  cross_entropy_forward(eval_loss.data(), x.data(), tgt.data(), N, V);
  auto logits = x;
  cross_entropy_forward_backward(loss.data(), logits.data(), tgt.data(), N, V, dloss);
  EXPECT_LT(rel_err(loss, rloss), 1e-6);
  EXPECT_EQ(loss, eval_loss);
  EXPECT_LT(rel_err(logits, rgrad), 1e-6);
  EXPECT_EQ(loss[2], 0.0f);
  EXPECT_EQ(loss[4], 0.0f);
  for (int j = 0; j < V; ++j) EXPECT_EQ(logits[2 * V + j], 0.0f);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  auto x = test::randn(N * V, "logits", 2.0f);
  auto tgt = targets();
  const float dloss = 0.7f;
  std::vector<float> loss(N);
  auto total = [&] {
    cross_entropy_forward(loss.data(), x.data(), tgt.data(), N, V);
    double s = 0.0;
    for (float l : loss) s += double(l) * dloss;
    return s;
  };
  auto grad = x;
  cross_entropy_forward_backward(loss.data(), grad.data(), tgt.data(), N, V, dloss);
  EXPECT_LT(rel_err(grad, test::numeric_grad(x, total, 1e-3f)), 1e-2);
}

// bf16/fp16 logits: the loss is fp32 from the rounded logits, so it matches the reference to
// fp32 accuracy; the gradient is rounded once to S: 2u (u = 2^-8 bf16, 2^-11 fp16).
template <typename S>
void check_half(double u) {
  auto x = test::rounded<S>(test::randn(N * V, "logits", 3.0f));
  auto tgt = targets();
  std::vector<double> rloss, rgrad;
  reference(x, tgt, 1.0f, rloss, rgrad);
  auto t = test::to_dtype<S>(x);
  std::vector<float> loss(N);
  cross_entropy_forward_backward(loss.data(), t.data(), tgt.data(), N, V, 1.0f);
  EXPECT_LT(rel_err(loss, rloss), 1e-6);
  EXPECT_LT(rel_err(t, rgrad), 2 * u);
}

TEST(CrossEntropy, HalfAgainstReference) {
  check_half<bf16>(0x1p-8);
  check_half<f16>(0x1p-11);
}

TEST(CrossEntropy, NonFiniteLogitsGiveNonFiniteLoss) {
  auto x = test::randn(N * V, "logits");
  x[5] = std::numeric_limits<float>::infinity();
  x[V + 7] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> tgt(N, 1);
  std::vector<float> loss(N);
  cross_entropy_forward_backward(loss.data(), x.data(), tgt.data(), N, V, 1.0f);
  EXPECT_FALSE(std::isfinite(loss[0]));
  EXPECT_FALSE(std::isfinite(loss[1]));
  EXPECT_TRUE(std::isfinite(loss[2]));
}

TEST(CrossEntropy, RejectsTargetOutsideVocabulary) {
  auto x = test::randn(N * V, "logits");
  std::vector<int32_t> tgt(N, 0);
  tgt[3] = V;
  std::vector<float> loss(N);
  EXPECT_THROW(cross_entropy_forward(loss.data(), x.data(), tgt.data(), N, V), Error);
}

}  // namespace
}  // namespace strata::kernels

namespace strata::kernels {
namespace {

// The backward's dlogits a vocabulary unit at a time (ce_dlogits from cross_entropy_stats):
// in place in bf16, and into fp32 (what products that run in fp32 read), equal the whole row's
// in-place forward_backward bit for bit, in every column range, padding and ignored rows included.
TEST(CrossEntropy, DlogitsByColumnRangesEqualTheWholeRows) {
  const auto x = test::randn(N * V, "logits", 3.0f);
  std::vector<bf16> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = store<bf16>(x[i]);
  const auto tgt = targets();
  const float dloss = 0.125f;
  std::vector<float> whole_loss(N), loss(N), stats(3 * N);
  auto whole = h;
  cross_entropy_forward_backward(whole_loss.data(), whole.data(), tgt.data(), N, V, dloss);
  cross_entropy_stats(loss.data(), stats.data(), h.data(), tgt.data(), N, V);
  EXPECT_EQ(loss, whole_loss);
  for (const int64_t chunk : {int64_t(V), int64_t(16), int64_t(7)}) {
    auto in_place = h;
    std::vector<float> wide(size_t(N) * V, -1.0f);
    for (int64_t c0 = 0; c0 < V; c0 += chunk) {
      const int64_t cols = std::min<int64_t>(chunk, V - c0);
      std::vector<float> part(size_t(N) * cols);
      ce_dlogits(part.data(), cols, h.data(), tgt.data(), stats.data(), N, V, c0, cols, 0, V, dloss,
                 0.0f);
      for (int n = 0; n < N; ++n) {
        std::copy_n(&part[size_t(n) * cols], cols, &wide[size_t(n) * V + c0]);
      }
      // In place over the columns, later ranges reading logits earlier ones left untouched.
      ce_dlogits(in_place.data() + c0, V, in_place.data(), tgt.data(), stats.data(), N, V, c0, cols,
                 0, V, dloss, 0.0f);
    }
    for (size_t i = 0; i < h.size(); ++i) {
      ASSERT_EQ(in_place[i].bits, whole[i].bits) << "chunk " << chunk << ", element " << i;
      ASSERT_EQ(wide[i], load(whole[i])) << "chunk " << chunk << ", element " << i;
    }
  }
  // Vocabulary-parallel columns: a shard [v0, v0 + 20) of which 13 are real, targets global.
  std::vector<float> shard(size_t(N) * 20);
  ce_dlogits(shard.data(), 20, h.data(), tgt.data(), stats.data(), N, V, 0, 20, 40, 13, dloss,
             0.0f);
  for (int n = 0; n < N; ++n) {
    for (int j = 13; j < 20; ++j) EXPECT_EQ(shard[size_t(n) * 20 + j], 0.0f) << "padding";
  }
}

}  // namespace
}  // namespace strata::kernels
