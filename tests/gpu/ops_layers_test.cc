// The layers' ops on the GPU against the CPU backend: LayerNorm and RMSNorm forward and backward
// (and the split backward equal to the fused one bit for bit on the GPU, as on the CPU), GELU,
// SwiGLU, rotary embedding, and the token and position embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

const auto kDtypes = ::testing::Values(DType::F32, DType::BF16, DType::F16);
std::string dtype_param_name(const ::testing::TestParamInfo<DType>& p) {
  return dtype_name(p.param);
}

// --- normalisation ----------------------------------------------------------------------------

constexpr int64_t kRows = 150;
// Widths: GPT-2 small's, a narrow one, and one that is no multiple of 8 (no vector tail free).
constexpr int64_t kWidths[] = {64, 197, 768};

// x (N, C): row n is offset by up to ±3 (a norm that skipped the mean would not pass).
std::vector<float> norm_input(int64_t N, int64_t C, uint64_t seed) {
  auto x = random(N * C, seed);
  const auto offset = random(N, seed + 1, 3.0f);
  for (int64_t i = 0; i < N * C; ++i) x[i] += offset[i / C];
  return x;
}

// w around 1, b around 0.
std::vector<float> gain(int64_t C, uint64_t seed) {
  auto w = random(C, seed, 0.5f);
  for (float& v : w) v += 1.0f;
  return w;
}

class GpuNorm : public ::testing::TestWithParam<DType> {};

// out, mean and rstd (fp32) of LayerNorm; out and rstd of RMSNorm.
TEST_P(GpuNorm, Forward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = kRows;
  for (int64_t C : kWidths) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const auto x = norm_input(N, C, 1), w = gain(C, 3), b = random(C, 4);
    auto run = [&](Device d) {
      auto xt = make(d, dt, {N, C}, x), wt = make(d, dt, {C}, w), bt = make(d, dt, {C}, b);
      auto out = make(d, dt, {N, C}, random(N * C, 5, 9.0f));
      auto mean = make(d, DType::F32, {N}, random(N, 6, 9.0f));
      auto rstd = make(d, DType::F32, {N}, random(N, 7, 9.0f));
      ops::layernorm_forward(out->t, mean->t, rstd->t, xt->t, wt->t, bt->t, 1e-5f);
      std::vector<std::vector<float>> r = {values(out->t), values(mean->t), values(rstd->t)};
      ops::rmsnorm_forward(out->t, rstd->t, xt->t, wt->t, 1e-5f);
      r.push_back(values(out->t));
      r.push_back(values(rstd->t));
      return r;
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(dt))) << "layernorm out";
    EXPECT_TRUE(close(got[1], want[1], tolerance(DType::F32))) << "layernorm mean";
    EXPECT_TRUE(close(got[2], want[2], tolerance(DType::F32))) << "layernorm rstd";
    EXPECT_TRUE(close(got[3], want[3], tolerance(dt))) << "rmsnorm out";
    EXPECT_TRUE(close(got[4], want[4], tolerance(DType::F32))) << "rmsnorm rstd";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuNorm, kDtypes, dtype_param_name);

class GpuNormGrads : public ::testing::TestWithParam<SG> {};

// The inputs of a norm backward: the saved statistics come from the CPU's forward, so that both
// devices run the backward on the same bits.
struct NormCase {
  int64_t N, C;
  std::vector<float> x, w, dy, dx0, dw0, db0, mean, rstd, rms_rstd;
};
NormCase norm_case(DType s, int64_t N, int64_t C) {
  NormCase c;
  c.N = N, c.C = C;
  c.x = norm_input(N, C, 8), c.w = gain(C, 10), c.dy = random(N * C, 11);
  c.dx0 = random(N * C, 12), c.dw0 = random(C, 13, 2.0f), c.db0 = random(C, 14, 2.0f);
  auto x = make(kCpu, s, {N, C}, c.x), w = make(kCpu, s, {C}, c.w);
  auto out = make(kCpu, s, {N, C}, std::vector<float>(N * C));
  auto mean = make(kCpu, DType::F32, {N}, std::vector<float>(N));
  auto rstd = make(kCpu, DType::F32, {N}, std::vector<float>(N));
  ops::layernorm_forward(out->t, mean->t, rstd->t, x->t, w->t, Tensor(), 1e-5f);
  c.mean = values(mean->t);
  c.rstd = values(rstd->t);
  ops::rmsnorm_forward(out->t, rstd->t, x->t, w->t, 1e-5f);
  c.rms_rstd = values(rstd->t);
  return c;
}

// The views of one backward call on device d: dx, dw, db hold dx0, dw0, db0 before it.
struct NormViews {
  std::unique_ptr<Held> x, w, dy, dx, dw, db, mean, rstd, rms_rstd, scratch;
};
NormViews norm_views(Device d, const NormCase& c, SG sg) {
  const int64_t N = c.N, C = c.C;
  const auto scratch = int64_t(ops::norm_backward_scratch_floats(N, C));
  return {make(d, sg.s, {N, C}, c.x),
          make(d, sg.s, {C}, c.w),
          make(d, sg.s, {N, C}, c.dy),
          make(d, sg.s, {N, C}, c.dx0),
          make(d, sg.g, {C}, c.dw0),
          make(d, sg.g, {C}, c.db0),
          make(d, DType::F32, {N}, c.mean),
          make(d, DType::F32, {N}, c.rstd),
          make(d, DType::F32, {N}, c.rms_rstd),
          make(d, DType::F32, {scratch}, std::vector<float>(size_t(scratch)))};
}

// Fused LayerNorm and RMSNorm backward: dx, dw, db added to what they hold.
TEST_P(GpuNormGrads, FusedBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  for (int64_t C : kWidths) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const NormCase c = norm_case(sg.s, kRows, C);
    auto run = [&](Device d, bool rms) {
      NormViews v = norm_views(d, c, sg);
      if (rms) {
        ops::rmsnorm_backward(v.dx->t, v.dw->t, v.scratch->t, v.dy->t, v.x->t, v.w->t,
                              v.rms_rstd->t);
      } else {
        ops::layernorm_backward(v.dx->t, v.dw->t, v.db->t, v.scratch->t, v.dy->t, v.x->t, v.w->t,
                                v.mean->t, v.rstd->t);
      }
      return std::vector{values(v.dx->t), values(v.dw->t), values(v.db->t)};
    };
    for (bool rms : {false, true}) {
      SCOPED_TRACE(rms ? "rmsnorm" : "layernorm");
      const auto got = run(kGpu, rms), want = run(kCpu, rms);
      EXPECT_TRUE(close(got[0], want[0], tolerance(sg.s))) << "dx";
      EXPECT_TRUE(close(got[1], want[1], tolerance(sg.g))) << "dw";
      EXPECT_TRUE(close(got[2], want[2], tolerance(sg.g))) << "db";
    }
  }
}

// The split backward (input, then weights) gives the fused one's bits on the GPU too: the
// engine defers the weight half and its results may not change by it.
TEST_P(GpuNormGrads, SplitBackwardEqualsFusedOnTheGpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  for (int64_t C : kWidths) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const NormCase c = norm_case(sg.s, kRows, C);
    NormViews f = norm_views(kGpu, c, sg), s = norm_views(kGpu, c, sg);
    ops::layernorm_backward(f.dx->t, f.dw->t, f.db->t, f.scratch->t, f.dy->t, f.x->t, f.w->t,
                            f.mean->t, f.rstd->t);
    ops::layernorm_backward_input(s.dx->t, s.dy->t, s.x->t, s.w->t, s.mean->t, s.rstd->t);
    ops::layernorm_backward_weight(s.dw->t, s.db->t, s.scratch->t, s.dy->t, s.x->t, s.mean->t,
                                   s.rstd->t);
    EXPECT_TRUE(identical(values(s.dx->t), values(f.dx->t))) << "layernorm dx";
    EXPECT_TRUE(identical(values(s.dw->t), values(f.dw->t))) << "layernorm dw";
    EXPECT_TRUE(identical(values(s.db->t), values(f.db->t))) << "layernorm db";

    f = norm_views(kGpu, c, sg), s = norm_views(kGpu, c, sg);
    ops::rmsnorm_backward(f.dx->t, f.dw->t, f.scratch->t, f.dy->t, f.x->t, f.w->t, f.rms_rstd->t);
    ops::rmsnorm_backward_input(s.dx->t, s.dy->t, s.x->t, s.w->t, s.rms_rstd->t);
    ops::rmsnorm_backward_weight(s.dw->t, s.scratch->t, s.dy->t, s.x->t, s.rms_rstd->t);
    EXPECT_TRUE(identical(values(s.dx->t), values(f.dx->t))) << "rmsnorm dx";
    EXPECT_TRUE(identical(values(s.dw->t), values(f.dw->t))) << "rmsnorm dw";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuNormGrads, sg_pairs(), sg_name);

// --- activations --------------------------------------------------------------------------------

class GpuActivation : public ::testing::TestWithParam<DType> {};

// GELU (tanh form) and its gradient over x in [-6, 6], tails included; dx starts as garbage.
TEST_P(GpuActivation, Gelu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 130, C = 768;
  const auto x = random(N * C, 20, 6.0f), dy = random(N * C, 21);
  auto run = [&](Device d) {
    auto xt = make(d, dt, {N, C}, x), dyt = make(d, dt, {N, C}, dy);
    auto out = make(d, dt, {N, C}, random(N * C, 22, 9.0f));
    auto dx = make(d, dt, {N, C}, random(N * C, 23, 9.0f));
    ops::gelu_forward(out->t, xt->t);
    ops::gelu_backward(dx->t, xt->t, dyt->t);
    return std::pair{values(out->t), values(dx->t)};
  };
  const auto [got_out, got_dx] = run(kGpu);
  const auto [want_out, want_dx] = run(kCpu);
  EXPECT_TRUE(close(got_out, want_out, tolerance(dt))) << "forward";
  EXPECT_TRUE(close(got_dx, want_dx, tolerance(dt))) << "backward";
}

// SwiGLU over interleaved (gate f, up f) columns, forward and backward (dx overwritten).
TEST_P(GpuActivation, SwiGlu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 130, F = 352;
  const auto x = random(N * 2 * F, 24, 4.0f), dy = random(N * F, 25);
  auto run = [&](Device d) {
    auto xt = make(d, dt, {N, 2 * F}, x), dyt = make(d, dt, {N, F}, dy);
    auto out = make(d, dt, {N, F}, random(N * F, 26, 9.0f));
    auto dx = make(d, dt, {N, 2 * F}, random(N * 2 * F, 27, 9.0f));
    ops::swiglu_forward(out->t, xt->t);
    ops::swiglu_backward(dx->t, dyt->t, xt->t);
    return std::pair{values(out->t), values(dx->t)};
  };
  const auto [got_out, got_dx] = run(kGpu);
  const auto [want_out, want_dx] = run(kCpu);
  EXPECT_TRUE(close(got_out, want_out, tolerance(dt))) << "forward";
  EXPECT_TRUE(close(got_dx, want_dx, tolerance(dt))) << "backward";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuActivation, kDtypes, dtype_param_name);

// --- rotary embedding -------------------------------------------------------------------------

class GpuRope : public ::testing::TestWithParam<DType> {};

// rope_forward and rope_backward in place on the grouped QKV layout (GQA with 2 queries per group,
// and one query per group at hd 128): queries and keys rotated, values left alone. fp32 within
// 1e-4, not 1e-5: the angle pos·inv_freq is an fp32 number up to T − 1 = 99 rad, and
// inv_freq = theta^(-2i/hd) may round a few ulp apart on the two sides (CUDA's powf is not
// correctly rounded), turning the rotation by up to ~1e-5 rad; a wrong pairing, sign, position or
// head is off by O(1).
TEST_P(GpuRope, ForwardAndBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-4 : tolerance(dt);
  const ops::AttentionShape shapes[] = {{2, 100, 2, 2, 64}, {1, 37, 4, 1, 128}};
  for (const ops::AttentionShape& s : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "T=" << s.T << " groups=" << s.groups << " rep=" << s.rep << " hd=" << s.hd);
    const int64_t BT = int64_t(s.B) * s.T, row = int64_t(s.groups) * (s.rep + 2) * s.hd;
    const auto qkv = random(BT * row, 30), dqkv = random(BT * row, 31);
    auto run = [&](Device d) {
      auto x = make(d, dt, {BT, row}, qkv), dx = make(d, dt, {BT, row}, dqkv);
      ops::rope_forward(x->t, s, ops::rope_default(s.hd, 10000.0f));
      ops::rope_backward(dx->t, s, ops::rope_default(s.hd, 10000.0f));
      return std::pair{values(x->t), values(dx->t)};
    };
    const auto [got_x, got_dx] = run(kGpu);
    const auto [want_x, want_dx] = run(kCpu);
    EXPECT_TRUE(close(got_x, want_x, tol)) << "forward";
    EXPECT_TRUE(close(got_dx, want_dx, tol)) << "backward";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuRope, kDtypes, dtype_param_name);

// --- embeddings ---------------------------------------------------------------------------------

constexpr int64_t kV = 5000, kC = 256, kTokens = 300;
// The whole table, and the rows [1200, 3700) of it as one vocabulary unit holds them.
constexpr std::pair<int64_t, int64_t> kRowRanges[] = {{0, kV}, {1200, 3700}};

// Tokens over the whole vocabulary; every third one from 12 tokens inside [1200, 3700), so that
// they repeat 8 or 9 times each.
std::vector<int32_t> embedding_tokens() {
  const auto u = random(kTokens, 40);
  std::vector<int32_t> t(kTokens);
  for (int64_t n = 0; n < kTokens; ++n) {
    t[n] = n % 3 == 0 ? int32_t(1300 + 150 * ((n / 3) % 12))
                      : int32_t((u[n] + 1.0f) * 0.5f * (kV - 1));
  }
  return t;
}

// Multiples of 1/8 in [-2, 2]: sums of up to 20 of them stay below 32 in magnitude and are exact
// in bf16 and fp16, so the result does not depend on the order the repeats are added in (nor on
// whether they are rounded one by one, as the CPU's half-precision gradients are).
std::vector<float> eighths(size_t n, uint64_t seed) {
  auto v = random(n, seed, 2.0f);
  for (float& x : v) x = std::round(x * 8.0f) / 8.0f;
  return v;
}

class GpuEmbedding : public ::testing::TestWithParam<DType> {};

// out[n] = rows[token − row_begin] for the tokens in the range; the other rows of out keep their
// values. A gather copies: exact.
TEST_P(GpuEmbedding, ForwardGathersItsRows) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto tokens = embedding_tokens();
  const auto table = random(kV * kC, 41), out0 = random(kTokens * kC, 42, 9.0f);
  for (const auto& [begin, end] : kRowRanges) {
    SCOPED_TRACE(::testing::Message() << "rows [" << begin << ", " << end << ")");
    const std::vector<float> rows(table.begin() + begin * kC, table.begin() + end * kC);
    auto run = [&](Device d) {
      auto t = make_tokens(d, {kTokens}, tokens), r = make(d, dt, {end - begin, kC}, rows);
      auto out = make(d, dt, {kTokens, kC}, out0);
      ops::embedding_forward(out->t, t->t, r->t, begin, end);
      return values(out->t);
    };
    EXPECT_TRUE(close(run(kGpu), run(kCpu), 0.0));
  }
}

// out (N, C) += wpe[(pos0 + n) % T], rows starting mid-sequence: one rounding of an fp32 sum,
// exact.
TEST_P(GpuEmbedding, PositionForwardFromPos0) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t T = 100, pos0 = 37;
  const auto wpe = random(T * kC, 43), out0 = random(kTokens * kC, 44);
  auto run = [&](Device d) {
    auto w = make(d, dt, {T, kC}, wpe), out = make(d, dt, {kTokens, kC}, out0);
    ops::position_forward(out->t, w->t, T, pos0);
    return values(out->t);
  };
  EXPECT_TRUE(close(run(kGpu), run(kCpu), 0.0));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuEmbedding, kDtypes, dtype_param_name);

class GpuEmbeddingGrads : public ::testing::TestWithParam<SG> {};

// drows += dout of the tokens in the range, repeated tokens summed, for the whole table and a
// row range; exact (see eighths).
TEST_P(GpuEmbeddingGrads, BackwardSumsRepeatedTokens) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  const auto tokens = embedding_tokens();
  const auto dout = eighths(kTokens * kC, 45), dtable = eighths(kV * kC, 46);
  for (const auto& [begin, end] : kRowRanges) {
    SCOPED_TRACE(::testing::Message() << "rows [" << begin << ", " << end << ")");
    const std::vector<float> drows0(dtable.begin() + begin * kC, dtable.begin() + end * kC);
    auto run = [&](Device d) {
      auto t = make_tokens(d, {kTokens}, tokens), dy = make(d, sg.s, {kTokens, kC}, dout);
      auto drows = make(d, sg.g, {end - begin, kC}, drows0);
      ops::embedding_backward(drows->t, dy->t, t->t, begin, end);
      return values(drows->t);
    };
    EXPECT_TRUE(close(run(kGpu), run(kCpu), 0.0));
  }
}

// dwpe (T, C) += the rows of dout at each position (3 per position, from pos0), summed in fp32 and
// added once.
TEST_P(GpuEmbeddingGrads, PositionBackwardFromPos0) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  const int64_t T = 100, pos0 = 37;
  const auto dout = random(kTokens * kC, 47), dwpe0 = random(T * kC, 48);
  auto run = [&](Device d) {
    auto dy = make(d, sg.s, {kTokens, kC}, dout), dwpe = make(d, sg.g, {T, kC}, dwpe0);
    ops::position_backward(dwpe->t, dy->t, T, pos0);
    return values(dwpe->t);
  };
  EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(sg.g)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuEmbeddingGrads, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
