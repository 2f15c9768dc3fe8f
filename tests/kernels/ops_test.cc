// The device-neutral interface (kernels/ops.h) on the CPU: the layouts the model fixes (grouped
// QKV, interleaved SwiGLU), the split backwards against the fused ones bit for bit, positions
// with an offset, the vocabulary-parallel cross-entropy against the serial one, the small ops,
// and the refusal of CUDA views.
#include "strata/kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/attention.h"

namespace strata::ops {
namespace {

using test::rel_err;

using test::tokens;
using test::view;

// --- attention on the grouped layout ------------------------------------------------------------

// Column of head h (0..rep-1 queries, rep the key, rep+1 the value) of group g in a qkv row.
int64_t head_col(const AttentionShape& s, int g, int h) {
  return (int64_t(g) * (s.rep + 2) + h) * s.hd;
}

// Causal attention in double, straight from the layout: query (g, r) attends with the key and
// value heads of group g; output head g·rep + r.
std::vector<double> attention_reference(const std::vector<float>& qkv, const AttentionShape& s) {
  const int64_t row = int64_t(s.groups) * (s.rep + 2) * s.hd,
                orow = int64_t(s.groups) * s.rep * s.hd;
  std::vector<double> out(size_t(s.B) * s.T * orow, 0.0), p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int g = 0; g < s.groups; ++g)
      for (int r = 0; r < s.rep; ++r)
        for (int t = 0; t < s.T; ++t) {
          const float* q = &qkv[(int64_t(b) * s.T + t) * row + head_col(s, g, r)];
          double mx = -1e300, sum = 0.0;
          for (int j = 0; j <= t; ++j) {
            const float* k = &qkv[(int64_t(b) * s.T + j) * row + head_col(s, g, s.rep)];
            double dot = 0.0;
            for (int d = 0; d < s.hd; ++d) dot += double(q[d]) * k[d];
            p[j] = dot / std::sqrt(double(s.hd));
            mx = std::max(mx, p[j]);
          }
          for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int j = 0; j <= t; ++j) {
            const float* v = &qkv[(int64_t(b) * s.T + j) * row + head_col(s, g, s.rep + 1)];
            double* o = &out[(int64_t(b) * s.T + t) * orow + (int64_t(g) * s.rep + r) * s.hd];
            for (int d = 0; d < s.hd; ++d) o[d] += p[j] / sum * v[d];
          }
        }
  return out;
}

// GQA with 1, 2 and 4 query heads per group, one group among them; T past one query block (64).
const AttentionShape kAttention[] = {
    {2, 5, 3, 1, 8}, {2, 6, 2, 2, 8}, {1, 9, 2, 4, 4}, {2, 7, 1, 4, 8}, {1, 70, 1, 2, 4}};

// att sized by attention_saved, on each of the CPU's paths.
template <typename F>
void on_each_attention_path(F&& f) {
  for (kernels::AttentionPath path :
       {kernels::AttentionPath::Tiled, kernels::AttentionPath::Materialized}) {
    SCOPED_TRACE(kernels::attention_path_name(path));
    kernels::set_attention_path(path);
    f();
  }
  kernels::set_attention_path(std::nullopt);
}

TEST(OpsAttention, GroupedForwardAgainstReference) {
  on_each_attention_path([] {
    for (const AttentionShape& s : kAttention) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " groups=" << s.groups
                                      << " rep=" << s.rep << " hd=" << s.hd);
      const int64_t NH = s.groups * s.rep;
      auto qkv = test::randn(size_t(s.B) * s.T * s.groups * (s.rep + 2) * s.hd, "qkv");
      const int64_t att_n = attention_saved(Device::CPU, DType::F32, s).numel;
      std::vector<float> out(size_t(s.B) * s.T * NH * s.hd), att(static_cast<size_t>(att_n));
      attention_forward(view(out, {s.B * s.T, NH * s.hd}), view(att, {att_n}),
                        view(qkv, {s.B * s.T, int64_t(qkv.size()) / (s.B * s.T)}), s);
      EXPECT_LT(rel_err(out, attention_reference(qkv, s)), 1e-5);
    }
  });
}

TEST(OpsAttention, GroupedBackwardMatchesFiniteDifferences) {
  on_each_attention_path([] {
    const AttentionShape s{1, 6, 2, 2, 4};
    const int64_t NH = s.groups * s.rep, row = s.groups * (s.rep + 2) * s.hd;
    auto qkv = test::randn(size_t(s.B) * s.T * row, "qkv");
    auto w = test::randn(size_t(s.B) * s.T * NH * s.hd, "w");
    std::vector<float> out(w.size());
    std::vector<float> att(static_cast<size_t>(attention_saved(Device::CPU, DType::F32, s).numel));
    auto loss = [&] {
      attention_forward(view(out, {s.B * s.T, NH * s.hd}), view(att, {int64_t(att.size())}),
                        view(qkv, {s.B * s.T, row}), s);
      return test::weighted_sum(w, out.data(), out.size());
    };
    loss();
    std::vector<float> dqkv(qkv.size(), 99.0f),
        scratch(std::max<size_t>(1, attention_backward_scratch_floats(Device::CPU, DType::F32, s)));
    attention_backward(view(dqkv, {s.B * s.T, row}), view(scratch, {int64_t(scratch.size())}),
                       view(w, {s.B * s.T, NH * s.hd}), view(qkv, {s.B * s.T, row}),
                       view(att, {int64_t(att.size())}), s);
    EXPECT_LT(rel_err(dqkv, test::numeric_grad(qkv, loss, 1e-3f)), 1e-2);
  });
}

// --- rope on the grouped layout
// -------------------------------------------------------------------

TEST(OpsRope, RotatesQueriesAndKeysNeverValues) {
  const AttentionShape s{2, 5, 2, 3, 8};
  const float theta = 10000.0f;
  const int64_t row = s.groups * (s.rep + 2) * s.hd;
  auto x = test::randn(size_t(s.B) * s.T * row, "x");
  std::vector<double> ref(x.begin(), x.end());
  const int half = s.hd / 2;
  for (int64_t n = 0; n < s.B * s.T; ++n)
    for (int g = 0; g < s.groups; ++g)
      for (int h = 0; h <= s.rep; ++h)
        for (int i = 0; i < half; ++i) {
          double angle = double(n % s.T) * std::pow(double(theta), -2.0 * i / s.hd);
          int64_t lo = n * row + head_col(s, g, h) + i, hi = lo + half;
          ref[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
          ref[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
        }
  auto y = x;
  rope_forward(view(y, {s.B * s.T, row}), s, rope_default(s.hd, theta));
  EXPECT_LT(rel_err(y, ref), 2e-6);
  for (int64_t n = 0; n < s.B * s.T; ++n)
    for (int g = 0; g < s.groups; ++g)
      for (int d = 0; d < s.hd; ++d) {
        const int64_t i = n * row + head_col(s, g, s.rep + 1) + d;
        ASSERT_EQ(y[i], x[i]) << "value head of group " << g << " moved at row " << n;
      }
  // The backward is the inverse rotation.
  rope_backward(view(y, {s.B * s.T, row}), s, rope_default(s.hd, theta));
  EXPECT_LT(rel_err(y, x), 1e-6);
}

// --- SwiGLU, interleaved
// --------------------------------------------------------------------------

TEST(OpsSwiGlu, InterleavedAgainstReference) {
  const int64_t N = 5, F = 19;
  auto x = test::randn(size_t(N) * 2 * F, "x", 2.0f), dy = test::randn(size_t(N) * F, "dy");
  std::vector<float> out(N * F), dx(2 * N * F, 7.0f);
  swiglu_forward(view(out, {N, F}), view(x, {N, 2 * F}));
  swiglu_backward(view(dx, {N, 2 * F}), view(dy, {N, F}), view(x, {N, 2 * F}));
  std::vector<double> ref(N * F), dref(2 * N * F);
  for (int64_t i = 0; i < N * F; ++i) {
    const double g = x[2 * i], u = x[2 * i + 1], sg = 1.0 / (1.0 + std::exp(-g));
    ref[i] = g * sg * u;
    dref[2 * i] = dy[i] * u * sg * (1.0 + g * (1.0 - sg));
    dref[2 * i + 1] = dy[i] * g * sg;
  }
  EXPECT_LT(rel_err(out, ref), 1e-6);
  EXPECT_LT(rel_err(dx, dref), 1e-6);
}

// --- split backwards, bit for bit
// -----------------------------------------------------------------

template <typename S, typename G>
void check_linear_split() {
  const int64_t M = 37, K = 24, N = 40;
  auto x = test::to_dtype<S>(test::randn(M * K, "x")),
       w = test::to_dtype<S>(test::randn(N * K, "w"));
  auto dy = test::to_dtype<S>(test::randn(M * N, "dy"));
  auto dw0 = test::to_dtype<G>(test::randn(N * K, "dw0")),
       db0 = test::to_dtype<G>(test::randn(N, "db0"));
  std::vector<S> dx_fused(M * K), dx_split(M * K, from_f32<S>(5.0f));
  auto dw_fused = dw0, dw_split = dw0, db_fused = db0, db_split = db0;
  linear_backward(view(dx_fused, {M, K}), view(dw_fused, {N, K}), view(db_fused, {N}),
                  view(dy, {M, N}), view(x, {M, K}), view(w, {N, K}));
  linear_backward_input(view(dx_split, {M, K}), view(dy, {M, N}), view(w, {N, K}), false);
  linear_backward_weight(view(dw_split, {N, K}), view(db_split, {N}), view(dy, {M, N}),
                         view(x, {M, K}));
  EXPECT_TRUE(test::bit_equal(dx_split, dx_fused));
  EXPECT_TRUE(test::bit_equal(dw_split, dw_fused));
  EXPECT_TRUE(test::bit_equal(db_split, db_fused));
  // The bias gradient alone (dw and x absent), and dw alone.
  auto db_only = db0, dw_only = dw0;
  linear_backward_weight(Tensor(), view(db_only, {N}), view(dy, {M, N}), Tensor());
  linear_backward_weight(view(dw_only, {N, K}), Tensor(), view(dy, {M, N}), view(x, {M, K}));
  EXPECT_TRUE(test::bit_equal(db_only, db_fused));
  EXPECT_TRUE(test::bit_equal(dw_only, dw_fused));
  // accumulate adds the same product to what dx holds.
  auto dx_acc = test::to_dtype<S>(test::randn(M * K, "dx0"));
  auto expect = test::to_float(dx_acc);
  for (size_t i = 0; i < expect.size(); ++i) expect[i] += to_f32(dx_fused[i]);
  linear_backward_input(view(dx_acc, {M, K}), view(dy, {M, N}), view(w, {N, K}), true);
  EXPECT_LT(rel_err(dx_acc, expect), dtype_of<S>() == DType::F32 ? 1e-6 : 1e-2);
}

TEST(OpsLinear, SplitBackwardBitIdenticalToFused) {
  check_linear_split<float, float>();
  check_linear_split<bf16, float>();
  check_linear_split<bf16, bf16>();
  check_linear_split<f16, float>();
}

// add_bias is the bias of linear_forward, applied apart (as after a row-parallel product).
template <typename S>
void check_add_bias() {
  const int64_t M = 9, K = 8, N = 70;
  auto x = test::to_dtype<S>(test::randn(M * K, "x")),
       w = test::to_dtype<S>(test::randn(N * K, "w"));
  auto b = test::to_dtype<S>(test::randn(N, "b"));
  std::vector<S> fused(M * N), apart(M * N);
  linear_forward(view(fused, {M, N}), view(x, {M, K}), view(w, {N, K}), view(b, {N}));
  linear_forward(view(apart, {M, N}), view(x, {M, K}), view(w, {N, K}), Tensor());
  const auto product = apart;
  add_bias(view(apart, {M, N}), view(b, {N}));
  EXPECT_TRUE(test::bit_equal(apart, fused));
  for (int64_t i = 0; i < M * N; ++i) {  // one rounding of the fp32 sum
    const S want = from_f32<S>(to_f32(product[i]) + to_f32(b[i % N]));
    ASSERT_EQ(std::memcmp(&apart[i], &want, sizeof(S)), 0) << "element " << i;
  }
}

TEST(OpsLinear, AddBiasIsLinearForwardsBias) {
  check_add_bias<float>();
  check_add_bias<bf16>();
  check_add_bias<f16>();
}

// Several row blocks and enough work for every thread.
template <typename S, typename G>
void check_norm_split() {
  const int64_t N = 150, C = 260;
  auto x = test::to_dtype<S>(test::randn(N * C, "x")), w = test::to_dtype<S>(test::randn(C, "w"));
  auto b = test::to_dtype<S>(test::randn(C, "b")), dy = test::to_dtype<S>(test::randn(N * C, "dy"));
  std::vector<S> out(N * C);
  std::vector<float> mean(N), rstd(N), scratch(norm_backward_scratch_floats(N, C));
  auto dx0 = test::to_dtype<S>(test::randn(N * C, "dx0"));
  auto dw0 = test::to_dtype<G>(test::randn(C, "dw0")),
       db0 = test::to_dtype<G>(test::randn(C, "db0"));
  Tensor sc = view(scratch, {int64_t(scratch.size())});

  layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}),
                    view(w, {C}), view(b, {C}), 1e-5f);
  auto dx_f = dx0, dx_s = dx0;
  auto dw_f = dw0, dw_s = dw0, db_f = db0, db_s = db0;
  layernorm_backward(view(dx_f, {N, C}), view(dw_f, {C}), view(db_f, {C}), sc, view(dy, {N, C}),
                     view(x, {N, C}), view(w, {C}), view(mean, {N}), view(rstd, {N}));
  layernorm_backward_input(view(dx_s, {N, C}), view(dy, {N, C}), view(x, {N, C}), view(w, {C}),
                           view(mean, {N}), view(rstd, {N}));
  layernorm_backward_weight(view(dw_s, {C}), view(db_s, {C}), sc, view(dy, {N, C}), view(x, {N, C}),
                            view(mean, {N}), view(rstd, {N}));
  EXPECT_TRUE(test::bit_equal(dx_s, dx_f));
  EXPECT_TRUE(test::bit_equal(dw_s, dw_f));
  EXPECT_TRUE(test::bit_equal(db_s, db_f));

  rmsnorm_forward(view(out, {N, C}), view(rstd, {N}), view(x, {N, C}), view(w, {C}), 1e-5f);
  dx_f = dx_s = dx0;
  dw_f = dw_s = dw0;
  rmsnorm_backward(view(dx_f, {N, C}), view(dw_f, {C}), sc, view(dy, {N, C}), view(x, {N, C}),
                   view(w, {C}), view(rstd, {N}));
  rmsnorm_backward_input(view(dx_s, {N, C}), view(dy, {N, C}), view(x, {N, C}), view(w, {C}),
                         view(rstd, {N}));
  rmsnorm_backward_weight(view(dw_s, {C}), sc, view(dy, {N, C}), view(x, {N, C}), view(rstd, {N}));
  EXPECT_TRUE(test::bit_equal(dx_s, dx_f));
  EXPECT_TRUE(test::bit_equal(dw_s, dw_f));
}

TEST(OpsNorm, SplitBackwardBitIdenticalToFused) {
  check_norm_split<float, float>();
  check_norm_split<bf16, float>();
  check_norm_split<bf16, bf16>();
}

// --- positions with an offset
// ---------------------------------------------------------------------

TEST(OpsPosition, RowsStartAtPos0) {
  const int64_t T = 6, C = 5, N = 15, pos0 = 4;  // rows 4, 5, 0, 1, … of the sequence
  auto wpe = test::randn(T * C, "wpe"), base = test::randn(N * C, "base");
  auto dout = test::randn(N * C, "dout"), dwpe0 = test::randn(T * C, "dwpe0");
  auto out = base, dwpe = dwpe0;
  position_forward(view(out, {N, C}), view(wpe, {T, C}), T, pos0);
  position_backward(view(dwpe, {T, C}), view(dout, {N, C}), T, pos0);
  std::vector<double> ref(base.begin(), base.end()), dref(dwpe0.begin(), dwpe0.end());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      ref[n * C + c] += wpe[((pos0 + n) % T) * C + c];
      dref[((pos0 + n) % T) * C + c] += dout[n * C + c];
    }
  EXPECT_LT(rel_err(out, ref), 1e-6);
  EXPECT_LT(rel_err(dwpe, dref), 1e-6);
}

// Context parallelism's positions: row n of a sequence part sits at pos[(pos0 + n) % T], the
// table holding the whole sequence's rows; RoPE rotates row t by pos[t] (the same as the row at
// that position of a whole sequence).
TEST(OpsPosition, MappedPositionsReadTheirOwnRows) {
  const int64_t T = 4, Tw = 16, C = 3, N = 8;       // two sequences' parts of 4 rows
  const std::vector<int32_t> pos = {2, 3, 12, 13};  // the zig-zag chunks 1 and 6 of 8
  auto wpe = test::randn(Tw * C, "wpe"), base = test::randn(N * C, "base");
  auto dout = test::randn(N * C, "dout"), dwpe0 = test::randn(Tw * C, "dwpe0");
  auto out = base, dwpe = dwpe0;
  position_forward(view(out, {N, C}), view(wpe, {Tw, C}), T, 0, pos.data());
  position_backward(view(dwpe, {Tw, C}), view(dout, {N, C}), T, 0, pos.data());
  std::vector<double> ref(base.begin(), base.end()), dref(dwpe0.begin(), dwpe0.end());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      ref[n * C + c] += wpe[pos[n % T] * C + c];
      dref[pos[n % T] * C + c] += dout[n * C + c];
    }
  EXPECT_LT(rel_err(out, ref), 1e-6);
  EXPECT_LT(rel_err(dwpe, dref), 1e-6);
  // RoPE of a part equals the whole sequence's rows at those positions.
  const AttentionShape whole{1, int(Tw), 1, 1, 8};
  AttentionShape part{1, int(T), 1, 1, 8, pos.data()};
  auto qkv = test::randn(Tw * 3 * 8, "qkv");
  std::vector<float> mine;
  for (int32_t p : pos) mine.insert(mine.end(), qkv.begin() + p * 24, qkv.begin() + p * 24 + 24);
  rope_forward(view(qkv, {Tw, 24}), whole, rope_default(8, 10000.0f));
  rope_forward(view(mine, {T, 24}), part, rope_default(8, 10000.0f));
  for (int64_t t = 0; t < T; ++t) {
    for (int k = 0; k < 24; ++k) EXPECT_EQ(mine[t * 24 + k], qkv[pos[t] * 24 + k]) << t << " " << k;
  }
}

// copy_2d moves a block of rows between strides and touches nothing else.
TEST(OpsCopy2d, BlocksMoveBetweenStrides) {
  std::vector<float> src(5 * 7), dst(4 * 9, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  copy_2d(view(dst, {36}).slice0(2, 36), 9, view(src, {35}).slice0(1, 35), 7, 4, 3);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 9; ++c) {
      const bool in = c >= 2 && c < 5;
      EXPECT_EQ(dst[r * 9 + c], in ? src[1 + r * 7 + (c - 2)] : -1.0f) << r << " " << c;
    }
  EXPECT_THROW(copy_2d(view(dst, {36}), 9, view(src, {35}), 7, 5, 3), Error);  // dst too small
}

// --- vocabulary-parallel cross-entropy
// ------------------------------------------------------------

// Runs the three steps on `ranks` shards of width Vl (vocabulary columns [k·Vl, (k+1)·Vl), valid
// up to V), doing the two reductions the way the ranks would (max_rows over the gathered maxima,
// the sums added in rank order). Returns the losses of rank 0 and the dlogits (N, V) gathered from
// the valid columns; checks that every rank computes the same losses and padding gets 0.
struct VocabCe {
  std::vector<float> losses, dlogits;
};
VocabCe vocab_parallel(const std::vector<float>& logits, std::vector<int32_t>& targets, int64_t V,
                       int ranks, int64_t Vl, bool train, float dloss) {
  const int64_t N = int64_t(targets.size());
  std::vector<std::vector<float>> shard(ranks, std::vector<float>(N * Vl));
  for (int k = 0; k < ranks; ++k)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vl; ++j) {
        const int64_t col = k * Vl + j;  // padding holds large values that must never count
        shard[k][n * Vl + j] = col < V ? logits[n * V + col] : 1e4f;
      }
  auto valid = [&](int k) { return std::clamp<int64_t>(V - k * Vl, 0, Vl); };
  std::vector<float> maxima(ranks * N), gmax(N), sums(2 * N, 0.0f), part(2 * N);
  for (int k = 0; k < ranks; ++k) {
    Tensor rowmax(maxima.data() + k * N, DType::F32, {N});
    vocab_ce_max(rowmax, view(shard[k], {N, Vl}), valid(k));
  }
  max_rows(view(gmax, {N}), view(maxima, {ranks, N}));
  for (int k = 0; k < ranks; ++k) {
    vocab_ce_sums(view(part, {2, N}), view(shard[k], {N, Vl}), tokens(targets), view(gmax, {N}),
                  k * Vl, valid(k));
    for (int64_t i = 0; i < 2 * N; ++i) sums[i] += part[i];
  }
  // The statistics the backward takes: gmax, then sums.
  std::vector<float> stats(gmax);
  stats.insert(stats.end(), sums.begin(), sums.end());
  VocabCe r{std::vector<float>(N), std::vector<float>(N * V)};
  for (int k = 0; k < ranks; ++k) {
    std::vector<float> losses(N);
    vocab_ce_finish(view(losses, {N}), tokens(targets), view(gmax, {N}), view(sums, {2, N}));
    if (train) {
      ce_dlogits(view(shard[k], {N, Vl}), Vl, view(shard[k], {N, Vl}), tokens(targets),
                 view(stats, {3, N}), 0, Vl, k * Vl, valid(k), dloss);
    }
    if (k == 0) r.losses = losses;
    EXPECT_TRUE(test::bit_equal(losses, r.losses)) << "rank " << k;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < Vl; ++j) {
        const int64_t col = k * Vl + j;
        if (col < V) {
          r.dlogits[n * V + col] = shard[k][n * Vl + j];
        } else if (train) {
          EXPECT_EQ(shard[k][n * Vl + j], 0.0f) << "padding column " << col << " row " << n;
        }
      }
  }
  return r;
}

TEST(OpsVocabCe, ShardsAgreeWithSerial) {
  const int64_t N = 9, V = 49;
  auto logits = test::randn(N * V, "logits", 3.0f);
  auto targets = test::randint(N, "targets", int(V));
  targets[2] = -1;  // ignored rows
  targets[6] = -100;
  targets[4] = int32_t(V - 1);  // the last valid column, next to the padding
  const float dloss = 1.0f / 7.0f;
  std::vector<float> serial_losses(N), serial_stats(3 * N), serial_dlogits = logits;
  cross_entropy_stats(view(serial_losses, {N}), view(serial_stats, {3, N}),
                      view(serial_dlogits, {N, V}), tokens(targets));
  ce_dlogits(view(serial_dlogits, {N, V}), V, view(serial_dlogits, {N, V}), tokens(targets),
             view(serial_stats, {3, N}), 0, V, 0, V, dloss);

  // One rank without padding computes exactly the serial numbers.
  VocabCe one = vocab_parallel(logits, targets, V, 1, V, true, dloss);
  EXPECT_TRUE(test::bit_equal(one.losses, serial_losses));
  EXPECT_TRUE(test::bit_equal(one.dlogits, serial_dlogits));

  // 2 ranks of 28 (7 padding columns), 3 of 20 (11), 3 of 25 (the last rank all padding).
  const std::pair<int, int64_t> layouts[] = {{2, 28}, {3, 20}, {3, 25}};
  for (auto [ranks, Vl] : layouts) {
    SCOPED_TRACE(testing::Message() << ranks << " ranks of " << Vl << " columns");
    VocabCe r = vocab_parallel(logits, targets, V, ranks, Vl, true, dloss);
    EXPECT_LT(rel_err(r.losses, serial_losses), 1e-6);
    EXPECT_LT(rel_err(r.dlogits, serial_dlogits), 1e-6);
    EXPECT_EQ(r.losses[2], 0.0f);
    EXPECT_EQ(r.losses[6], 0.0f);
    for (int64_t j = 0; j < V; ++j) EXPECT_EQ(r.dlogits[2 * V + j], 0.0f);
    // Evaluation: the same losses, logits untouched.
    VocabCe e = vocab_parallel(logits, targets, V, ranks, Vl, false, 0.0f);
    EXPECT_TRUE(test::bit_equal(e.losses, r.losses));
    EXPECT_TRUE(test::bit_equal(e.dlogits, logits));
  }
}

// --- the small ops
// ----------------------------------------------------------------------------------

TEST(OpsGemm, TransposesAgainstReference) {
  const int64_t M = 7, N = 5, K = 6, ld = 9;  // operands stored with a row stride past their width
  auto a = test::randn(M * ld, "a"), b = test::randn(K * ld, "b"), c0 = test::randn(M * ld, "c");
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      auto c = c0;
      Gemm g{M, N, K, ta, tb, ld, ld, ld, 0.5f, true};
      auto at = [&](int64_t i, int64_t k) { return double(ta ? a[k * ld + i] : a[i * ld + k]); };
      auto bt = [&](int64_t k, int64_t j) { return double(tb ? b[j * ld + k] : b[k * ld + j]); };
      gemm(view(c, {M, ld}), view(a, {int64_t(a.size())}), view(b, {int64_t(b.size())}), g);
      std::vector<double> ref(c0.begin(), c0.end());
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0;
          for (int64_t k = 0; k < K; ++k) s += at(i, k) * bt(k, j);
          ref[i * ld + j] += 0.5 * s;
        }
      EXPECT_LT(rel_err(c, ref), 1e-6);  // columns past N untouched
    }
}

TEST(OpsMemory, CopyAddScaleSums) {
  auto x = test::randn(1000, "x"), y = test::randn(1000, "y");
  std::vector<bf16> xb(1000);
  copy(view(xb, {1000}), view(x, {1000}));
  EXPECT_TRUE(test::bit_equal(xb, test::to_dtype<bf16>(x)));
  const std::vector<bf16> y0 = test::to_dtype<bf16>(y);
  auto yb = y0;
  add_inplace(view(yb, {1000}), view(xb, {1000}));
  for (size_t i = 0; i < yb.size(); ++i) {  // one rounding of the fp32 sum
    ASSERT_EQ(yb[i].bits, from_f32<bf16>(to_f32(y0[i]) + to_f32(xb[i])).bits);
  }
  scale_inplace(view(y, {1000}), 2.0f);
  double s = 0.0, ss = 0.0;
  for (float v : y) s += v, ss += double(v) * v;
  EXPECT_NEAR(sum(view(y, {1000})), s, 1e-9 * ss);
  EXPECT_NEAR(sum_squares(view(y, {1000})), ss, 1e-12 * ss);
  fill_zero(view(y, {1000}));
  EXPECT_EQ(sum_squares(view(y, {1000})), 0.0);
}

TEST(OpsMaxRows, MaxOverTheFirstDimension) {
  std::vector<float> in = {1, -2, 3, -INFINITY, 5, -1, 0, -INFINITY, 2}, out(3);
  max_rows(view(out, {3}), view(in, {3, 3}));
  EXPECT_EQ(out, (std::vector<float>{1, 5, 3}));
}

TEST(OpsTokens, ChecksTheVocabularyAndCountsTargets) {
  std::vector<int32_t> in = {0, 3, 9, 2}, tg = {3, -1, 9, -100};
  EXPECT_EQ(check_tokens(tokens(in), tokens(tg), 10), 2);
  in[2] = 10;
  try {
    check_tokens(tokens(in), tokens(tg), 10);
    FAIL() << "token 10 of a vocabulary of 10 passed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input token 10 at position 2"), std::string::npos)
        << e.what();
  }
  in[2] = 9;
  tg[0] = 10;
  EXPECT_THROW(check_tokens(tokens(in), tokens(tg), 10), InputError);
}

TEST(OpsOptimizer, AdamWithoutParamUpdatesMaster) {
  auto master = test::randn(100, "p"), grad = test::randn(100, "g");
  std::vector<float> m(100, 0.0f), v(100, 0.0f);
  auto p = master;
  AdamArgs a;
  a.lr = 0.1f;
  adam_step(view(master, {100}), Tensor(), view(grad, {100}), view(m, {100}), view(v, {100}), a);
  // First step, no decay: each element moves by lr·g/(|g| + eps) ≈ ±lr.
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(master[i], p[i] - 0.1f * (grad[i] > 0 ? 1 : -1), 1e-5);
  std::vector<float> buf(100);
  SgdArgs s;
  s.lr = 1.0f;
  s.momentum = 0.9f;
  p = master;
  sgd_step(view(master, {100}), Tensor(), view(grad, {100}), view(buf, {100}), s);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_FLOAT_EQ(master[i], p[i] - grad[i]);
}

// --- devices and dtypes
// ---------------------------------------------------------------------------

TEST(OpsDevice, CudaViewsAreRefused) {
  std::vector<float> host(16);
  Tensor cuda(host.data(), DType::F32, {16}, Device::CUDA);
  try {
    fill_zero(cuda);
    FAIL() << "a CUDA view was accepted";
  } catch (const Error& e) {
#if STRATA_HAVE_CUDA
    // Built with the backend: a CUDA view needs a GPU selected first (ops::init_device).
    const char* want = "before a GPU is selected";
#else
    const char* want = "this strata is built without the CUDA backend";
#endif
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_THROW(gelu_forward(cuda, cuda), Error);
  // Views of one call on two devices.
  EXPECT_THROW(copy(view(host, {16}), cuda), Error);
}

TEST(OpsDtype, MismatchesAreRefused) {
  std::vector<float> x(16);
  std::vector<bf16> y(16);
  EXPECT_THROW(add_inplace(view(x, {16}), view(y, {16})), Error);
  EXPECT_THROW(add_inplace(view(x, {16}), view(x, {8})), Error);
  std::vector<int32_t> t(4);
  EXPECT_THROW(scale_inplace(tokens(t), 2.0f), Error);
  // fp32 values with bf16 gradients are not a pair the kernels are built for.
  std::vector<float> dy(8), xx(8);
  std::vector<bf16> dw(16);
  EXPECT_THROW(
      linear_backward_weight(view(dw, {4, 4}), Tensor(), view(dy, {2, 4}), view(xx, {2, 4})),
      Error);
}

}  // namespace
}  // namespace strata::ops
