// A mixture of experts' ops on the GPU (kernels/cuda/moe.cu) against the CPU backend, each on its
// own device from the same inputs: the router (probabilities, logsumexp, choices, gates; with and
// without renormalisation), the plan with and without a capacity (both policies), the balancing
// statistics, the router's backward with balancing coefficients and a z-loss, DeepSeek-V3's sigmoid
// router (grouped, biased) and its backward, the row gather, the
// combine and its backward with dropped choices, the shared expert's gate and its backward (fp32
// and bf16), and the grouped linear layers (one cuBLASLt product per expert, an empty one among
// them).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "strata/kernels/ops.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;
constexpr int N = 96, E = 8, K = 2, T = 32, C = 40;

std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  ops::copy_to_host(v.data(), t);
  return v;
}

// The router's outputs and the plan on device d, from the same logits.
struct Routed {
  std::unique_ptr<Held> probs, lse, top, gates, counts, pos, rows;
};
Routed route(Device d, bool norm, const ops::MoeCapacity& cap) {
  Routed r;
  auto logits = make(d, DType::F32, {N, E}, random(size_t(N * E), 71, 3.0f));
  r.probs = make(d, DType::F32, {N, E}, std::vector<float>(N * E, 9.0f));
  r.lse = make(d, DType::F32, {N}, std::vector<float>(N, 9.0f));
  r.top = make_tokens(d, {N, K}, std::vector<int32_t>(N * K, 7));
  r.gates = make(d, DType::F32, {N, K}, std::vector<float>(N * K, 9.0f));
  r.counts = make_tokens(d, {E}, std::vector<int32_t>(E, 7));
  r.pos = make_tokens(d, {N, K}, std::vector<int32_t>(N * K, 7));
  r.rows = make_tokens(d, {N * K}, std::vector<int32_t>(N * K, 0));
  ops::moe_route_forward(r.probs->t, r.lse->t, r.top->t, r.gates->t, logits->t, {E, K, norm});
  ops::moe_plan(r.counts->t, r.pos->t, r.rows->t, r.top->t, r.probs->t, E, cap);
  return r;
}

TEST(GpuMoe, RouteAndPlanAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const ops::MoeCapacity caps[] = {{}, {20, T, true}, {20, T, false}};
  for (bool norm : {false, true}) {
    for (const ops::MoeCapacity& cap : caps) {
      SCOPED_TRACE("norm " + std::to_string(norm) + " capacity " + std::to_string(cap.capacity) +
                   (cap.by_probs ? " by probs" : " by position"));
      const Routed g = route(kGpu, norm, cap), c = route(kCpu, norm, cap);
      EXPECT_TRUE(close(values(g.probs->t), values(c.probs->t), 1e-6));
      EXPECT_TRUE(close(values(g.lse->t), values(c.lse->t), 1e-6));
      EXPECT_TRUE(close(values(g.gates->t), values(c.gates->t), 1e-6));
      EXPECT_EQ(ints(g.top->t), ints(c.top->t));
      EXPECT_EQ(ints(g.counts->t), ints(c.counts->t));
      EXPECT_EQ(ints(g.pos->t), ints(c.pos->t));
      EXPECT_EQ(ints(g.rows->t), ints(c.rows->t));
    }
  }
}

TEST(GpuMoe, BalanceAndRouteBackwardAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  for (bool norm : {false, true}) {
    auto run = [&](Device d) {
      const Routed r = route(d, norm, {});
      auto stats = make(d, DType::F32, {N / T, 2, E}, std::vector<float>(N / T * 2 * E, 9.0f));
      ops::moe_balance_stats(stats->t, r.probs->t, r.top->t, T);
      auto dg = make(d, DType::F32, {N, K}, random(size_t(N * K), 72));
      auto coef = make(d, DType::F32, {N / T, E}, random(size_t(N / T * E), 73, 0.1f));
      auto dl = make(d, DType::F32, {N, E}, std::vector<float>(N * E, 9.0f));
      ops::moe_route_backward(dl->t, dg->t, r.probs->t, r.lse->t, r.top->t, r.gates->t, coef->t, T,
                              0.01f, {E, K, norm});
      return std::vector{values(stats->t), values(dl->t)};
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(got[0], want[0], 1e-6)) << "stats";
    EXPECT_TRUE(close(got[1], want[1], 1e-5)) << "dlogits";
  }
}

// DeepSeek-V3's sigmoid router, grouped and biased, and its backward.
TEST(GpuMoe, SigmoidRouteAndBackwardAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  for (bool norm : {false, true}) {
    auto run = [&](Device d) {
      const ops::MoeRoute how{E, K, norm, true, 4, 2, 2.5f};
      auto logits = make(d, DType::F32, {N, E}, random(size_t(N * E), 74, 3.0f));
      auto bias = make(d, DType::F32, {E}, random(size_t(E), 75, 0.2f));
      auto probs = make(d, DType::F32, {N, E}, std::vector<float>(N * E, 9.0f));
      auto lse = make(d, DType::F32, {N}, std::vector<float>(N, 9.0f));
      auto top = make_tokens(d, {N, K}, std::vector<int32_t>(N * K, 7));
      auto gates = make(d, DType::F32, {N, K}, std::vector<float>(N * K, 9.0f));
      ops::moe_route_forward(probs->t, lse->t, top->t, gates->t, logits->t, how, bias->t);
      auto dg = make(d, DType::F32, {N, K}, random(size_t(N * K), 76));
      auto dl = make(d, DType::F32, {N, E}, std::vector<float>(N * E, 9.0f));
      // The sequence-wise balancing: normalised scores' statistics and their gradient.
      auto stats = make(d, DType::F32, {N / T, 2, E}, std::vector<float>(N / T * 2 * E, 9.0f));
      ops::moe_balance_stats(stats->t, probs->t, top->t, T, true);
      auto coef = make(d, DType::F32, {N / T, E}, random(size_t(N / T * E), 77, 0.1f));
      ops::moe_route_backward(dl->t, dg->t, probs->t, lse->t, top->t, gates->t, coef->t, T, 0.0f,
                              how);
      return std::make_tuple(values(probs->t), values(gates->t), ints(top->t), values(dl->t),
                             values(stats->t));
    };
    const auto got = run(kGpu), want = run(kCpu);
    EXPECT_TRUE(close(std::get<0>(got), std::get<0>(want), 1e-6)) << "scores";
    EXPECT_TRUE(close(std::get<1>(got), std::get<1>(want), 1e-6)) << "gates";
    EXPECT_EQ(std::get<2>(got), std::get<2>(want)) << "choices";
    EXPECT_TRUE(close(std::get<3>(got), std::get<3>(want), 1e-5)) << "dlogits";
    EXPECT_TRUE(close(std::get<4>(got), std::get<4>(want), 1e-6)) << "normalised statistics";
  }
}

class GpuMoeRows : public ::testing::TestWithParam<DType> {};

TEST_P(GpuMoeRows, GatherCombineAndGateAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto run = [&](Device d) {
    const Routed r = route(d, true, {20, T, true});  // some choices dropped
    auto x = make(d, dt, {N, C}, random(size_t(N * C), 74));
    auto xp = make(d, dt, {N * K, C}, std::vector<float>(N * K * C, 0.0f));
    std::vector<int32_t> counts = ints(r.counts->t);
    int64_t kept = 0;
    for (int32_t n : counts) kept += n;
    std::vector<int32_t> plan_rows = ints(r.rows->t);
    plan_rows.resize(size_t(kept));
    auto rows = make_tokens(d, {kept}, plan_rows);
    ops::gather_rows(Tensor(xp->buf.data(), dt, {kept, C}, d), x->t, rows->t);
    auto y = make(d, dt, {N * K, C}, random(size_t(N * K * C), 75));
    auto out = make(d, dt, {N, C}, std::vector<float>(N * C, 9.0f));
    ops::moe_combine(out->t, y->t, r.pos->t, r.gates->t);
    auto s = make(d, dt, {N, C}, random(size_t(N * C), 76));
    auto g = make(d, DType::F32, {N}, random(size_t(N), 77, 2.0f));
    ops::moe_gate_forward(out->t, s->t, g->t);
    auto dout = make(d, dt, {N, C}, random(size_t(N * C), 78));
    auto dy = make(d, dt, {N * K, C}, std::vector<float>(N * K * C, 0.0f));
    auto dw = make(d, DType::F32, {N, K}, std::vector<float>(N * K, 9.0f));
    ops::moe_combine_backward(dy->t, dw->t, dout->t, y->t, r.pos->t, r.gates->t);
    auto ds = make(d, dt, {N, C}, std::vector<float>(N * C, 9.0f));
    auto dg = make(d, DType::F32, {N}, std::vector<float>(N, 9.0f));
    ops::moe_gate_backward(ds->t, dg->t, dout->t, s->t, g->t);
    return std::vector{values(xp->t), values(out->t), values(g->t), values(dy->t),
                       values(dw->t), values(ds->t),  values(dg->t)};
  };
  const auto got = run(kGpu), want = run(kCpu);
  const char* names[] = {"gathered rows", "combined", "gate", "dy", "dw", "ds", "dgate"};
  for (size_t i = 0; i < got.size(); ++i) {
    const bool f32 = i == 2 || i == 4 || i == 6;
    EXPECT_TRUE(close(got[i], want[i], f32 ? 1e-5 : tolerance(dt))) << names[i];
  }
}

TEST_P(GpuMoeRows, GroupedLinearAgainstCpu) {
  STRATA_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t counts[4] = {30, 0, 51, 15};
  constexpr int64_t R = 96, In = 64, Out = 48;
  auto run = [&](Device d) {
    auto x = make(d, dt, {R, In}, random(size_t(R * In), 79));
    auto w = make(d, dt, {4 * Out, In}, random(size_t(4 * Out * In), 80, 0.2f));
    auto y = make(d, dt, {R, Out}, std::vector<float>(R * Out, 9.0f));
    auto dy = make(d, dt, {R, Out}, random(size_t(R * Out), 81));
    auto dx = make(d, dt, {R, In}, std::vector<float>(R * In, 9.0f));
    auto dw = make(d, DType::F32, {4 * Out, In}, random(size_t(4 * Out * In), 82));
    ops::grouped_linear_forward(y->t, x->t, w->t, counts, 4);
    ops::grouped_linear_backward_input(dx->t, dy->t, w->t, counts, 4);
    ops::grouped_linear_backward_weight(dw->t, dy->t, x->t, counts, 4);
    return std::vector{values(y->t), values(dx->t), values(dw->t)};
  };
  const auto got = run(kGpu), want = run(kCpu);
  EXPECT_TRUE(close(got[0], want[0], tolerance(dt))) << "y";
  EXPECT_TRUE(close(got[1], want[1], tolerance(dt))) << "dx";
  EXPECT_TRUE(close(got[2], want[2], dt == DType::F32 ? 1e-5 : 1e-2)) << "dw";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMoeRows, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(dtype_name(p.param));
                         });

}  // namespace
}  // namespace strata::gpu_test
