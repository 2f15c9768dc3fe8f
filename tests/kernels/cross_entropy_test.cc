#include "strata/kernels/cpu/cross_entropy.h"

#include <gtest/gtest.h>

#include <limits>

#include "kernel_test_util.h"
#include "strata/core/check.h"

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
