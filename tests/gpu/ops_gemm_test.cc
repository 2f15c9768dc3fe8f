// The general product and the linear layers on the GPU against the CPU backend: every layout of
// gemm with row strides past the widths, alpha and accumulation, C in fp32 beside half operands;
// the linear forward and backward with each optional part present and absent, gradients in fp32
// and in the activations' dtype.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

class GpuGemm : public ::testing::TestWithParam<DType> {};

// C (M, N) = alpha·op(A)·op(B) (+ C) for every transpose pair, A, B and C each stored with a row
// stride past its width (the columns between are never read, and C's stay as they were), C in
// the operands' dtype and in fp32 (fp32 accumulation kept in fp32: the fp32 bound applies).
TEST_P(GpuGemm, EveryLayoutWithStridesAlphaAndAccumulate) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType ab = GetParam();
  const int64_t M = 93, N = 70, K = 136;
  std::vector<DType> c_dtypes = {ab};
  if (ab != DType::F32) c_dtypes.push_back(DType::F32);
  for (DType cdt : c_dtypes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "C " << dtype_name(cdt) << " trans_a=" << ta
                                            << " trans_b=" << tb << " accumulate=" << accumulate);
          const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
          const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
          ops::Gemm g;
          g.M = M, g.N = N, g.K = K, g.trans_a = ta, g.trans_b = tb;
          g.lda = a_cols + 3, g.ldb = b_cols + 8, g.ldc = N + 5;
          g.alpha = accumulate ? -0.75f : 1.5f;
          g.accumulate = accumulate;
          const auto a = random(a_rows * g.lda, 1), b = random(b_rows * g.ldb, 2),
                     c = random(M * g.ldc, 3, 4.0f);
          auto run = [&](Device d) {
            auto at = make(d, ab, {a_rows, g.lda}, a), bt = make(d, ab, {b_rows, g.ldb}, b);
            auto ct = make(d, cdt, {M, g.ldc}, c);
            ops::gemm(ct->t, at->t, bt->t, g);
            return values(ct->t);
          };
          EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(cdt)));
        }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuGemm, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

class GpuLinear : public ::testing::TestWithParam<DType> {};

constexpr int64_t kM = 200, kK = 768, kN = 320;  // rows (B·T), in_features, out_features

// y = x·wᵀ (+ b), with and without the bias (y starts as garbage: overwritten).
TEST_P(GpuLinear, Forward) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto x = random(kM * kK, 4), w = random(kN * kK, 5, 0.1f), b = random(kN, 6);
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    auto run = [&](Device d) {
      auto xt = make(d, dt, {kM, kK}, x), wt = make(d, dt, {kN, kK}, w), bt = make(d, dt, {kN}, b);
      auto y = make(d, dt, {kM, kN}, random(kM * kN, 7, 9.0f));
      ops::linear_forward(y->t, xt->t, wt->t, bias ? bt->t : Tensor());
      return values(y->t);
    };
    EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(dt)));
  }
}

// dx = dy·w, overwriting dx or adding to it.
TEST_P(GpuLinear, BackwardInput) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const auto dy = random(kM * kN, 8), w = random(kN * kK, 9, 0.2f), dx0 = random(kM * kK, 10);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    auto run = [&](Device d) {
      auto dyt = make(d, dt, {kM, kN}, dy), wt = make(d, dt, {kN, kK}, w);
      auto dx = make(d, dt, {kM, kK}, dx0);
      ops::linear_backward_input(dx->t, dyt->t, wt->t, accumulate);
      return values(dx->t);
    };
    EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(dt)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuLinear, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

class GpuLinearGrads : public ::testing::TestWithParam<SG> {};

// dw += dyᵀ·x and db += Σ_rows dy into gradients that already hold values: both, dw alone, and db
// alone (x absent).
TEST_P(GpuLinearGrads, BackwardWeight) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const auto dy = random(kM * kN, 11), x = random(kM * kK, 12);
  const auto dw0 = random(kN * kK, 13, 2.0f), db0 = random(kN, 14, 2.0f);
  const std::pair<bool, bool> parts[] = {{true, true}, {true, false}, {false, true}};
  for (const auto& [with_dw, with_db] : parts) {
    SCOPED_TRACE(::testing::Message() << "dw " << with_dw << " db " << with_db);
    auto run = [&](Device d) {
      auto dyt = make(d, s, {kM, kN}, dy), xt = make(d, s, {kM, kK}, x);
      auto dw = make(d, g, {kN, kK}, dw0), db = make(d, g, {kN}, db0);
      ops::linear_backward_weight(with_dw ? dw->t : Tensor(), with_db ? db->t : Tensor(), dyt->t,
                                  with_dw ? xt->t : Tensor());
      return std::pair{values(dw->t), values(db->t)};
    };
    const auto [got_dw, got_db] = run(kGpu);
    const auto [want_dw, want_db] = run(kCpu);
    EXPECT_TRUE(close(got_dw, want_dw, tolerance(g)));
    EXPECT_TRUE(close(got_db, want_db, tolerance(g)));
  }
}

// linear_backward: dx overwritten (or absent), dw and db added to, as the two calls above give.
TEST_P(GpuLinearGrads, BackwardFused) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const auto dy = random(kM * kN, 15), x = random(kM * kK, 16), w = random(kN * kK, 17, 0.2f);
  const auto dx0 = random(kM * kK, 18), dw0 = random(kN * kK, 19, 2.0f), db0 = random(kN, 20);
  for (bool with_dx : {true, false}) {
    SCOPED_TRACE(with_dx ? "with dx" : "without dx");
    auto run = [&](Device d) {
      auto dyt = make(d, s, {kM, kN}, dy), xt = make(d, s, {kM, kK}, x);
      auto wt = make(d, s, {kN, kK}, w), dx = make(d, s, {kM, kK}, dx0);
      auto dw = make(d, g, {kN, kK}, dw0), db = make(d, g, {kN}, db0);
      ops::linear_backward(with_dx ? dx->t : Tensor(), dw->t, db->t, dyt->t, xt->t, wt->t);
      return std::vector{values(dx->t), values(dw->t), values(db->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], tolerance(s))) << "dx";
    EXPECT_TRUE(close(got[1], want[1], tolerance(g))) << "dw";
    EXPECT_TRUE(close(got[2], want[2], tolerance(g))) << "db";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuLinearGrads, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
