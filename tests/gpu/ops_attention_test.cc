// Causal attention on the GPU against the CPU backend, over the grouped QKV layout: GPT-2's
// (one query head per group) and GQA (2 and 4 per group), head dims 64 and 128, sequence lengths
// off the 64-row tiles. The saved state differs by design (ops.h attention_saved): the CPU keeps
// the probabilities, CUDA each query row's log-sum-exp, checked here against one computed on the
// host from q·k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;

// {B, T, groups, rep, hd}
const ops::AttentionShape kShapes[] = {
    {2, 37, 4, 1, 64},    // GPT-2-like, T one partial tile
    {1, 100, 2, 2, 128},  // GQA, 2 queries per group, hd 128, T a tile and a part
    {1, 256, 2, 4, 64},   // GQA, 4 queries per group, four whole tiles
    {3, 1, 2, 2, 64},     // one token: each output is its value row
    {2, 77, 1, 4, 128},   // one group of 4 queries, hd 128
};

std::string describe(const ops::AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " groups=" + std::to_string(s.groups) + " rep=" + std::to_string(s.rep) +
         " hd=" + std::to_string(s.hd);
}

int64_t qkv_width(const ops::AttentionShape& s) {
  return int64_t(s.groups) * (s.rep + 2) * s.hd;
}
int64_t heads(const ops::AttentionShape& s) {
  return int64_t(s.groups) * s.rep;
}

// log Σ_{j ≤ t} exp(q_t·k_j / √hd) in double for every (b, head g·rep + r, t), laid out
// (B, heads, T): query r of group g reads the group's key head.
std::vector<float> log_sum_exp(const std::vector<float>& qkv, const ops::AttentionShape& s) {
  const int64_t row = qkv_width(s), NH = heads(s);
  std::vector<float> lse(size_t(s.B) * NH * s.T);
  std::vector<double> score(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int g = 0; g < s.groups; ++g)
      for (int r = 0; r < s.rep; ++r)
        for (int t = 0; t < s.T; ++t) {
          const float* q =
              &qkv[(int64_t(b) * s.T + t) * row + (int64_t(g) * (s.rep + 2) + r) * s.hd];
          double mx = -INFINITY;
          for (int j = 0; j <= t; ++j) {
            const float* k =
                &qkv[(int64_t(b) * s.T + j) * row + (int64_t(g) * (s.rep + 2) + s.rep) * s.hd];
            double dot = 0.0;
            for (int d = 0; d < s.hd; ++d) dot += double(q[d]) * k[d];
            score[j] = dot / std::sqrt(double(s.hd));
            mx = std::max(mx, score[j]);
          }
          double sum = 0.0;
          for (int j = 0; j <= t; ++j) sum += std::exp(score[j] - mx);
          lse[(int64_t(b) * NH + int64_t(g) * s.rep + r) * s.T + t] = float(mx + std::log(sum));
        }
  return lse;
}

// q and k of magnitude 1.5 make the softmax far from uniform (scores of std 0.75), so a wrong
// scale or mask moves the outputs; small enough that the CPU's rounding of the half-precision
// scores before the softmax (attention.h) stays well inside the 1e-2 bound.
std::vector<float> attention_input(const ops::AttentionShape& s, uint64_t seed) {
  return random(size_t(s.B) * s.T * qkv_width(s), seed, 1.5f);
}

class GpuAttention : public ::testing::TestWithParam<DType> {};

// The output against the CPU's; CUDA's saved state is fp32 (B, heads, T) and holds the
// log-sum-exp of each row's scaled causal scores; an empty `out` (selective recompute) writes
// the same lse bits, so that the recomputed backward is the one that kept them.
TEST_P(GpuAttention, ForwardOutputAndLogSumExp) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (const ops::AttentionShape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const int64_t BT = int64_t(s.B) * s.T, row = qkv_width(s), NH = heads(s);
    const auto qkv = attention_input(s, 1);
    const ops::AttentionSaved saved = ops::attention_saved(kGpu, dt, s);
    ASSERT_EQ(saved.dtype, DType::F32);
    ASSERT_EQ(saved.numel, int64_t(s.B) * NH * s.T);
    auto run = [&](Device d) {
      const ops::AttentionSaved a = ops::attention_saved(d, dt, s);
      auto q = make(d, dt, {BT, row}, qkv);
      auto out = make(d, dt, {BT, NH * s.hd}, random(BT * NH * s.hd, 2, 9.0f));
      auto att = make(d, a.dtype, {a.numel}, random(size_t(a.numel), 3, 9.0f));
      ops::attention_forward(out->t, att->t, q->t, s);
      return std::pair{values(out->t), values(att->t)};
    };
    const auto [out, lse] = run(kGpu);
    EXPECT_TRUE(close(out, run(kCpu).first, tolerance(dt))) << "out";
    // The host's log-sum-exp of the scores of the values the kernels read (qkv rounded to dt).
    // Within dt's bound: the CPU rounds half-precision scores to dt before the softmax, and the
    // GPU may too.
    const auto rounded = values(make(kCpu, dt, {BT * row}, qkv)->t);
    EXPECT_TRUE(close(lse, log_sum_exp(rounded, s), tolerance(dt))) << "lse";

    auto q = make(kGpu, dt, {BT, row}, qkv);
    auto att = make(kGpu, DType::F32, {saved.numel}, random(size_t(saved.numel), 4, 9.0f));
    ops::attention_forward(Tensor(), att->t, q->t, s);
    const auto recomputed = values(att->t);
    EXPECT_EQ(std::memcmp(recomputed.data(), lse.data(), lse.size() * sizeof(float)), 0)
        << "the lse of a forward without out differs from the forward's";
  }
}

// dqkv (overwritten) from dout against the CPU's, each device's backward reading its own saved
// state from its own forward.
TEST_P(GpuAttention, BackwardAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  for (const ops::AttentionShape& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const int64_t BT = int64_t(s.B) * s.T, row = qkv_width(s), NH = heads(s);
    const auto qkv = attention_input(s, 5), dout = random(BT * NH * s.hd, 6);
    auto run = [&](Device d) {
      const ops::AttentionSaved a = ops::attention_saved(d, dt, s);
      const auto scratch_floats = int64_t(ops::attention_backward_scratch_floats(d, dt, s));
      auto q = make(d, dt, {BT, row}, qkv), dy = make(d, dt, {BT, NH * s.hd}, dout);
      auto out = make(d, dt, {BT, NH * s.hd}, std::vector<float>(BT * NH * s.hd));
      auto att = make(d, a.dtype, {a.numel}, std::vector<float>(size_t(a.numel)));
      auto scratch = make(d, DType::F32, {scratch_floats}, std::vector<float>(scratch_floats));
      auto dq = make(d, dt, {BT, row}, random(BT * row, 7, 9.0f));
      ops::attention_forward(out->t, att->t, q->t, s);
      ops::attention_backward(dq->t, scratch->t, dy->t, q->t, att->t, s);
      return values(dq->t);
    };
    EXPECT_TRUE(close(run(kGpu), run(kCpu), tolerance(dt)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuAttention,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace strata::gpu_test
