// Every GPU op that reduces across threads gives the same bits when run twice on the same inputs
// (ops.h: results never depend on how the work is spread over threads; a training run repeated
// gives the same losses). The shapes put many contributions on each output (thousands of rows
// into one weight gradient, 512 repeats of each token, 256 keys per query) and the inputs are
// random floats, so that a timing-dependent order of the additions (float atomics) would show
// in the last bits.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kGpu = Device::CUDA;

// Runs `run` (fresh outputs from the same inputs each time) twice and compares every output.
template <typename F>
void expect_same_bits_twice(F run) {
  const std::vector<std::vector<float>> first = run(), second = run();
  ASSERT_EQ(second.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(identical(second[i], first[i])) << "output " << i;
  }
}

class GpuDeterminism : public ::testing::TestWithParam<DType> {};

// sum_squares (and sum, of fp32) over 4M elements: thousands of blocks' partial sums.
TEST_P(GpuDeterminism, SumSquaresAndSum) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t n = (int64_t(1) << 22) + 3;
  auto t = make(kGpu, dt, {n}, random(size_t(n), 1, 3.0f));
  const double ss = ops::sum_squares(t->t);
  EXPECT_EQ(ops::sum_squares(t->t), ss);
  if (dt == DType::F32) {
    const double s = ops::sum(t->t);
    EXPECT_EQ(ops::sum(t->t), s);
  }
}

// Attention forward (out, lse) and backward (dqkv: dk and dv summed over 256 queries and the 4
// query heads of a group).
TEST_P(GpuDeterminism, Attention) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const ops::AttentionShape s{2, 256, 2, 4, 128};
  const int64_t BT = int64_t(s.B) * s.T, row = int64_t(s.groups) * (s.rep + 2) * s.hd,
                width = int64_t(s.groups) * s.rep * s.hd;
  const auto qkv = random(BT * row, 2, 1.5f), dout = random(BT * width, 3);
  const ops::AttentionSaved a = ops::attention_saved(kGpu, dt, s);
  const auto scratch_floats = int64_t(ops::attention_backward_scratch_floats(kGpu, dt, s));
  expect_same_bits_twice([&] {
    auto q = make(kGpu, dt, {BT, row}, qkv), dy = make(kGpu, dt, {BT, width}, dout);
    auto out = make(kGpu, dt, {BT, width}, std::vector<float>(BT * width));
    auto att = make(kGpu, a.dtype, {a.numel}, std::vector<float>(size_t(a.numel)));
    auto scratch = make(kGpu, DType::F32, {scratch_floats}, std::vector<float>(scratch_floats));
    auto dq = make(kGpu, dt, {BT, row}, std::vector<float>(BT * row));
    ops::attention_forward(out->t, att->t, q->t, s);
    ops::attention_backward(dq->t, scratch->t, dy->t, q->t, att->t, s);
    return std::vector{values(out->t), values(att->t), values(dq->t)};
  });
}

// Cross-entropy over 5000 columns: forward_backward's losses and dlogits, the stats, and the
// vocabulary-parallel row maxima and sums (one shard).
TEST_P(GpuDeterminism, CrossEntropy) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t N = 256, V = 5000;
  const auto x = random(N * V, 4, 3.0f), u = random(N, 5);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n)
    targets[n] = n % 10 == 0 ? -1 : int32_t((u[n] + 1) * 0.5f * (V - 1));
  expect_same_bits_twice([&] {
    auto logits = make(kGpu, dt, {N, V}, x), t = make_tokens(kGpu, {N}, targets);
    auto losses = make(kGpu, DType::F32, {N}, std::vector<float>(N));
    auto stats = make(kGpu, DType::F32, {3, N}, std::vector<float>(3 * N));
    auto rowmax = make(kGpu, DType::F32, {N}, std::vector<float>(N));
    auto sums = make(kGpu, DType::F32, {2, N}, std::vector<float>(2 * N));
    ops::cross_entropy_stats(losses->t, stats->t, logits->t, t->t);
    ops::vocab_ce_max(rowmax->t, logits->t, V);
    ops::vocab_ce_sums(sums->t, logits->t, t->t, rowmax->t, 0, V);
    std::vector<std::vector<float>> r = {values(losses->t), values(stats->t), values(rowmax->t),
                                         values(sums->t)};
    ops::ce_dlogits(logits->t, V, logits->t, t->t, stats->t, 0, V, 0, V, 4096.0f);
    r.push_back(values(logits->t));
    return r;
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuDeterminism,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

class GpuDeterminismGrads : public ::testing::TestWithParam<SG> {};

// LayerNorm and RMSNorm over 2048 rows of 768: the forward's statistics, the fused backward and
// the weight half alone (dw, db reduced over every row).
TEST_P(GpuDeterminismGrads, Norms) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const int64_t N = 2048, C = 768;
  const auto x = random(N * C, 6, 2.0f), w = random(C, 7), b = random(C, 8), dy = random(N * C, 9);
  const auto scratch_floats = int64_t(ops::norm_backward_scratch_floats(N, C));
  expect_same_bits_twice([&] {
    auto xt = make(kGpu, s, {N, C}, x), wt = make(kGpu, s, {C}, w), bt = make(kGpu, s, {C}, b);
    auto dyt = make(kGpu, s, {N, C}, dy), out = make(kGpu, s, {N, C}, std::vector<float>(N * C));
    auto mean = make(kGpu, DType::F32, {N}, std::vector<float>(N));
    auto rstd = make(kGpu, DType::F32, {N}, std::vector<float>(N));
    auto scratch = make(kGpu, DType::F32, {scratch_floats}, std::vector<float>(scratch_floats));
    auto dx = make(kGpu, s, {N, C}, std::vector<float>(N * C));
    auto dw = make(kGpu, g, {C}, std::vector<float>(C)),
         db = make(kGpu, g, {C}, std::vector<float>(C));
    auto dw2 = make(kGpu, g, {C}, std::vector<float>(C)),
         db2 = make(kGpu, g, {C}, std::vector<float>(C));
    ops::layernorm_forward(out->t, mean->t, rstd->t, xt->t, wt->t, bt->t, 1e-5f);
    ops::layernorm_backward(dx->t, dw->t, db->t, scratch->t, dyt->t, xt->t, wt->t, mean->t,
                            rstd->t);
    ops::layernorm_backward_weight(dw2->t, db2->t, scratch->t, dyt->t, xt->t, mean->t, rstd->t);
    std::vector<std::vector<float>> r = {values(out->t), values(mean->t), values(rstd->t),
                                         values(dx->t),  values(dw->t),   values(db->t),
                                         values(dw2->t), values(db2->t)};
    ops::rmsnorm_forward(out->t, rstd->t, xt->t, wt->t, 1e-5f);
    ops::rmsnorm_backward(dx->t, dw->t, scratch->t, dyt->t, xt->t, wt->t, rstd->t);
    ops::rmsnorm_backward_weight(dw2->t, scratch->t, dyt->t, xt->t, rstd->t);
    for (const auto* h : {&out, &rstd, &dx, &dw, &dw2}) r.push_back(values((*h)->t));
    return r;
  });
}

// The token embedding's gradient with 4096 tokens over 8 rows (512 repeats each), and the
// position embedding's with 64 rows of dout per position.
TEST_P(GpuDeterminismGrads, Embeddings) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const int64_t N = 4096, C = 256, V = 64, T = 64;
  std::vector<int32_t> tokens(N);
  for (int64_t n = 0; n < N; ++n) tokens[n] = int32_t((n * 7) % 8 * 8);
  const auto dout = random(N * C, 10);
  expect_same_bits_twice([&] {
    auto t = make_tokens(kGpu, {N}, tokens), dy = make(kGpu, s, {N, C}, dout);
    auto drows = make(kGpu, g, {V, C}, std::vector<float>(V * C));
    auto dwpe = make(kGpu, g, {T, C}, std::vector<float>(T * C));
    ops::embedding_backward(drows->t, dy->t, t->t, 0, V);
    ops::position_backward(dwpe->t, dy->t, T, 5);
    return std::vector{values(drows->t), values(dwpe->t)};
  });
}

// The linear layer's weight gradients over 2048 rows: dw and db together, and db alone.
TEST_P(GpuDeterminismGrads, LinearBackwardWeight) {
  STRATA_SKIP_WITHOUT_GPU();
  const auto [s, g] = GetParam();
  const int64_t M = 2048, K = 256, N = 384;
  const auto dy = random(M * N, 11), x = random(M * K, 12);
  expect_same_bits_twice([&] {
    auto dyt = make(kGpu, s, {M, N}, dy), xt = make(kGpu, s, {M, K}, x);
    auto dw = make(kGpu, g, {N, K}, std::vector<float>(N * K));
    auto db = make(kGpu, g, {N}, std::vector<float>(N)),
         db2 = make(kGpu, g, {N}, std::vector<float>(N));
    ops::linear_backward_weight(dw->t, db->t, dyt->t, xt->t);
    ops::linear_backward_weight(Tensor(), db2->t, dyt->t, Tensor());
    return std::vector{values(dw->t), values(db->t), values(db2->t)};
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuDeterminismGrads, sg_pairs(), sg_name);

}  // namespace
}  // namespace strata::gpu_test
