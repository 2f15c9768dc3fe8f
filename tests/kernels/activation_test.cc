#include "strata/kernels/cpu/activation.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// 0.5·x·(1 + tanh(u)) written as x / (1 + exp(−2u)): equal, and free of the cancellation of
// 1 + tanh(u) in the negative tail.
double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

double silu_ref(double x) {
  return x / (1.0 + std::exp(-x));
}

// Inputs over the range that matters, tails included (|x| up to ~12).
std::vector<float> act_input(size_t n) {
  return test::randn(n, "x", 3.0f);
}

TEST(Gelu, ForwardAgainstReference) {
  auto x = act_input(1000);
  x.push_back(0.0f);
  x.push_back(-30.0f);
  x.push_back(30.0f);
  std::vector<float> out(x.size());
  gelu_forward(out.data(), x.data(), x.size());
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = gelu_ref(x[i]);
  EXPECT_LT(rel_err(out, ref), 1e-6);
  // Elementwise too: tiny outputs in the negative tail keep their relative accuracy, up to the
  // fp32 rounding of u amplified by |2u| (≤ ~60 here) in exp; below 1e-30 (where fp32 exp
  // saturates) anything tiny is right.
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(out[i], ref[i], 2e-5 * std::fabs(ref[i]) + 1e-30);
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = act_input(300), w = test::randn(300, "w");
  std::vector<float> out(x.size());
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), x.size());
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dx(x.size());
  gelu_backward(dx.data(), x.data(), w.data(), x.size());
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
  // dinp may alias dout.
  auto d = w;
  gelu_backward(d.data(), x.data(), d.data(), d.size());
  EXPECT_EQ(d, dx);
}

TEST(SwiGlu, ForwardAgainstReference) {
  const int N = 7, F = 33;
  auto x = act_input(2 * N * F);
  std::vector<float> out(N * F);
  swiglu_forward(out.data(), x.data(), N, F);
  std::vector<double> ref(N * F);
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f)
      ref[n * F + f] = silu_ref(x[2 * (n * F + f)]) * double(x[2 * (n * F + f) + 1]);
  EXPECT_LT(rel_err(out, ref), 1e-6);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int N = 5, F = 24;
  auto x = act_input(2 * N * F), w = test::randn(N * F, "w");
  std::vector<float> out(N * F);
  auto loss = [&] {
    swiglu_forward(out.data(), x.data(), N, F);
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dx(2 * N * F, 123.0f);
  swiglu_backward(dx.data(), w.data(), x.data(), N, F);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
}

// GeGLU (Gemma's MLP): gelu_pytorch_tanh(gate) · up on the interleaved layout.
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(GeGlu, ForwardAgainstReference) {
  const int N = 7, F = 33;
  auto x = act_input(2 * N * F);
  std::vector<float> out(N * F);
  geglu_forward(out.data(), x.data(), N, F);
  std::vector<double> ref(N * F);
  for (int i = 0; i < N * F; ++i) ref[i] = gelu_tanh_ref(x[2 * i]) * double(x[2 * i + 1]);
  EXPECT_LT(rel_err(out, ref), 1e-6);
}

TEST(GeGlu, BackwardMatchesFiniteDifferences) {
  const int N = 5, F = 24;
  auto x = act_input(2 * N * F), w = test::randn(N * F, "w");
  std::vector<float> out(N * F);
  auto loss = [&] {
    geglu_forward(out.data(), x.data(), N, F);
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dx(2 * N * F, 123.0f);
  geglu_backward(dx.data(), w.data(), x.data(), N, F);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
}

// Outputs are rounded once to S: relative error <= u (2^-8 bf16, 2^-11 fp16) of each value, so
// 2u bounds the error relative to the largest value. Gradients likewise.
template <typename S>
void check_half(double u) {
  const int N = 6, F = 50;
  auto x = test::rounded<S>(act_input(2 * N * F)),
       dy = test::rounded<S>(test::randn(2 * N * F, "dy"));
  auto tx = test::to_dtype<S>(x), tdy = test::to_dtype<S>(dy);
  std::vector<S> out(2 * N * F), dx(2 * N * F);
  std::vector<float> fout(2 * N * F), fdx(2 * N * F);
  gelu_forward(out.data(), tx.data(), x.size());
  gelu_forward(fout.data(), x.data(), x.size());
  EXPECT_LT(rel_err(out, fout), 2 * u);
  gelu_backward(dx.data(), tx.data(), tdy.data(), x.size());
  gelu_backward(fdx.data(), x.data(), dy.data(), x.size());
  EXPECT_LT(rel_err(dx, fdx), 2 * u);
  swiglu_forward(out.data(), tx.data(), N, F);
  swiglu_forward(fout.data(), x.data(), N, F);
  out.resize(N * F);
  fout.resize(N * F);
  EXPECT_LT(rel_err(out, fout), 2 * u);
  swiglu_backward(dx.data(), tdy.data(), tx.data(), N, F);
  swiglu_backward(fdx.data(), dy.data(), x.data(), N, F);
  EXPECT_LT(rel_err(dx, fdx), 2 * u);
  geglu_forward(out.data(), tx.data(), N, F);
  geglu_forward(fout.data(), x.data(), N, F);
  EXPECT_LT(rel_err(out, fout), 2 * u);
  geglu_backward(dx.data(), tdy.data(), tx.data(), N, F);
  geglu_backward(fdx.data(), dy.data(), x.data(), N, F);
  EXPECT_LT(rel_err(dx, fdx), 2 * u);
}

TEST(Activation, HalfAgainstFp32) {
  check_half<bf16>(0x1p-8);
  check_half<f16>(0x1p-11);
}

}  // namespace
}  // namespace strata::kernels
