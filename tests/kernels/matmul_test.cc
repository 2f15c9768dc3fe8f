// The strided batched matmul and the linear layer built on it: against a double-precision
// reference for every layout the engine uses, finite-difference gradients, += semantics and
// determinism.
#include "strata/kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "kernel_test_util.h"
#include "strata/kernels/cpu/cpu_features.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// Half-precision tolerances, relative to the largest reference value: a result rounded once to
// the type has relative error <= u (unit roundoff: bf16 has 8 significant bits, u = 2^-8; fp16
// 11 bits, u = 2^-11); fp32 accumulation of the products adds about K·2^-24. 2u leaves a factor
// two of margin.
constexpr double kTolBf16 = 0x1p-7;
constexpr double kTolF16 = 0x1p-10;
constexpr double kTolF32 = 1e-5;  // fp32 accumulation order against a double reference

// A (B0,B1,rows,cols) operand living in a larger buffer: `pad` unused elements after every line,
// and stored transposed (column-major) when `trans`.
struct Layout {
  int64_t rows, cols;
  bool trans;
  int64_t pad;
  int64_t B0, B1;
  int64_t ld() const { return (trans ? rows : cols) + pad; }
  int64_t rs() const { return trans ? 1 : ld(); }
  int64_t cs() const { return trans ? ld() : 1; }
  int64_t mat() const { return ld() * (trans ? cols : rows) + 3; }  // +3: batch gap
  int64_t bs1() const { return mat(); }
  int64_t bs0() const { return B1 * mat(); }
  size_t size() const { return size_t(B0 * B1 * mat()); }
  int64_t at(int64_t b0, int64_t b1, int64_t i, int64_t j) const {
    return b0 * bs0() + b1 * bs1() + i * rs() + j * cs();
  }
};

// c[b] = alpha·a[b]·b[b] (+ c0[b]) in double, dense (B0,B1,M,N).
std::vector<double> reference(const std::vector<float>& a, const Layout& la,
                              const std::vector<float>& b, const Layout& lb,
                              const std::vector<float>* c0, const Layout& lc, float alpha) {
  int64_t M = la.rows, K = la.cols, N = lb.cols;
  std::vector<double> c(size_t(la.B0 * la.B1 * M * N));
  for (int64_t b0 = 0; b0 < la.B0; ++b0)
    for (int64_t b1 = 0; b1 < la.B1; ++b1)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k)
            s += double(a[la.at(b0, b1, i, k)]) * double(b[lb.at(b0, b1, k, j)]);
          s *= alpha;
          if (c0 != nullptr) s += double((*c0)[lc.at(b0, b1, i, j)]);
          c[size_t(((b0 * la.B1 + b1) * M + i) * N + j)] = s;
        }
  return c;
}

template <typename C>
std::vector<float> extract(const std::vector<C>& c, const Layout& lc) {
  std::vector<float> out;
  for (int64_t b0 = 0; b0 < lc.B0; ++b0)
    for (int64_t b1 = 0; b1 < lc.B1; ++b1)
      for (int64_t i = 0; i < lc.rows; ++i)
        for (int64_t j = 0; j < lc.cols; ++j) out.push_back(to_f32(c[lc.at(b0, b1, i, j)]));
  return out;
}

// Runs one matmul of operand types A, B into C and returns its error against the reference.
template <typename A, typename B, typename C>
double matmul_error(int64_t M, int64_t N, int64_t K, int64_t B0, int64_t B1, bool ta, bool tb,
                    float alpha, bool accumulate) {
  Layout la{M, K, ta, 5, B0, B1}, lb{K, N, tb, 2, B0, B1}, lc{M, N, false, 4, B0, B1};
  auto a = test::rounded<A>(test::randn(la.size(), "a"));
  auto b = test::rounded<B>(test::randn(lb.size(), "b"));
  auto c0 = test::rounded<C>(test::randn(lc.size(), "c"));
  auto ta_ = test::to_dtype<A>(a);
  auto tb_ = test::to_dtype<B>(b);
  auto tc = test::to_dtype<C>(c0);
  const int64_t batch[2] = {B0, B1};
  matmul({tc.data(), dtype_of<C>(), lc.rs(), {lc.bs0(), lc.bs1()}},
         {ta_.data(), dtype_of<A>(), la.rs(), la.cs(), {la.bs0(), la.bs1()}},
         {tb_.data(), dtype_of<B>(), lb.rs(), lb.cs(), {lb.bs0(), lb.bs1()}}, M, N, K, batch, alpha,
         accumulate);
  auto ref = reference(a, la, b, lb, accumulate ? &c0 : nullptr, lc, alpha);
  // The padding between lines and matrices must be untouched.
  std::vector<bool> inside(lc.size(), false);
  for (int64_t b0 = 0; b0 < B0; ++b0)
    for (int64_t b1 = 0; b1 < B1; ++b1)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) inside[lc.at(b0, b1, i, j)] = true;
  for (size_t i = 0; i < lc.size(); ++i) {
    if (!inside[i]) {
      EXPECT_EQ(to_f32(tc[i]), c0[i]) << "padding element " << i << " changed";
    }
  }
  return rel_err(extract(tc, lc), ref);
}

TEST(Matmul, Fp32LayoutsAgainstReference) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb);
      EXPECT_LT((matmul_error<float, float, float>(33, 17, 29, 1, 1, ta, tb, 1.0f, false)),
                kTolF32);
      EXPECT_LT((matmul_error<float, float, float>(9, 12, 7, 2, 3, ta, tb, 0.5f, false)), kTolF32);
      EXPECT_LT((matmul_error<float, float, float>(9, 12, 7, 3, 2, ta, tb, -2.0f, true)), kTolF32);
    }
}

// Runs the body once with bf16 matmuls forced onto each path this CPU has (native oneDNN bf16
// kernels — real or emulated — from AVX-512 on, and widened to fp32), then restores the
// detected path.
template <typename F>
void on_each_bf16_path(F&& body) {
  const Bf16Matmul detected = bf16_matmul_path();
  for (Bf16Matmul p : bf16_matmul_paths()) {
    SCOPED_TRACE(testing::Message() << "bf16 matmul " << bf16_matmul_path_name(p));
    set_bf16_matmul_path(p);
    body();
  }
  set_bf16_matmul_path(detected);
}

TEST(Matmul, HalfOperandsAgainstReference) {
  on_each_bf16_path([] {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb);
        EXPECT_LT((matmul_error<bf16, bf16, float>(9, 12, 7, 2, 3, ta, tb, 1.0f, true)), kTolF32);
        EXPECT_LT((matmul_error<bf16, bf16, bf16>(9, 12, 7, 2, 3, ta, tb, 0.5f, false)), kTolBf16);
        EXPECT_LT((matmul_error<bf16, bf16, bf16>(33, 17, 29, 1, 1, ta, tb, 1.0f, true)), kTolBf16);
        EXPECT_LT((matmul_error<f16, f16, f16>(9, 12, 7, 2, 3, ta, tb, 1.0f, true)), kTolF16);
        EXPECT_LT((matmul_error<f16, f16, float>(33, 17, 29, 1, 1, ta, tb, 1.0f, false)), kTolF32);
        // Mixed operand types (attention's fp32 score gradients times bf16 keys).
        EXPECT_LT((matmul_error<float, bf16, bf16>(9, 12, 7, 2, 3, ta, tb, 0.25f, false)),
                  kTolBf16);
        EXPECT_LT((matmul_error<float, f16, float>(9, 12, 7, 2, 3, ta, tb, 1.0f, true)), kTolF32);
      }
  });
}

// A half-precision b too large to widen at once and met by few rows (a weight in a small batch)
// is widened and multiplied in blocks of columns (a partial last block here: 320 x 3 + 140):
// every layout, bf16 and fp16 results, += included, padding untouched.
TEST(Matmul, HalfWeightInColumnBlocksAgainstReference) {
  on_each_bf16_path([] {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb);
        EXPECT_LT((matmul_error<bf16, bf16, bf16>(8, 1100, 700, 1, 1, ta, tb, 0.5f, true)),
                  kTolBf16);
        EXPECT_LT((matmul_error<bf16, bf16, float>(8, 1100, 700, 1, 1, ta, tb, 1.0f, true)),
                  kTolF32);
        EXPECT_LT((matmul_error<float, f16, f16>(8, 1100, 700, 1, 1, ta, tb, 1.0f, false)),
                  kTolF16);
      }
  });
}

// The two bf16 paths compute the same bf16 GEMM with fp32 accumulation: on a linear layer's
// forward and backward they agree within bf16 rounding (one ulp of the larger result), and the
// widened path is the one chosen where the CPU has no bf16 dot product.
TEST(Matmul, Bf16PathsAgree) {
  if (std::getenv("STRATA_BF16_MATMUL") == nullptr) {
    EXPECT_EQ(bf16_matmul_path(),
              cpu_features().native_bf16() ? Bf16Matmul::Native : Bf16Matmul::Widened)
        << describe_cpu();
  }
  if (bf16_matmul_paths().size() < 2) {
    GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (" << describe_cpu()
                 << "): the widened path is the only one";
  }
  const int M = 96, K = 160, N = 72;
  auto inp = test::to_dtype<bf16>(test::rounded<bf16>(test::randn(M * K, "inp")));
  auto wt = test::to_dtype<bf16>(test::rounded<bf16>(test::randn(N * K, "w")));
  auto dy = test::to_dtype<bf16>(test::rounded<bf16>(test::randn(M * N, "dy")));
  struct Out {
    std::vector<float> y, dinp, dw;
  };
  auto run = [&](Bf16Matmul p) {
    set_bf16_matmul_path(p);
    std::vector<bf16> y(M * N), dinp(M * K);
    std::vector<float> dw(N * K, 0.0f);
    linear_forward(y.data(), inp.data(), wt.data(), static_cast<const bf16*>(nullptr), M, K, N);
    linear_backward(dinp.data(), dw.data(), static_cast<float*>(nullptr), dy.data(), inp.data(),
                    wt.data(), M, K, N);
    Out o;
    for (bf16 v : y) o.y.push_back(to_f32(v));
    for (bf16 v : dinp) o.dinp.push_back(to_f32(v));
    o.dw = dw;
    return o;
  };
  const Bf16Matmul detected = bf16_matmul_path();
  const Out native = run(Bf16Matmul::Native), widened = run(Bf16Matmul::Widened);
  set_bf16_matmul_path(detected);
  auto as_double = [](const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
  };
  EXPECT_LT(rel_err(native.y, as_double(widened.y)), kTolBf16);
  EXPECT_LT(rel_err(native.dinp, as_double(widened.dinp)), kTolBf16);
  EXPECT_LT(rel_err(native.dw, as_double(widened.dw)), 1e-5);  // fp32 results: order only
}

// L = Σ W ⊙ C with C[b] = A[b]·B[b]: dA[b] = W[b]·B[b]ᵀ and dB[b] = A[b]ᵀ·W[b], computed with
// matmul itself through transposed strided views, against central differences of the forward.
TEST(Matmul, BatchedGradientMatchesFiniteDifferences) {
  const int64_t M = 5, N = 4, K = 6, B0 = 2, B1 = 3, nb = B0 * B1;
  const int64_t batch[2] = {B0, B1};
  auto a = test::randn(size_t(nb * K * M), "a");  // stored transposed: (B0,B1,K,M)
  auto b = test::randn(size_t(nb * K * N), "b");  // (B0,B1,K,N)
  auto w = test::randn(size_t(nb * M * N), "w");  // (B0,B1,M,N)
  std::vector<float> c(size_t(nb * M * N));
  auto forward = [&] {
    matmul({c.data(), DType::F32, N, {B1 * M * N, M * N}},
           {a.data(), DType::F32, 1, M, {B1 * K * M, K * M}},
           {b.data(), DType::F32, N, 1, {B1 * K * N, K * N}}, M, N, K, batch);
    return test::weighted_sum(w, c.data(), c.size());
  };
  // dA stored like A, transposed: dAᵀ[b] (K,M) = B[b] (K,N) · W[b]ᵀ (N,M).
  std::vector<float> da(a.size()), db(b.size());
  matmul({da.data(), DType::F32, M, {B1 * K * M, K * M}},
         {b.data(), DType::F32, N, 1, {B1 * K * N, K * N}},
         {w.data(), DType::F32, 1, N, {B1 * M * N, M * N}}, K, M, N, batch);
  // dB[b] (K,N) = A[b]ᵀ (K,M) · W[b] (M,N); A's storage already is Aᵀ.
  matmul({db.data(), DType::F32, N, {B1 * K * N, K * N}},
         {a.data(), DType::F32, M, 1, {B1 * K * M, K * M}},
         {w.data(), DType::F32, N, 1, {B1 * M * N, M * N}}, K, N, M, batch);
  // A sample of entries keeps the number of (tiny) oneDNN calls small.
  auto ia = test::sample_indices(a.size(), 60, "ia"), ib = test::sample_indices(b.size(), 60, "ib");
  EXPECT_LT(rel_err(test::gather(da, ia), test::numeric_grad(a, forward, 1e-2f, ia)), 1e-3);
  EXPECT_LT(rel_err(test::gather(db, ib), test::numeric_grad(b, forward, 1e-2f, ib)), 1e-3);
}

std::vector<double> linear_reference(const std::vector<float>& inp, const std::vector<float>& wt,
                                     const std::vector<float>* bias, int M, int K, int N) {
  std::vector<double> out(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = bias ? double((*bias)[n]) : 0.0;
      for (int k = 0; k < K; ++k) s += double(inp[m * K + k]) * double(wt[n * K + k]);
      out[size_t(m) * N + n] = s;
    }
  return out;
}

TEST(Linear, ForwardAgainstReference) {
  const int M = 13, K = 24, N = 10;
  auto inp = test::randn(M * K, "inp"), wt = test::randn(N * K, "w"), bias = test::randn(N, "b");
  std::vector<float> out(M * N);
  linear_forward(out.data(), inp.data(), wt.data(), bias.data(), M, K, N);
  EXPECT_LT(rel_err(out, linear_reference(inp, wt, &bias, M, K, N)), kTolF32);
  linear_forward(out.data(), inp.data(), wt.data(), static_cast<const float*>(nullptr), M, K, N);
  EXPECT_LT(rel_err(out, linear_reference(inp, wt, nullptr, M, K, N)), kTolF32);
}

template <typename S>
double linear_half_error() {
  const int M = 13, K = 24, N = 10;
  auto inp = test::rounded<S>(test::randn(M * K, "inp"));
  auto wt = test::rounded<S>(test::randn(N * K, "w"));
  auto bias = test::rounded<S>(test::randn(N, "b"));
  auto ti = test::to_dtype<S>(inp), tw = test::to_dtype<S>(wt), tb = test::to_dtype<S>(bias);
  std::vector<S> out(M * N);
  linear_forward(out.data(), ti.data(), tw.data(), tb.data(), M, K, N);
  // The bias is added after the product was rounded to S: two roundings.
  return rel_err(out, linear_reference(inp, wt, &bias, M, K, N)) / 2.0;
}

TEST(Linear, HalfForwardAgainstReference) {
  EXPECT_LT(linear_half_error<bf16>(), kTolBf16);
  EXPECT_LT(linear_half_error<f16>(), kTolF16);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int M = 7, K = 9, N = 5;
  auto inp = test::randn(M * K, "inp"), wt = test::randn(N * K, "w"), bias = test::randn(N, "b");
  auto w = test::randn(M * N, "loss_w");
  std::vector<float> out(M * N);
  auto loss = [&] {
    linear_forward(out.data(), inp.data(), wt.data(), bias.data(), M, K, N);
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dinp(M * K, 7.0f), dw(N * K, 0.0f), db(N, 0.0f);
  linear_backward(dinp.data(), dw.data(), db.data(), w.data(), inp.data(), wt.data(), M, K, N);
  EXPECT_LT(rel_err(dinp, test::numeric_grad(inp, loss, 1e-2f)), 1e-3);
  EXPECT_LT(rel_err(dw, test::numeric_grad(wt, loss, 1e-2f)), 1e-3);
  EXPECT_LT(rel_err(db, test::numeric_grad(bias, loss, 1e-2f)), 1e-3);

  // Parameter gradients accumulate; the input gradient is written.
  auto dinp1 = dinp, dw1 = dw, db1 = db;
  linear_backward(dinp.data(), dw.data(), db.data(), w.data(), inp.data(), wt.data(), M, K, N);
  EXPECT_EQ(dinp, dinp1);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 2.0f * dw1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_FLOAT_EQ(db[i], 2.0f * db1[i]);
  // dinp and dbias may be null.
  linear_backward(static_cast<float*>(nullptr), dw.data(), static_cast<float*>(nullptr), w.data(),
                  inp.data(), wt.data(), M, K, N);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(dw[i], 3.0f * dw1[i]);
}

template <typename S, typename G>
void linear_half_backward(double tol_s, double tol_g) {
  const int M = 11, K = 16, N = 6;
  auto inp = test::rounded<S>(test::randn(M * K, "inp"));
  auto wt = test::rounded<S>(test::randn(N * K, "w"));
  auto dy = test::rounded<S>(test::randn(M * N, "dy"));
  auto ti = test::to_dtype<S>(inp), tw = test::to_dtype<S>(wt), td = test::to_dtype<S>(dy);
  std::vector<S> dinp(M * K);
  std::vector<G> dw(N * K, from_f32<G>(0.0f)), db(N, from_f32<G>(0.0f));
  linear_backward(dinp.data(), dw.data(), db.data(), td.data(), ti.data(), tw.data(), M, K, N);
  std::vector<double> rdinp(M * K, 0.0), rdw(N * K, 0.0), rdb(N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      rdb[n] += dy[m * N + n];
      for (int k = 0; k < K; ++k) {
        rdinp[m * K + k] += double(dy[m * N + n]) * wt[n * K + k];
        rdw[n * K + k] += double(dy[m * N + n]) * inp[m * K + k];
      }
    }
  EXPECT_LT(rel_err(dinp, rdinp), tol_s);
  EXPECT_LT(rel_err(dw, rdw), tol_g);
  EXPECT_LT(rel_err(db, rdb), tol_g);
}

TEST(Linear, HalfBackwardAgainstReference) {
  linear_half_backward<bf16, float>(kTolBf16, kTolF32);
  linear_half_backward<bf16, bf16>(kTolBf16, kTolBf16);
  linear_half_backward<f16, float>(kTolF16, kTolF32);
  linear_half_backward<f16, f16>(kTolF16, kTolF16);
}

TEST(Matmul, Deterministic) {
  const int M = 64, K = 96, N = 80;
  auto inp = test::randn(M * K, "inp"), wt = test::randn(N * K, "w"), dy = test::randn(M * N, "dy");
  auto run = [&] {
    std::vector<float> dinp(M * K), dw(N * K, 0.0f), db(N, 0.0f);
    linear_backward(dinp.data(), dw.data(), db.data(), dy.data(), inp.data(), wt.data(), M, K, N);
    dinp.insert(dinp.end(), dw.begin(), dw.end());
    dinp.insert(dinp.end(), db.begin(), db.end());
    return dinp;
  };
  EXPECT_TRUE(test::bit_equal(run(), run()));
}

}  // namespace
}  // namespace strata::kernels
