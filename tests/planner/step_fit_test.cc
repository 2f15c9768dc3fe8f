// Step fits (planner/step_fit.h, device_profile.h): the fit recovers the overheads that made a
// set of steps, keeps every term non-negative, round-trips through a profile file, and is what
// the planner's step time becomes at the ranks per node it was measured at (and only there).
#include "strata/planner/step_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "strata/core/check.h"
#include "strata/planner/search.h"
#include "tests/temp_dir_test.h"

namespace strata::planner {
namespace {

std::vector<StepSample> made(double a, double b, double c, double d, double e = 0, double g = 0,
                             double h = 0, double k = 0) {
  std::vector<StepSample> s;
  const double model[] = {0.008, 0.009, 0.0087, 0.0095, 0.0101, 0.0078, 0.0120, 0.0091};
  const double coll[] = {40, 120, 260, 75, 300, 18, 150, 90};
  const double msg[] = {0, 0, 0, 16, 32, 0, 8, 64};
  const double calls[] = {180, 400, 230, 900, 350, 700, 120, 520};
  const double gathers[] = {0, 60, 0, 24, 120, 0, 36, 0};
  const double beside[] = {0, 0, 130, 20, 0, 0, 90, 60};
  const double contended[] = {0, 30, 0, 0, 70, 10, 0, 45};
  for (int i = 0; i < 8; ++i) {
    s.push_back({model[i], coll[i], msg[i], calls[i], gathers[i], beside[i], contended[i],
                 a * model[i] + b * coll[i] + c * msg[i] + e * calls[i] + g * gathers[i] +
                     h * beside[i] + k * contended[i] + d});
  }
  return s;
}

TEST(StepFit, RecoversTheTermsThatMadeTheSteps) {
  const cost::StepFit f = fit_step(made(2.5, 4e-4, 1.5e-4, 3e-3, 6e-6, 9e-4, 2e-4, 3.5e-4), 4);
  EXPECT_NEAR(f.model_scale, 2.5, 1e-6);
  EXPECT_NEAR(f.per_collective_s, 4e-4, 1e-9);
  EXPECT_NEAR(f.per_message_s, 1.5e-4, 1e-9);
  EXPECT_NEAR(f.per_call_s, 6e-6, 1e-10);
  EXPECT_NEAR(f.per_gather_s, 9e-4, 1e-9);
  EXPECT_NEAR(f.per_tp_beside_s, 2e-4, 1e-9);
  EXPECT_NEAR(f.per_contended_s, 3.5e-4, 1e-9);
  EXPECT_NEAR(f.per_step_s, 3e-3, 1e-8);
  EXPECT_EQ(f.ranks_per_node, 4);
  EXPECT_EQ(f.probes, 8);
}

TEST(StepFit, NoTermGoesNegative) {
  // Steps that fall as collectives grow: the best non-negative fit drops the collective term.
  std::vector<StepSample> s = made(2.0, 0, 0, 0.01);
  for (StepSample& x : s) x.measured_s -= 1e-5 * x.collectives;
  const cost::StepFit f = fit_step(s, 8);
  EXPECT_GE(f.model_scale, 0);
  EXPECT_EQ(f.per_collective_s, 0.0);
  EXPECT_GE(f.per_message_s, 0);
  EXPECT_GE(f.per_step_s, 0);
  for (const StepSample& x : s) {
    EXPECT_LT(std::fabs(fitted_step(f, x) - x.measured_s) / x.measured_s, 0.2);
  }
}

// Each layout measured twice, 10% apart: the fit lands where the weighted relative residuals
// balance, f = sum(w/y) / sum(w/y^2) of the two (every term scales with it), so a probe that
// weighs ten times as much pulls the fit toward its measurement.
TEST(StepFit, AHeavierProbePullsTheFitTowardIt) {
  for (const double w : {1.0, 10.0}) {
    std::vector<StepSample> s = made(2.0, 4e-4, 1.5e-4, 5e-3, 0, 0, 0, 2e-4);
    const size_t n = s.size();
    for (size_t i = 0; i < n; ++i) {
      StepSample slower = s[i];
      slower.measured_s *= 1.1;
      slower.weight = w;
      s.push_back(slower);
    }
    const cost::StepFit f = fit_step(s, 4);
    const double share = (1.0 + w / 1.1) / (1.0 + w / (1.1 * 1.1));  // 1.0452 at 1, 1.0892 at 10
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(fitted_step(f, s[i]) / s[i].measured_s, share, 1e-6) << "weight " << w;
    }
  }
}

TEST(StepFit, FewerProbesThanTermsIsAnInputError) {
  std::vector<StepSample> s = made(1, 0, 0, 0);
  s.resize(7);
  EXPECT_THROW(fit_step(s, 4), InputError);
}

class StepFitProfile : public strata::test::TempDirTest {};

cost::DeviceProfile cpu_profile() {
  cost::DeviceProfile p;
  p.name = "cpu: test";
  p.source = "written by the test";
  p.memory_bytes = p.host_memory_bytes = uint64_t(16) << 30;
  p.devices_per_node = 0;
  p.cores = 2;
  p.fp32_flops = 2e11, p.bf16_flops = 1e12;
  p.memory_bytes_per_s = 2e10;
  p.op_overhead_s = 1e-6;
  p.intra_node = p.inter_node = {2e-7, 6e9};
  return p;
}

TEST_F(StepFitProfile, RoundTripsAndPricesOnlyItsRanksPerNode) {
  cost::DeviceProfile p = cpu_profile();
  cost::StepFit f;
  f.ranks_per_node = 4, f.model_scale = 2.0, f.per_collective_s = 5e-4, f.per_message_s = 2e-4;
  f.per_call_s = 1e-6, f.per_gather_s = 3e-4, f.per_tp_beside_s = 7e-4, f.per_step_s = 1e-3,
  f.per_contended_s = 4e-4, f.probes = 12, f.source = "strata plan --fit 12 (test)";
  p.step_fits.push_back(f);
  cost::write_profile(p, path("cpu.json"));
  const cost::DeviceProfile q = cost::read_profile(path("cpu.json"));
  ASSERT_NE(q.step_fit(4), nullptr);
  EXPECT_EQ(q.step_fit(8), nullptr);
  EXPECT_DOUBLE_EQ(q.step_fit(4)->per_collective_s, 5e-4);
  EXPECT_DOUBLE_EQ(q.step_fit(4)->per_call_s, 1e-6);
  EXPECT_DOUBLE_EQ(q.step_fit(4)->per_gather_s, 3e-4);
  EXPECT_DOUBLE_EQ(q.step_fit(4)->per_tp_beside_s, 7e-4);
  EXPECT_DOUBLE_EQ(q.step_fit(4)->per_contended_s, 4e-4);
  EXPECT_EQ(q.step_fit(4)->source, f.source);

  PlanInput in;
  in.base = {{"train_batch_size", 8},
             {"bf16", {{"enabled", true}}},
             {"model", {{"preset", "gpt2-tiny"}, {"layers", 4}}},
             // gpt2-tiny's units are small: gather them all at stage 3.
             {"zero_optimization", {{"stage3_param_persistence_threshold", 0}}}};
  in.device = q;
  Candidate c;
  c.dp = 2, c.tp = 2, c.zero = 2, c.micro_batch = 2, c.accumulation = 2;
  in.cluster = uniform_cluster(4, 4);
  const Row fitted = evaluate(in, c);
  ASSERT_TRUE(fitted.valid()) << fitted.reason;
  const Prediction& p4 = fitted.p;
  EXPECT_GT(p4.collectives, 0);
  EXPECT_EQ(p4.messages, 0);
  EXPECT_GT(p4.kernel_calls, 0);
  EXPECT_EQ(p4.gathers, 0);  // stage 2
  // overlap_comm is off by default below stage 3 (DeepSpeed's default): nothing runs beside.
  EXPECT_EQ(p4.tp_beside_reductions, 0);
  EXPECT_DOUBLE_EQ(p4.step_s, 2.0 * p4.model_step_s + 5e-4 * p4.collectives +
                                  1e-6 * p4.kernel_calls + 7e-4 * p4.tp_beside_reductions + 1e-3);
  // Stage 3 gathers each unit above the persistence threshold in forward and backward.
  c.zero = 3;
  const Row z3 = evaluate(in, c);
  ASSERT_TRUE(z3.valid()) << z3.reason;
  EXPECT_GT(z3.p.gathers, 0);
  // Stage 3 overlaps by default: every tp collective runs beside the reductions.
  EXPECT_GT(z3.p.tp_beside_reductions, 0);
  EXPECT_EQ(std::fmod(z3.p.gathers, 2.0 * c.accumulation), 0.0);
  EXPECT_DOUBLE_EQ(z3.p.step_s, 2.0 * z3.p.model_step_s + 5e-4 * z3.p.collectives +
                                    3e-4 * z3.p.gathers + 1e-6 * z3.p.kernel_calls +
                                    7e-4 * z3.p.tp_beside_reductions + 1e-3);
  c.zero = 2;
  // Four ranks on nodes of two: no fit for that, the model's step.
  in.cluster = uniform_cluster(4, 2);
  const Row plain = evaluate(in, c);
  ASSERT_TRUE(plain.valid()) << plain.reason;
  EXPECT_DOUBLE_EQ(plain.p.step_s, plain.p.model_step_s);
  // A pipeline's sends and receives are counted (tensor-parallel pairs in two stages).
  c.dp = 1, c.pp = 2, c.zero = 1, c.micro_batch = 2, c.accumulation = 4;
  in.cluster = uniform_cluster(4, 4);
  const Row piped = evaluate(in, c);
  ASSERT_TRUE(piped.valid()) << piped.reason;
  EXPECT_EQ(piped.p.messages, 4 * 2.0);
  // Two stages of tensor-parallel pairs on two cores: each core runs a rank of either stage, so
  // the pairs' collectives are contended where both stages have work (not in the bubble).
  EXPECT_GT(piped.p.contended_collectives, 0.0);
  EXPECT_LT(piped.p.contended_collectives, piped.p.collectives);
  EXPECT_DOUBLE_EQ(piped.p.step_s, 2.0 * piped.p.model_step_s + 5e-4 * piped.p.collectives +
                                       2e-4 * piped.p.messages + 1e-6 * piped.p.kernel_calls +
                                       7e-4 * piped.p.tp_beside_reductions +
                                       4e-4 * piped.p.contended_collectives + 1e-3);
  // On four cores no rank shares one.
  in.device.cores = 4;
  EXPECT_EQ(evaluate(in, c).p.contended_collectives, 0.0);
}

TEST_F(StepFitProfile, ABadFitEntryNamesTheKey) {
  std::ofstream(path("bad.json")) << R"({"strata_device_profile": 1, "kind": "cpu",
    "memory_bytes": 1e9, "gemm_tflops": {"fp32": 0.2}, "memory_bandwidth_gbps": 20,
    "intra_node": {"alpha_us": 0.2, "bandwidth_gbps": 6},
    "step_fits": [{"ranks_per_node": 4, "model_scale": -1}]})";
  try {
    cost::read_profile(path("bad.json"));
    FAIL() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("\"model_scale\" >= 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::planner
