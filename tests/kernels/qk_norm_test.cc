// q/k normalisation (ops.h) on the CPU: per head (Qwen3, Gemma 3) and whole (OLMo 2) against a
// plain reference, the backward against finite differences, the whole mode split over two
// tensor-parallel ranks (their sums added by hand between the calls) against the one-piece
// result, half storage against fp32, the gains' gradients across thread counts, and dry runs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"
#include "strata/kernels/ops.h"

namespace strata::ops {
namespace {

using test::rel_err;

// Two kv groups of two query heads, hd 8: row = groups·(rep+2)·hd = 64.
const AttentionShape kShape{2, 3, 2, 2, 8};

int64_t rows(const AttentionShape& s) {
  return int64_t(s.B) * s.T;
}
int64_t row_width(const AttentionShape& s) {
  return int64_t(s.groups) * (s.rep + 2) * s.hd;
}
using test::view;
Tensor none() {
  return Tensor();
}

QkNorm per_head(float w_offset) {
  QkNorm n;
  n.per_head = true;
  n.eps = 1e-6f;
  n.w_offset = w_offset;
  return n;
}
// The whole mode over every head of the (unsplit) shape s.
QkNorm whole(const AttentionShape& s) {
  QkNorm n;
  n.per_head = false;
  n.eps = 1e-6f;
  n.q_width = int64_t(s.groups) * s.rep * s.hd;
  n.k_width = int64_t(s.groups) * s.hd;
  return n;
}

// The reference, in double, straight from the layout: the norms of a row (each query head and
// each key head per head; all its query heads, and all its key heads, whole), y = (off + w)·x·r.
// rstd as the op lays it out.
struct Ref {
  std::vector<double> out, rstd;
};
Ref reference(const std::vector<float>& x, const std::vector<float>& wq,
              const std::vector<float>& wk, const AttentionShape& s, const QkNorm& n) {
  const int64_t N = rows(s), row = row_width(s);
  Ref r{std::vector<double>(x.begin(), x.end()),
        std::vector<double>(N * (n.per_head ? s.groups * (s.rep + 1) : 2))};
  for (int64_t t = 0; t < N; ++t) {
    for (int key = 0; key < 2; ++key) {
      // This kind's heads in row order: their columns and their gains' first index.
      std::vector<int64_t> cols, gains;
      for (int g = 0; g < s.groups; ++g)
        for (int h = 0; h < (key ? 1 : s.rep); ++h) {
          cols.push_back(t * row + (int64_t(g) * (s.rep + 2) + (key ? s.rep : h)) * s.hd);
          gains.push_back(n.per_head ? 0 : int64_t(cols.size() - 1) * s.hd);
        }
      const std::vector<float>& w = key ? wk : wq;
      auto normalise = [&](size_t first, size_t last, double width, int64_t stat) {
        double ss = 0.0;
        for (size_t i = first; i < last; ++i)
          for (int d = 0; d < s.hd; ++d) ss += double(x[cols[i] + d]) * x[cols[i] + d];
        const double rs = 1.0 / std::sqrt(ss / width + n.eps);
        for (size_t i = first; i < last; ++i)
          for (int d = 0; d < s.hd; ++d)
            r.out[cols[i] + d] = (n.w_offset + double(w[gains[i] + d])) * x[cols[i] + d] * rs;
        r.rstd[stat] = rs;
      };
      if (n.per_head) {
        for (size_t i = 0; i < cols.size(); ++i) {
          const int64_t head = key ? s.groups * s.rep + int64_t(i) : int64_t(i);
          normalise(i, i + 1, s.hd, t * s.groups * (s.rep + 1) + head);
        }
      } else {
        normalise(0, cols.size(), double(key ? n.k_width : n.q_width), 2 * t + key);
      }
    }
  }
  return r;
}

// The op's forward and backward on fp32 data, the whole mode's sums taken on one piece.
struct Pass {
  AttentionShape s;
  QkNorm n;
  std::vector<float> out, rstd, sumsq, dot;
  Pass(const AttentionShape& shape, const QkNorm& norm)
      : s(shape),
        n(norm),
        out(rows(shape) * row_width(shape)),
        rstd(rows(shape) * (norm.per_head ? shape.groups * (shape.rep + 1) : 2)),
        sumsq(2 * rows(shape)),
        dot(2 * rows(shape)) {}
  Tensor qkv_view(std::vector<float>& v) { return view(v, {rows(s), row_width(s)}); }
  void forward(std::vector<float>& x, std::vector<float>& wq, std::vector<float>& wk) {
    if (!n.per_head) qk_norm_sumsq(view(sumsq, {rows(s), 2}), qkv_view(x), s);
    qk_norm_forward(qkv_view(out), view(rstd, {int64_t(rstd.size())}), qkv_view(x),
                    view(wq, {int64_t(wq.size())}), view(wk, {int64_t(wk.size())}),
                    n.per_head ? none() : view(sumsq, {rows(s), 2}), s, n);
  }
  void backward(std::vector<float>& dx, std::vector<float>& dwq, std::vector<float>& dwk,
                std::vector<float>& dy, std::vector<float>& x, std::vector<float>& wq,
                std::vector<float>& wk) {
    Tensor tq = view(wq, {int64_t(wq.size())}), tk = view(wk, {int64_t(wk.size())});
    Tensor tr = view(rstd, {int64_t(rstd.size())});
    if (!n.per_head)
      qk_norm_backward_dot(view(dot, {rows(s), 2}), qkv_view(dy), qkv_view(x), tq, tk, tr, s, n);
    qk_norm_backward(qkv_view(dx), view(dwq, {int64_t(dwq.size())}),
                     view(dwk, {int64_t(dwk.size())}), qkv_view(dy), qkv_view(x), tq, tk, tr,
                     n.per_head ? none() : view(dot, {rows(s), 2}), s, n);
  }
};

// Forward against the reference; dqkv, dwq and dwk against finite differences of Σ lw·out, the
// gains' gradients added to what they held.
void check(const QkNorm& n, size_t gq, size_t gk) {
  const AttentionShape& s = kShape;
  const size_t size = size_t(rows(s) * row_width(s));
  auto x = test::randn(size, "x"), lw = test::randn(size, "lw");
  auto wq = test::randn(gq, "wq", 0.5f), wk = test::randn(gk, "wk", 0.5f);
  Pass run(s, n);
  run.forward(x, wq, wk);
  const Ref ref = reference(x, wq, wk, s, n);
  EXPECT_LT(rel_err(run.out, ref.out), 1e-6);
  EXPECT_LT(rel_err(run.rstd, ref.rstd), 1e-6);
  auto loss = [&] {
    run.forward(x, wq, wk);
    return test::weighted_sum(lw, run.out.data(), run.out.size());
  };
  loss();
  std::vector<float> dx(size, 5.0f), dwq0 = test::randn(gq, "dwq0"), dwk0 = test::randn(gk, "dwk0");
  auto dwq = dwq0, dwk = dwk0;
  run.backward(dx, dwq, dwk, lw, x, wq, wk);
  EXPECT_LT(rel_err(dx, test::numeric_grad(x, loss, 1e-3f)), 1e-2);
  for (size_t i = 0; i < gq; ++i) dwq[i] -= dwq0[i];
  for (size_t i = 0; i < gk; ++i) dwk[i] -= dwk0[i];
  EXPECT_LT(rel_err(dwq, test::numeric_grad(wq, loss, 1e-3f)), 1e-2);
  EXPECT_LT(rel_err(dwk, test::numeric_grad(wk, loss, 1e-3f)), 1e-2);
}

// Qwen3: one (hd) gain for every query head, one for every key head.
TEST(QkNorm, PerHeadAgainstReference) {
  check(per_head(0.0f), kShape.hd, kShape.hd);
}

// Gemma 3 keeps its gains as 1 + w.
TEST(QkNorm, PerHeadOffsetGainAgainstReference) {
  check(per_head(1.0f), kShape.hd, kShape.hd);
}

// OLMo 2: all of a row's query values share one norm, all its key values another.
TEST(QkNorm, WholeAgainstReference) {
  const AttentionShape& s = kShape;
  check(whole(s), size_t(s.groups) * s.rep * s.hd, size_t(s.groups) * s.hd);
}

// The whole mode under tensor parallelism: rank r holds kv group r (its query heads, key and
// value, and its slices of the gains); the ranks' sums are added between the calls, and each
// rank's results are its slices of the one-piece results.
TEST(QkNorm, WholeSplitOverTwoRanksMatchesOnePiece) {
  const AttentionShape& s = kShape;
  const QkNorm n = whole(s);  // spans every rank's heads
  const int64_t N = rows(s), row = row_width(s), half = row / 2;
  const int64_t gq = int64_t(s.groups) * s.rep * s.hd, gk = int64_t(s.groups) * s.hd;
  auto x = test::randn(size_t(N * row), "x"), dy = test::randn(size_t(N * row), "dy");
  auto wq = test::randn(gq, "wq", 0.5f), wk = test::randn(gk, "wk", 0.5f);
  Pass one(s, n);
  one.forward(x, wq, wk);
  std::vector<float> dx(N * row), dwq(gq, 0.0f), dwk(gk, 0.0f);
  one.backward(dx, dwq, dwk, dy, x, wq, wk);

  AttentionShape rs = s;
  rs.groups = 1;
  // Rank r's columns of each row, and its slice of a gain.
  auto cols = [&](const std::vector<float>& v, int r) {
    std::vector<float> out;
    for (int64_t t = 0; t < N; ++t)
      out.insert(out.end(), v.begin() + t * row + r * half, v.begin() + t * row + (r + 1) * half);
    return out;
  };
  auto slice = [](const std::vector<float>& v, int r) {
    const size_t m = v.size() / 2;
    return std::vector<float>(v.begin() + r * m, v.begin() + (r + 1) * m);
  };
  std::vector<float> xr[2], dyr[2], wqr[2], wkr[2];
  std::vector<Pass> ranks;
  for (int r = 0; r < 2; ++r) {
    xr[r] = cols(x, r);
    dyr[r] = cols(dy, r);
    wqr[r] = slice(wq, r);
    wkr[r] = slice(wk, r);
    ranks.emplace_back(rs, n);
  }
  // Forward: each rank's Σ q², Σ k², all-reduced by hand.
  std::vector<float> sums(2 * N);
  for (int r = 0; r < 2; ++r) {
    qk_norm_sumsq(view(ranks[r].sumsq, {N, 2}), view(xr[r], {N, half}), rs);
  }
  for (int64_t i = 0; i < 2 * N; ++i) sums[i] = ranks[0].sumsq[i] + ranks[1].sumsq[i];
  for (int r = 0; r < 2; ++r) {
    qk_norm_forward(view(ranks[r].out, {N, half}), view(ranks[r].rstd, {N, 2}),
                    view(xr[r], {N, half}), view(wqr[r], {gq / 2}), view(wkr[r], {gk / 2}),
                    view(sums, {N, 2}), rs, n);
    EXPECT_LT(rel_err(ranks[r].out, cols(one.out, r)), 1e-6) << "rank " << r;
    EXPECT_LT(rel_err(ranks[r].rstd, one.rstd), 1e-6) << "rank " << r;
  }
  // Backward: each rank's dot, all-reduced by hand.
  std::vector<float> dots(2 * N);
  for (int r = 0; r < 2; ++r) {
    qk_norm_backward_dot(view(ranks[r].dot, {N, 2}), view(dyr[r], {N, half}),
                         view(xr[r], {N, half}), view(wqr[r], {gq / 2}), view(wkr[r], {gk / 2}),
                         view(ranks[r].rstd, {N, 2}), rs, n);
  }
  for (int64_t i = 0; i < 2 * N; ++i) dots[i] = ranks[0].dot[i] + ranks[1].dot[i];
  for (int r = 0; r < 2; ++r) {
    std::vector<float> dxr(N * half), dwqr(gq / 2, 0.0f), dwkr(gk / 2, 0.0f);
    qk_norm_backward(view(dxr, {N, half}), view(dwqr, {gq / 2}), view(dwkr, {gk / 2}),
                     view(dyr[r], {N, half}), view(xr[r], {N, half}), view(wqr[r], {gq / 2}),
                     view(wkr[r], {gk / 2}), view(ranks[r].rstd, {N, 2}), view(dots, {N, 2}), rs,
                     n);
    EXPECT_LT(rel_err(dxr, cols(dx, r)), 1e-5) << "rank " << r;
    EXPECT_LT(rel_err(dwqr, slice(dwq, r)), 1e-5) << "rank " << r;
    EXPECT_LT(rel_err(dwkr, slice(dwk, r)), 1e-5) << "rank " << r;
  }
}

// bf16 and fp16 storage: the fp32 results of the rounded inputs, each output rounded once (2u of
// the largest), the gains' gradients in fp32 or S.
template <typename S, typename G>
void check_half(const QkNorm& n, size_t gq, size_t gk, double u) {
  const AttentionShape& s = kShape;
  const int64_t N = rows(s), row = row_width(s), size = N * row;
  auto x = test::rounded<S>(test::randn(size, "x")), dy = test::rounded<S>(test::randn(size, "dy"));
  auto wq = test::rounded<S>(test::randn(gq, "wq", 0.5f));
  auto wk = test::rounded<S>(test::randn(gk, "wk", 0.5f));
  Pass f(s, n);
  f.forward(x, wq, wk);
  std::vector<float> fdx(size), fdwq(gq, 0.0f), fdwk(gk, 0.0f);
  f.backward(fdx, fdwq, fdwk, dy, x, wq, wk);

  auto tx = test::to_dtype<S>(x), tdy = test::to_dtype<S>(dy);
  auto twq = test::to_dtype<S>(wq), twk = test::to_dtype<S>(wk);
  std::vector<S> out(size), dx(size);
  std::vector<G> dwq(gq, from_f32<G>(0.0f)), dwk(gk, from_f32<G>(0.0f));
  std::vector<float> rstd(f.rstd.size()), sums(2 * N), dots(2 * N);
  const Tensor qkv = view(tx, {N, row}), tq = view(twq, {int64_t(gq)}),
               tk = view(twk, {int64_t(gk)});
  const Tensor tr = view(rstd, {int64_t(rstd.size())});
  if (!n.per_head) qk_norm_sumsq(view(sums, {N, 2}), qkv, s);
  qk_norm_forward(view(out, {N, row}), tr, qkv, tq, tk, n.per_head ? none() : view(sums, {N, 2}), s,
                  n);
  EXPECT_LT(rel_err(out, f.out), 2 * u);
  if (!n.per_head)
    qk_norm_backward_dot(view(dots, {N, 2}), view(tdy, {N, row}), qkv, tq, tk, tr, s, n);
  qk_norm_backward(view(dx, {N, row}), view(dwq, {int64_t(gq)}), view(dwk, {int64_t(gk)}),
                   view(tdy, {N, row}), qkv, tq, tk, tr, n.per_head ? none() : view(dots, {N, 2}),
                   s, n);
  EXPECT_LT(rel_err(dx, fdx), 2 * u);
  EXPECT_LT(rel_err(dwq, fdwq), 2 * u);
  EXPECT_LT(rel_err(dwk, fdwk), 2 * u);
}

TEST(QkNorm, HalfAgainstFp32) {
  const AttentionShape& s = kShape;
  const size_t wq = size_t(s.groups) * s.rep * s.hd, wk = size_t(s.groups) * s.hd;
  check_half<bf16, float>(per_head(1.0f), s.hd, s.hd, 0x1p-8);
  check_half<bf16, bf16>(per_head(0.0f), s.hd, s.hd, 0x1p-8);
  check_half<f16, float>(whole(s), wq, wk, 0x1p-11);
  check_half<f16, f16>(whole(s), wq, wk, 0x1p-11);
}

// The gains' gradients sum over rows and heads in a fixed order: the same bits on any number of
// threads (a shape large enough to run in parallel).
TEST(QkNorm, BackwardDeterministicAcrossThreadCounts) {
  const AttentionShape s{8, 64, 2, 2, 32};
  const QkNorm n = per_head(0.0f);
  const size_t size = size_t(rows(s) * row_width(s));
  auto x = test::randn(size, "x"), dy = test::randn(size, "dy");
  auto wq = test::randn(s.hd, "wq"), wk = test::randn(s.hd, "wk");
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Pass r(s, n);
    r.forward(x, wq, wk);
    std::vector<float> dx(size), dwq(s.hd, 0.0f), dwk(s.hd, 0.0f);
    r.backward(dx, dwq, dwk, dy, x, wq, wk);
    omp_set_num_threads(saved);
    dx.insert(dx.end(), dwq.begin(), dwq.end());
    dx.insert(dx.end(), dwk.begin(), dwk.end());
    return dx;
  };
  const auto first = run(2);
  EXPECT_TRUE(test::bit_equal(first, run(1)));
  EXPECT_TRUE(test::bit_equal(first, run(3)));
}

// Under a DryRun every call returns at once: nothing is read, checked or written.
TEST(QkNorm, DryRunTouchesNothing) {
  std::vector<float> out(4, 7.0f), qkv(4, 1.0f), w(2, 1.0f), stats(2, 7.0f);
  const QkNorm n = whole(kShape);
  DryRun dry;
  qk_norm_sumsq(view(stats, {2}), view(qkv, {4}), kShape);
  qk_norm_forward(view(out, {4}), view(stats, {2}), view(qkv, {4}), view(w, {2}), view(w, {2}),
                  view(stats, {2}), kShape, n);
  qk_norm_backward_dot(view(stats, {2}), view(qkv, {4}), view(qkv, {4}), view(w, {2}), view(w, {2}),
                       view(stats, {2}), kShape, n);
  qk_norm_backward(view(out, {4}), view(w, {2}), view(w, {2}), view(qkv, {4}), view(qkv, {4}),
                   view(w, {2}), view(w, {2}), view(stats, {2}), view(stats, {2}), kShape, n);
  EXPECT_EQ(out, std::vector<float>(4, 7.0f));
  EXPECT_EQ(stats, std::vector<float>(2, 7.0f));
  EXPECT_EQ(w, std::vector<float>(2, 1.0f));
}

}  // namespace
}  // namespace strata::ops
