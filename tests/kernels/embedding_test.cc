#include "strata/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

constexpr int B = 3, T = 5, C = 70, V = 11;  // C > 64: two channel blocks in backward

std::vector<double> reference(const std::vector<int32_t>& tok, const std::vector<float>& wte,
                              const std::vector<float>* wpe) {
  std::vector<double> out(size_t(B) * T * C);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      out[size_t(bt) * C + c] =
          double(wte[size_t(tok[bt]) * C + c]) + (wpe ? double((*wpe)[size_t(bt % T) * C + c]) : 0);
  return out;
}

template <typename S>
void check_forward(double tol) {
  auto tok = test::randint(B * T, "tok", V);
  auto wte = test::rounded<S>(test::randn(V * C, "wte"));
  auto wpe = test::rounded<S>(test::randn(T * C, "wpe"));
  auto twte = test::to_dtype<S>(wte), twpe = test::to_dtype<S>(wpe);
  std::vector<S> out(B * T * C);
  embedding_forward(out.data(), tok.data(), twte.data(), twpe.data(), B, T, C);
  EXPECT_LT(rel_err(out, reference(tok, wte, &wpe)), tol);
  embedding_forward(out.data(), tok.data(), twte.data(), static_cast<const S*>(nullptr), B, T, C);
  EXPECT_EQ(rel_err(out, reference(tok, wte, nullptr)), 0.0);  // a copy: exact
}

TEST(Embedding, ForwardAgainstReference) {
  check_forward<float>(1e-7);  // one fp32 addition
  // One rounding of the sum to the type: relative error <= u (unit roundoff: 2^-8 for bf16's 8
  // significant bits, 2^-11 for fp16's 11).
  check_forward<bf16>(0x1p-8);
  check_forward<f16>(0x1p-11);
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  auto tok = test::randint(B * T, "tok", V);
  tok[3] = tok[7] = tok[12] = 2;  // repeated tokens accumulate
  auto wte = test::randn(V * C, "wte"), wpe = test::randn(T * C, "wpe");
  auto w = test::randn(B * T * C, "w");
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C);
  auto iwte = test::sample_indices(wte.size(), 300, "iwte");
  auto iwpe = test::sample_indices(wpe.size(), 300, "iwpe");
  EXPECT_LT(rel_err(test::gather(dwte, iwte), test::numeric_grad(wte, loss, 1e-2f, iwte)), 1e-3);
  EXPECT_LT(rel_err(test::gather(dwpe, iwpe), test::numeric_grad(wpe, loss, 1e-2f, iwpe)), 1e-3);

  // Accumulation: a second call adds the same gradient again (up to the order of the sums of
  // repeated tokens), and dwpe may be null.
  auto dwte1 = dwte, dwpe1 = dwpe;
  embedding_backward(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_err(dwte, test::scaled(dwte1, 2.0)), 1e-6);
  EXPECT_LT(rel_err(dwpe, test::scaled(dwpe1, 2.0)), 1e-6);
  embedding_backward(dwte.data(), static_cast<float*>(nullptr), w.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_err(dwte, test::scaled(dwte1, 3.0)), 1e-6);
}

template <typename S, typename G>
void check_half_backward(double tol) {
  auto tok = test::randint(B * T, "tok", V);
  auto dout = test::rounded<S>(test::randn(B * T * C, "dout"));
  auto tdout = test::to_dtype<S>(dout);
  std::vector<G> dwte(V * C, from_f32<G>(0.0f)), dwpe(T * C, from_f32<G>(0.0f));
  embedding_backward(dwte.data(), dwpe.data(), tdout.data(), tok.data(), B, T, C);
  std::vector<double> rwte(V * C, 0.0), rwpe(T * C, 0.0);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) {
      rwte[size_t(tok[bt]) * C + c] += dout[size_t(bt) * C + c];
      rwpe[size_t(bt % T) * C + c] += dout[size_t(bt) * C + c];
    }
  EXPECT_LT(rel_err(dwte, rwte), tol);
  EXPECT_LT(rel_err(dwpe, rwpe), tol);
}

TEST(Embedding, HalfBackwardAgainstReference) {
  check_half_backward<bf16, float>(1e-6);
  check_half_backward<f16, float>(1e-6);
  // With G half, a token seen k times is rounded k times; k is small here (15 tokens over 11
  // ids) and the roundings partly cancel: 4u (u = 2^-8 bf16, 2^-11 fp16).
  check_half_backward<bf16, bf16>(4 * 0x1p-8);
  check_half_backward<f16, f16>(4 * 0x1p-11);
}

TEST(Embedding, BackwardDeterministic) {
  const int Bb = 8, Tb = 64, Cb = 256, Vb = 7;  // few tokens: many collisions
  auto tok = test::randint(Bb * Tb, "tok", Vb);
  auto dout = test::randn(Bb * Tb * Cb, "dout");
  auto run = [&] {
    std::vector<float> dwte(Vb * Cb, 0.0f), dwpe(Tb * Cb, 0.0f);
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), Bb, Tb, Cb);
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  EXPECT_TRUE(test::bit_equal(run(), run()));
}

}  // namespace
}  // namespace strata::kernels
