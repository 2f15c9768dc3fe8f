// The ops newer model families need, on the GPU against the CPU backend: RMSNorm with the gain
// 1 + w (Gemma), GeGLU, rotary embedding from a scaled, partial table with an attention factor,
// and q/k normalisation per head (Qwen3, Gemma 3) and whole (OLMo 2).
#include <gtest/gtest.h>

#include <cmath>
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

// --- RMSNorm with the gain 1 + w ----------------------------------------------------------------

class GpuRmsNormOffset : public ::testing::TestWithParam<SG> {};

// Forward (out, rstd) and the fused backward (dx, dw added to what they hold), w around 0 so that
// w and 1 + w differ everywhere.
TEST_P(GpuRmsNormOffset, ForwardAndBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  const int64_t N = 150;
  for (int64_t C : {64, 197, 768}) {
    SCOPED_TRACE(::testing::Message() << "C=" << C);
    const auto x = random(N * C, 1), w = random(C, 2, 0.2f), dy = random(N * C, 3);
    const auto dx0 = random(N * C, 4), dw0 = random(C, 5, 2.0f);
    auto run = [&](Device d) {
      auto xt = make(d, sg.s, {N, C}, x), wt = make(d, sg.s, {C}, w);
      auto dyt = make(d, sg.s, {N, C}, dy), out = make(d, sg.s, {N, C}, random(N * C, 6, 9.0f));
      auto rstd = make(d, DType::F32, {N}, random(N, 7, 9.0f));
      auto dx = make(d, sg.s, {N, C}, dx0), dw = make(d, sg.g, {C}, dw0);
      const auto scratch = int64_t(ops::norm_backward_scratch_floats(N, C));
      auto sc = make(d, DType::F32, {scratch}, std::vector<float>(size_t(scratch)));
      ops::rmsnorm_forward(out->t, rstd->t, xt->t, wt->t, 1e-6f, 1.0f);
      ops::rmsnorm_backward(dx->t, dw->t, sc->t, dyt->t, xt->t, wt->t, rstd->t, 1.0f);
      return std::vector{values(out->t), values(rstd->t), values(dx->t), values(dw->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(sg.s))) << "out";
    EXPECT_TRUE(close(got[1], want[1], tolerance(DType::F32))) << "rstd";
    EXPECT_TRUE(close(got[2], want[2], tolerance(sg.s))) << "dx";
    EXPECT_TRUE(close(got[3], want[3], tolerance(sg.g))) << "dw";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuRmsNormOffset, sg_pairs(), sg_name);

// --- GeGLU
// ------------------------------------------------------------------------------------------

class GpuGeGlu : public ::testing::TestWithParam<DType> {};

// Over interleaved (gate f, up f) columns, forward and backward (dx overwritten); an odd F takes
// the unvectorised path.
TEST_P(GpuGeGlu, ForwardAndBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (int64_t F : {352, 45}) {
    SCOPED_TRACE(::testing::Message() << "F=" << F);
    const int64_t N = 130;
    const auto x = random(N * 2 * F, 24, 4.0f), dy = random(N * F, 25);
    auto run = [&](Device d) {
      auto xt = make(d, dt, {N, 2 * F}, x), dyt = make(d, dt, {N, F}, dy);
      auto out = make(d, dt, {N, F}, random(N * F, 26, 9.0f));
      auto dx = make(d, dt, {N, 2 * F}, random(N * 2 * F, 27, 9.0f));
      ops::geglu_forward(out->t, xt->t);
      ops::geglu_backward(dx->t, dyt->t, xt->t);
      return std::pair{values(out->t), values(dx->t)};
    };
    const auto [got_out, got_dx] = run(kGpu);
    const auto [want_out, want_dx] = run(kCpu);
    EXPECT_TRUE(close(got_out, want_out, tolerance(dt))) << "forward";
    EXPECT_TRUE(close(got_dx, want_dx, tolerance(dt))) << "backward";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuGeGlu, kDtypes, dtype_param_name);

// --- rotary embedding from a table
// ----------------------------------------------------------------

class GpuRopeTable : public ::testing::TestWithParam<DType> {};

// A linear-scaled table over the first 48 of hd 64 (partial rotary), attention factor 1.2. fp32
// within 1e-4, as GpuRope: cos and sin of angles up to 99 rad may round apart on the two sides.
TEST_P(GpuRopeTable, PartialScaledForwardAndBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const double tol = dt == DType::F32 ? 1e-4 : tolerance(dt);
  const ops::AttentionShape s{2, 100, 2, 2, 64};
  ops::Rope rope;
  rope.rotary_dim = 48;
  rope.attention_factor = 1.2f;
  for (int i = 0; i < 24; ++i) rope.inv_freq[i] = 0.5f / std::pow(10000.0f, float(2 * i) / 48.0f);
  const int64_t BT = int64_t(s.B) * s.T, row = int64_t(s.groups) * (s.rep + 2) * s.hd;
  const auto qkv = random(BT * row, 30), dqkv = random(BT * row, 31);
  auto run = [&](Device d) {
    auto x = make(d, dt, {BT, row}, qkv), dx = make(d, dt, {BT, row}, dqkv);
    ops::rope_forward(x->t, s, rope);
    ops::rope_backward(dx->t, s, rope);
    return std::pair{values(x->t), values(dx->t)};
  };
  const auto [got_x, got_dx] = run(kGpu);
  const auto [want_x, want_dx] = run(kCpu);
  EXPECT_TRUE(close(got_x, want_x, tol)) << "forward";
  EXPECT_TRUE(close(got_dx, want_dx, tol)) << "backward";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuRopeTable, kDtypes, dtype_param_name);

// --- q/k normalisation
// ------------------------------------------------------------------------------

class GpuQkNorm : public ::testing::TestWithParam<SG> {};

// Per head with the gain 1 + w, and whole over every head (its sums, reduced over one rank here);
// forward (out, rstd; whole: sumsq) and backward (whole: dot; dqkv, and dwq, dwk added to what
// they hold).
TEST_P(GpuQkNorm, ForwardAndBackward) {
  STRATA_SKIP_WITHOUT_GPU();
  const SG sg = GetParam();
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 50, 4, 2, 64}, ops::AttentionShape{1, 37, 2, 3, 128}}) {
    for (bool per_head : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "hd=" << s.hd << (per_head ? " per head" : " whole"));
      ops::QkNorm n;
      n.per_head = per_head;
      n.w_offset = per_head ? 1.0f : 0.0f;
      n.q_width = int64_t(s.groups) * s.rep * s.hd;
      n.k_width = int64_t(s.groups) * s.hd;
      const int64_t N = int64_t(s.B) * s.T, row = int64_t(s.groups) * (s.rep + 2) * s.hd;
      const int64_t gq = per_head ? s.hd : n.q_width, gk = per_head ? s.hd : n.k_width;
      const int64_t stats = per_head ? int64_t(s.groups) * (s.rep + 1) : 2;
      const auto x = random(N * row, 40, 3.0f), dy = random(N * row, 41);
      const auto wq = random(gq, 42, 0.5f), wk = random(gk, 43, 0.5f);
      const auto dwq0 = random(gq, 44), dwk0 = random(gk, 45);
      auto run = [&](Device d) {
        auto xt = make(d, sg.s, {N, row}, x), dyt = make(d, sg.s, {N, row}, dy);
        auto wqt = make(d, sg.s, {gq}, wq), wkt = make(d, sg.s, {gk}, wk);
        auto out = make(d, sg.s, {N, row}, random(N * row, 46, 9.0f));
        auto dx = make(d, sg.s, {N, row}, random(N * row, 47, 9.0f));
        auto rstd = make(d, DType::F32, {N, stats}, random(N * stats, 48, 9.0f));
        auto sums = make(d, DType::F32, {N, 2}, random(2 * N, 49, 9.0f));
        auto dots = make(d, DType::F32, {N, 2}, random(2 * N, 50, 9.0f));
        auto dwq = make(d, sg.g, {gq}, dwq0), dwk = make(d, sg.g, {gk}, dwk0);
        if (!per_head) ops::qk_norm_sumsq(sums->t, xt->t, s);
        ops::qk_norm_forward(out->t, rstd->t, xt->t, wqt->t, wkt->t, per_head ? Tensor() : sums->t,
                             s, n);
        if (!per_head) {
          ops::qk_norm_backward_dot(dots->t, dyt->t, xt->t, wqt->t, wkt->t, rstd->t, s, n);
        }
        ops::qk_norm_backward(dx->t, dwq->t, dwk->t, dyt->t, xt->t, wqt->t, wkt->t, rstd->t,
                              per_head ? Tensor() : dots->t, s, n);
        return std::vector{values(out->t), values(rstd->t), values(sums->t), values(dots->t),
                           values(dx->t),  values(dwq->t),  values(dwk->t)};
      };
      const auto got = run(kGpu), want = run(kCpu);
      EXPECT_TRUE(close(got[0], want[0], tolerance(sg.s))) << "out";
      EXPECT_TRUE(close(got[1], want[1], tolerance(DType::F32))) << "rstd";
      if (!per_head) {
        EXPECT_TRUE(close(got[2], want[2], tolerance(DType::F32))) << "sumsq";
        EXPECT_TRUE(close(got[3], want[3], tolerance(DType::F32))) << "dot";
      }
      EXPECT_TRUE(close(got[4], want[4], tolerance(sg.s))) << "dqkv";
      EXPECT_TRUE(close(got[5], want[5], tolerance(sg.g))) << "dwq";
      EXPECT_TRUE(close(got[6], want[6], tolerance(sg.g))) << "dwk";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuQkNorm, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
