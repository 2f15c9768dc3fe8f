#include "strata/kernels/cpu/optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <limits>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

constexpr size_t kN = 1000;
constexpr int kSteps = 5;

// Gradients of step 1..kSteps: fresh ones every step.
std::vector<float> step_grad(int step) {
  auto all = test::randn(kN * kSteps, "g");
  return std::vector<float>(all.begin() + (step - 1) * kN, all.begin() + step * kN);
}

// a − a0 elementwise, in double.
template <typename V>
std::vector<double> delta(const std::vector<V>& a, const std::vector<float>& a0) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = double(a[i]) - double(a0[i]);
  return d;
}

struct AdamHyper {
  float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
  bool adamw = true;
};

// torch.optim.AdamW / torch.optim.Adam(weight_decay) for one element, in double.
void adam_reference(double& p, double& m, double& v, double grad, const AdamHyper& h, int step) {
  double g = grad * h.grad_scale;
  if (h.adamw) {
    p *= 1.0 - double(h.lr) * h.wd;
  } else {
    g += double(h.wd) * p;
  }
  m = h.beta1 * m + (1.0 - h.beta1) * g;
  v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  double bc1 = 1.0 - std::pow(double(h.beta1), step), bc2 = 1.0 - std::pow(double(h.beta2), step);
  p -= h.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
}

// kSteps steps with fresh gradients each step: master, m and v against the reference, and
// param == round(master) to S.
template <typename S, typename G>
void check_adam(const AdamHyper& h, bool alias) {
  auto p0 = test::randn(kN, "p");
  std::vector<float> master = p0, m(kN, 0.0f), v(kN, 0.0f);
  std::vector<S> param = test::to_dtype<S>(p0);
  std::vector<double> rp(p0.begin(), p0.end()), rm(kN, 0.0), rv(kN, 0.0);
  for (int step = 1; step <= kSteps; ++step) {
    auto grad = test::rounded<G>(step_grad(step));
    auto tg = test::to_dtype<G>(grad);
    S* out = alias ? reinterpret_cast<S*>(master.data()) : param.data();
    adam_step(master.data(), out, tg.data(), m.data(), v.data(), kN, h.lr, h.beta1, h.beta2, h.eps,
              h.wd, h.grad_scale, step, h.adamw);
    for (size_t i = 0; i < kN; ++i) adam_reference(rp[i], rm[i], rv[i], grad[i], h, step);
  }
  // fp32 arithmetic over a few steps against double. The total update (about 5·lr) is compared,
  // not the parameter, so an error in it is not hidden by the parameter's size: its fp32
  // subtraction from p0 (|p0| ≲ 4) costs up to 2^-22 absolute, about 1e-5 relative.
  EXPECT_LT(rel_err(delta(master, p0), delta(rp, p0)), 1e-4);
  EXPECT_LT(rel_err(m, rm), 1e-6);
  EXPECT_LT(rel_err(v, rv), 1e-6);
  if (!alias) {
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_EQ(std::memcmp(&param[i], &test::to_dtype<S>({master[i]})[0], sizeof(S)), 0);
    }
  }
}

TEST(AdamStep, AdamWMatchesTorchFormulas) {
  AdamHyper h;
  check_adam<float, float>(h, /*alias=*/true);
  check_adam<float, float>(h, false);
  check_adam<bf16, float>(h, false);
  check_adam<bf16, bf16>(h, false);
  check_adam<f16, float>(h, false);
  check_adam<f16, f16>(h, false);
}

TEST(AdamStep, AdamL2MatchesTorchFormulas) {
  AdamHyper h;
  h.adamw = false;
  h.wd = 0.05f;
  check_adam<float, float>(h, true);
  check_adam<bf16, float>(h, false);
}

struct SgdHyper {
  float lr = 0.1f, momentum = 0.9f, wd = 0.01f, grad_scale = 2.0f;
  bool nesterov = false;
};

// torch.optim.SGD (dampening 0) for one element, in double.
void sgd_reference(double& p, double& buf, double grad, const SgdHyper& h, int step) {
  double g = grad * h.grad_scale + double(h.wd) * p;
  if (h.momentum != 0.0f) {
    buf = step == 1 ? g : h.momentum * buf + g;
    g = h.nesterov ? g + h.momentum * buf : buf;
  }
  p -= h.lr * g;
}

template <typename S, typename G>
void check_sgd(const SgdHyper& h) {
  auto p0 = test::randn(kN, "p");
  // torch starts the buffer from the first gradient: its old contents must not matter.
  std::vector<float> master = p0, buf(kN, std::numeric_limits<float>::quiet_NaN());
  float* b = h.momentum != 0.0f ? buf.data() : nullptr;  // unused (may be null) without momentum
  std::vector<S> param = test::to_dtype<S>(p0);
  std::vector<double> rp(p0.begin(), p0.end()), rbuf(kN, 0.0);
  for (int step = 1; step <= kSteps; ++step) {
    auto grad = test::rounded<G>(step_grad(step));
    auto tg = test::to_dtype<G>(grad);
    sgd_step(master.data(), param.data(), tg.data(), b, kN, h.lr, h.momentum, h.wd, h.nesterov,
             h.grad_scale, step);
    for (size_t i = 0; i < kN; ++i) sgd_reference(rp[i], rbuf[i], grad[i], h, step);
  }
  EXPECT_LT(rel_err(delta(master, p0), delta(rp, p0)), 1e-5);
  EXPECT_EQ(test::to_float(param), test::to_float(test::to_dtype<S>(master)));
}

TEST(SgdStep, MatchesTorchFormulas) {
  SgdHyper h;
  check_sgd<float, float>(h);
  check_sgd<bf16, bf16>(h);
  check_sgd<f16, float>(h);
  h.nesterov = true;
  check_sgd<float, float>(h);
  h.momentum = 0.0f;
  h.nesterov = false;
  check_sgd<float, float>(h);
}

template <typename G>
void check_sum_squares(size_t n) {
  auto g = test::rounded<G>(test::randn(n, "g"));
  auto tg = test::to_dtype<G>(g);
  double ref = 0.0;
  for (float x : g) ref += double(x) * x;
  EXPECT_NEAR(sum_squares(tg.data(), n), ref, 1e-12 * ref) << "n=" << n;
}

TEST(SumSquares, AgainstReference) {
  for (size_t n :
       {size_t(0), size_t(1), size_t(5), size_t(63), size_t(64), size_t(1000), size_t(100003)}) {
    check_sum_squares<float>(n);
    check_sum_squares<bf16>(n);
    check_sum_squares<f16>(n);
  }
}

TEST(SumSquares, PropagatesNonFinite) {
  auto g = test::randn(5000, "g");
  g[1234] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sum_squares(g.data(), g.size())));
  g[4000] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_squares(g.data(), g.size())));
}

TEST(SumSquares, DeterministicAcrossThreadCounts) {
  auto g = test::randn(1 << 18, "g");
  auto run = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    double s = sum_squares(g.data(), g.size());
    omp_set_num_threads(saved);
    return s;
  };
  uint64_t first = std::bit_cast<uint64_t>(run(2));
  EXPECT_EQ(first, std::bit_cast<uint64_t>(run(2)));
  EXPECT_EQ(first, std::bit_cast<uint64_t>(run(1)));
  EXPECT_EQ(first, std::bit_cast<uint64_t>(run(3)));
}

TEST(ScaleInplace, MultipliesEveryElement) {
  auto g = test::randn(777, "g");
  auto expect = g;
  for (float& x : expect) x *= 0.3f;
  scale_inplace(g.data(), g.size(), 0.3f);
  EXPECT_EQ(g, expect);
  auto hf = test::rounded<bf16>(test::randn(777, "g"));
  auto h = test::to_dtype<bf16>(hf);
  scale_inplace(h.data(), h.size(), 0.5f);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(to_f32(h[i]), 0.5f * hf[i]);  // exact
}

}  // namespace
}  // namespace strata::kernels
