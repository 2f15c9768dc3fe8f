#include "strata/kernels/cpu/norm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

constexpr float kEps = 1e-5f;

struct Ref {
  std::vector<double> out, mean, rstd;
};

Ref layernorm_reference(const std::vector<float>& x, const std::vector<float>& w,
                        const std::vector<float>* b, int N, int C) {
  Ref r{std::vector<double>(size_t(N) * C), std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += x[size_t(n) * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[size_t(n) * C + c] - m) * (x[size_t(n) * C + c] - m);
    double rs = 1.0 / std::sqrt(v / C + kEps);
    for (int c = 0; c < C; ++c)
      r.out[size_t(n) * C + c] = (x[size_t(n) * C + c] - m) * rs * w[c] + (b ? (*b)[c] : 0.0);
    r.mean[n] = m;
    r.rstd[n] = rs;
  }
  return r;
}

Ref rmsnorm_reference(const std::vector<float>& x, const std::vector<float>& w, int N, int C) {
  Ref r{std::vector<double>(size_t(N) * C), {}, std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += double(x[size_t(n) * C + c]) * x[size_t(n) * C + c];
    double rs = 1.0 / std::sqrt(ss / C + kEps);
    for (int c = 0; c < C; ++c) r.out[size_t(n) * C + c] = x[size_t(n) * C + c] * rs * w[c];
    r.rstd[n] = rs;
  }
  return r;
}

// Inputs with a non-zero mean, so the mean subtraction matters.
std::vector<float> norm_input(size_t n) {
  auto x = test::randn(n, "x");
  for (float& v : x) v += 0.5f;
  return x;
}

TEST(LayerNorm, ForwardAgainstReference) {
  const int N = 9, C = 37;
  auto x = norm_input(N * C), w = test::randn(C, "w"), b = test::randn(C, "b");
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);
  Ref r = layernorm_reference(x, w, &b, N, C);
  EXPECT_LT(rel_err(out, r.out), 1e-5);
  EXPECT_LT(rel_err(mean, r.mean), 1e-5);
  EXPECT_LT(rel_err(rstd, r.rstd), 1e-5);
  layernorm_forward(out.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                    x.data(), w.data(), static_cast<const float*>(nullptr), N, C, kEps);
  EXPECT_LT(rel_err(out, layernorm_reference(x, w, nullptr, N, C).out), 1e-5);
}

// The output is rounded once to S (relative error <= u: 2^-8 bf16, 2^-11 fp16); statistics stay
// fp32, so 2u bounds the error relative to the largest output.
template <typename S>
void check_half_forward(double u) {
  const int N = 9, C = 37;
  auto x = test::rounded<S>(norm_input(N * C)), w = test::rounded<S>(test::randn(C, "w"));
  auto b = test::rounded<S>(test::randn(C, "b"));
  auto tx = test::to_dtype<S>(x), tw = test::to_dtype<S>(w), tb = test::to_dtype<S>(b);
  std::vector<S> out(N * C);
  std::vector<float> mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), tx.data(), tw.data(), tb.data(), N, C,
                    kEps);
  EXPECT_LT(rel_err(out, layernorm_reference(x, w, &b, N, C).out), 2 * u);
  rmsnorm_forward(out.data(), rstd.data(), tx.data(), tw.data(), N, C, kEps);
  EXPECT_LT(rel_err(out, rmsnorm_reference(x, w, N, C).out), 2 * u);
}

TEST(Norm, HalfForwardAgainstReference) {
  check_half_forward<bf16>(0x1p-8);
  check_half_forward<f16>(0x1p-11);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int N = 6, C = 20;
  auto x = norm_input(N * C), w = test::randn(C, "w"), b = test::randn(C, "b");
  auto lw = test::randn(N * C, "loss_w");
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      kEps);
    return test::weighted_sum(lw, out.data(), out.size());
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  std::vector<float> scratch(norm_backward_scratch_floats(N, C));
  layernorm_backward(dx.data(), dw.data(), db.data(), scratch.data(), lw.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), N, C);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
  EXPECT_LT(rel_err(dw, test::numeric_grad(w, loss, 1e-3f)), 1e-2);
  EXPECT_LT(rel_err(db, test::numeric_grad(b, loss, 1e-3f)), 1e-2);

  // dinp, dweight and dbias all accumulate; dbias may be null.
  auto dx1 = dx, dw1 = dw, db1 = db;
  layernorm_backward(dx.data(), dw.data(), db.data(), scratch.data(), lw.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx[i], 2.0f * dx1[i]);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 2.0f * dw1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_FLOAT_EQ(db[i], 2.0f * db1[i]);
  layernorm_backward(dx.data(), dw.data(), static_cast<float*>(nullptr), scratch.data(), lw.data(),
                     x.data(), w.data(), mean.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 3.0f * dw1[i]);
}

TEST(RmsNorm, ForwardAgainstReference) {
  const int N = 9, C = 37;
  auto x = norm_input(N * C), w = test::randn(C, "w");
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  Ref r = rmsnorm_reference(x, w, N, C);
  EXPECT_LT(rel_err(out, r.out), 1e-5);
  EXPECT_LT(rel_err(rstd, r.rstd), 1e-5);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 6, C = 20;
  auto x = norm_input(N * C), w = test::randn(C, "w"), lw = test::randn(N * C, "loss_w");
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
    return test::weighted_sum(lw, out.data(), out.size());
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  std::vector<float> scratch(norm_backward_scratch_floats(N, C));
  rmsnorm_backward(dx.data(), dw.data(), scratch.data(), lw.data(), x.data(), w.data(), rstd.data(),
                   N, C);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
  EXPECT_LT(rel_err(dw, test::numeric_grad(w, loss, 1e-3f)), 1e-2);

  auto dx1 = dx, dw1 = dw;
  rmsnorm_backward(dx.data(), dw.data(), scratch.data(), lw.data(), x.data(), w.data(), rstd.data(),
                   N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx[i], 2.0f * dx1[i]);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 2.0f * dw1[i]);
}

// Gemma's gain 1 + w (w_offset 1), w random around 0 so that using w, or 1 + w where w belongs,
// fails: the forward against the reference with gain 1 + w, the backward against finite
// differences, and the split backward equal to the fused one bit for bit.
TEST(RmsNorm, OffsetGainForwardAndBackward) {
  const int N = 6, C = 20;
  auto x = norm_input(N * C), w = test::randn(C, "w", 0.5f), lw = test::randn(N * C, "loss_w");
  std::vector<float> gain(C);
  for (int c = 0; c < C; ++c) gain[c] = 1.0f + w[c];
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps, 1.0f);
    return test::weighted_sum(lw, out.data(), out.size());
  };
  loss();
  Ref r = rmsnorm_reference(x, gain, N, C);
  EXPECT_LT(rel_err(out, r.out), 1e-5);
  EXPECT_LT(rel_err(rstd, r.rstd), 1e-5);
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), scratch(norm_backward_scratch_floats(N, C));
  rmsnorm_backward(dx.data(), dw.data(), scratch.data(), lw.data(), x.data(), w.data(), rstd.data(),
                   N, C, 1.0f);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
  EXPECT_LT(rel_err(dw, test::numeric_grad(w, loss, 1e-3f)), 1e-2);
  std::vector<float> dx2(N * C, 0.0f), dw2(C, 0.0f);
  rmsnorm_backward_input(dx2.data(), lw.data(), x.data(), w.data(), rstd.data(), N, C, 1.0f);
  rmsnorm_backward_weight(dw2.data(), scratch.data(), lw.data(), x.data(), rstd.data(), N, C);
  EXPECT_TRUE(test::bit_equal(dx2, dx));
  EXPECT_TRUE(test::bit_equal(dw2, dw));
}

// Without an offset the gain is w itself, bit for bit, a −0 weight included (its sign reaches the
// output).
TEST(RmsNorm, NoOffsetKeepsThePlainGainsBits) {
  const int N = 3, C = 8;
  auto x = norm_input(N * C), w = test::randn(C, "w");
  w[1] = -0.0f;
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  std::vector<float> want(N * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[n * C + c] = x[n * C + c] * rstd[n] * w[c];
  EXPECT_TRUE(test::bit_equal(out, want));
}

// The gain 1 + w is formed in fp32: with bf16 weights of a few hundredths, 1 + w rounded to bf16
// would move about half of the bf16 outputs by an ulp; formed in fp32, all but the rare output
// within fp32 noise of a rounding boundary are the exact result rounded once.
TEST(RmsNorm, OffsetGainKeepsHalfWeights) {
  const int N = 16, C = 64;
  auto x = test::rounded<bf16>(norm_input(N * C)),
       w = test::rounded<bf16>(test::randn(C, "w", 0.02f));
  auto tx = test::to_dtype<bf16>(x), tw = test::to_dtype<bf16>(w);
  std::vector<bf16> out(N * C);
  std::vector<float> rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), tx.data(), tw.data(), N, C, kEps, 1.0f);
  std::vector<float> gain(C);
  for (int c = 0; c < C; ++c) gain[c] = 1.0f + w[c];
  const Ref r = rmsnorm_reference(x, gain, N, C);
  int off = 0;
  for (int i = 0; i < N * C; ++i) off += out[i].bits != from_f32<bf16>(float(r.out[i])).bits;
  EXPECT_LE(off, N * C / 100);
}

// Half storage: the fp32 gradients of the rounded inputs, rounded to S (dinp) or G.
template <typename S, typename G>
void check_half_backward(double tol) {
  const int N = 8, C = 48;
  auto x = test::rounded<S>(norm_input(N * C)), w = test::rounded<S>(test::randn(C, "w"));
  auto b = test::rounded<S>(test::randn(C, "b")), dy = test::rounded<S>(test::randn(N * C, "dy"));
  auto tx = test::to_dtype<S>(x), tw = test::to_dtype<S>(w), tb = test::to_dtype<S>(b);
  auto tdy = test::to_dtype<S>(dy);
  std::vector<float> scratch(norm_backward_scratch_floats(N, C));
  std::vector<S> out(N * C), dx(N * C, from_f32<S>(0.0f));
  std::vector<G> dw(C, from_f32<G>(0.0f)), db(C, from_f32<G>(0.0f));
  std::vector<float> mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), tx.data(), tw.data(), tb.data(), N, C,
                    kEps);
  layernorm_backward(dx.data(), dw.data(), db.data(), scratch.data(), tdy.data(), tx.data(),
                     tw.data(), mean.data(), rstd.data(), N, C);
  std::vector<float> rx(N * C, 0.0f), rw(C, 0.0f), rb(C, 0.0f), rmean(N), rrstd(N);
  std::vector<float> fout(N * C);
  layernorm_forward(fout.data(), rmean.data(), rrstd.data(), x.data(), w.data(), b.data(), N, C,
                    kEps);
  layernorm_backward(rx.data(), rw.data(), rb.data(), scratch.data(), dy.data(), x.data(), w.data(),
                     rmean.data(), rrstd.data(), N, C);
  EXPECT_LT(rel_err(dx, rx), tol);
  EXPECT_LT(rel_err(dw, rw), tol);
  EXPECT_LT(rel_err(db, rb), tol);
}

TEST(LayerNorm, HalfBackwardAgainstFp32) {
  // One rounding of each result: 2u margin (u = 2^-8 bf16, 2^-11 fp16; fp32 G is exact here).
  check_half_backward<bf16, float>(2 * 0x1p-8);
  check_half_backward<bf16, bf16>(2 * 0x1p-8);
  check_half_backward<f16, float>(2 * 0x1p-11);
  check_half_backward<f16, f16>(2 * 0x1p-11);
}

// Parameter gradients are reduced over fixed row blocks: bit-identical across runs and across
// thread counts.
TEST(Norm, BackwardDeterministicAcrossThreadCounts) {
  const int N = 300, C = 130;
  auto x = norm_input(N * C), w = test::randn(C, "w"), b = test::randn(C, "b");
  auto dy = test::randn(N * C, "dy");
  std::vector<float> out(N * C), mean(N), rstd(N), scratch(norm_backward_scratch_floats(N, C));
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);
  auto run = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_backward(dx.data(), dw.data(), db.data(), scratch.data(), dy.data(), x.data(),
                       w.data(), mean.data(), rstd.data(), N, C);
    rmsnorm_backward(dx.data(), dw.data(), scratch.data(), dy.data(), x.data(), w.data(),
                     rstd.data(), N, C);
    omp_set_num_threads(saved);
    dx.insert(dx.end(), dw.begin(), dw.end());
    dx.insert(dx.end(), db.begin(), db.end());
    return dx;
  };
  auto first = run(2);
  EXPECT_TRUE(test::bit_equal(first, run(2)));
  EXPECT_TRUE(test::bit_equal(first, run(1)));
  EXPECT_TRUE(test::bit_equal(first, run(3)));
}

}  // namespace
}  // namespace strata::kernels
