#include "strata/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace strata::kernels {
namespace {

using test::rel_err;

constexpr int B = 3, T = 5, C = 70, V = 11;  // C > 64: two channel blocks in backward

// The table in pieces of whole rows, as the model holds a vocabulary split into units; the
// helpers below cut it in three (one of a single row).
constexpr int64_t kCuts[] = {0, 4, 9, V};

template <typename S>
void forward_pieces(S* out, const std::vector<int32_t>& tok, const S* wte, const S* wpe, int Bb,
                    int Tb, int Cb, int Vb) {
  const int64_t cuts[] = {0, Vb / 3, Vb / 3 + 1, Vb};
  for (int k = 0; k < 3; ++k) {
    embedding_forward(out, tok.data(), wte + cuts[k] * Cb, cuts[k], cuts[k + 1], Bb, Tb, Cb);
  }
  if (wpe != nullptr) position_forward(out, wpe, int64_t(Bb) * Tb, Tb, Cb, 0);
}

template <typename S, typename G>
void backward_pieces(G* dwte, G* dwpe, const S* dout, const std::vector<int32_t>& tok, int Bb,
                     int Tb, int Cb, int Vb) {
  const int64_t cuts[] = {0, Vb / 3, Vb / 3 + 1, Vb};
  for (int k = 3; k-- > 0;) {
    embedding_backward(dwte + cuts[k] * Cb, cuts[k], cuts[k + 1], dout, tok.data(), Bb, Tb, Cb);
  }
  if (dwpe != nullptr) position_backward(dwpe, dout, int64_t(Bb) * Tb, Tb, Cb, 0);
}

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
  forward_pieces(out.data(), tok, twte.data(), twpe.data(), B, T, C, V);
  EXPECT_LT(rel_err(out, reference(tok, wte, &wpe)), tol);
  forward_pieces(out.data(), tok, twte.data(), static_cast<const S*>(nullptr), B, T, C, V);
  EXPECT_EQ(rel_err(out, reference(tok, wte, nullptr)), 0.0);  // a copy: exact
}

// A piece writes the positions whose token it holds and no other; its backward touches only its
// own rows.
TEST(Embedding, PieceTouchesOnlyItsRows) {
  auto tok = test::randint(B * T, "tok", V);
  auto wte = test::randn(V * C, "wte");
  const float sentinel = 12345.0f;
  std::vector<float> out(B * T * C, sentinel);
  embedding_forward(out.data(), tok.data(), wte.data() + kCuts[1] * C, kCuts[1], kCuts[2], B, T, C);
  for (int bt = 0; bt < B * T; ++bt) {
    const bool mine = tok[bt] >= kCuts[1] && tok[bt] < kCuts[2];
    for (int c = 0; c < C; ++c) {
      const float want = mine ? wte[size_t(tok[bt]) * C + c] : sentinel;
      ASSERT_EQ(out[size_t(bt) * C + c], want) << "position " << bt;
    }
  }
  auto dout = test::randn(B * T * C, "dout");
  std::vector<float> rows(size_t(kCuts[2] - kCuts[1]) * C + 7, 0.0f);
  rows.back() = sentinel;  // just past the piece
  embedding_backward(rows.data(), kCuts[1], kCuts[2], dout.data(), tok.data(), B, T, C);
  EXPECT_EQ(rows.back(), sentinel);
  std::vector<double> ref(rows.size() - 7, 0.0);
  for (int bt = 0; bt < B * T; ++bt) {
    if (tok[bt] < kCuts[1] || tok[bt] >= kCuts[2]) continue;
    for (int c = 0; c < C; ++c) ref[size_t(tok[bt] - kCuts[1]) * C + c] += dout[size_t(bt) * C + c];
  }
  rows.resize(ref.size());
  EXPECT_LT(rel_err(rows, ref), 1e-6);
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
    forward_pieces(out.data(), tok, wte.data(), wpe.data(), B, T, C, V);
    return test::weighted_sum(w, out.data(), out.size());
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  backward_pieces(dwte.data(), dwpe.data(), w.data(), tok, B, T, C, V);
  auto iwte = test::sample_indices(wte.size(), 300, "iwte");
  auto iwpe = test::sample_indices(wpe.size(), 300, "iwpe");
  EXPECT_LT(rel_err(test::gather(dwte, iwte), test::numeric_grad(wte, loss, 1e-2f, iwte)), 1e-3);
  EXPECT_LT(rel_err(test::gather(dwpe, iwpe), test::numeric_grad(wpe, loss, 1e-2f, iwpe)), 1e-3);

  // Accumulation: a second call adds the same gradient again (up to the order of the sums of
  // repeated tokens), and dwpe may be null.
  auto dwte1 = dwte, dwpe1 = dwpe;
  backward_pieces(dwte.data(), dwpe.data(), w.data(), tok, B, T, C, V);
  EXPECT_LT(rel_err(dwte, test::scaled(dwte1, 2.0)), 1e-6);
  EXPECT_LT(rel_err(dwpe, test::scaled(dwpe1, 2.0)), 1e-6);
  backward_pieces(dwte.data(), static_cast<float*>(nullptr), w.data(), tok, B, T, C, V);
  EXPECT_LT(rel_err(dwte, test::scaled(dwte1, 3.0)), 1e-6);
}

template <typename S, typename G>
void check_half_backward(double tol) {
  auto tok = test::randint(B * T, "tok", V);
  auto dout = test::rounded<S>(test::randn(B * T * C, "dout"));
  auto tdout = test::to_dtype<S>(dout);
  std::vector<G> dwte(V * C, from_f32<G>(0.0f)), dwpe(T * C, from_f32<G>(0.0f));
  backward_pieces(dwte.data(), dwpe.data(), tdout.data(), tok, B, T, C, V);
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
    backward_pieces(dwte.data(), dwpe.data(), dout.data(), tok, Bb, Tb, Cb, Vb);
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  EXPECT_TRUE(test::bit_equal(run(), run()));
}

}  // namespace
}  // namespace strata::kernels
