// strata against PyTorch on the same tiny models, weights and batch (fixtures written by
// scripts/make_golden.sh): logits, loss, every parameter gradient, and 10 AdamW steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/safetensors.h"
#include "strata/train/engine.h"
#include "tests/device_host.h"
#include "tests/golden/golden_case.h"

namespace strata {
namespace {

struct Tolerances {
  double loss_rel;    // loss at the initial weights
  double logits_abs;  // |Δlogit| relative to max |logit|
  double grad;        // |Δg| relative to the tensor's max |g|
  double steps_rel;   // each of the 10 losses
};

class Golden : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

std::vector<float> to_f32(const void* p, DType t, int64_t offset, int64_t n) {
  return test::device_f32(p, t, n, offset);
}

TEST_P(Golden, MatchesPyTorch) {
  const auto& [preset, bf16] = GetParam();
  SafetensorsFile ref(std::string(STRATA_SOURCE_DIR) + "/tests/golden/fixtures/" + preset +
                      ".safetensors");
  Config cfg = parse_config(golden::config(preset, bf16));
  resolve_batch(cfg, 1);
  Engine engine(cfg, nullptr);
  const ModelConfig& m = cfg.model;
  const int T = m.seq_len, V = m.vocab;
  std::vector<int32_t> inputs, targets;
  golden::split(golden::tokens(T, V), T, inputs, targets);

  // fp32 follows PyTorch's fp32 up to summation order: observed differences are ~1e-7 relative
  // (logits, loss, each 10-step loss) and ~1e-6 of each gradient's scale.
  // bf16 stores weights and activations with an 8-bit mantissa (unit roundoff u = 2^-9 ≈ 0.2%).
  // A logit passes through ~10 roundings (embedding, norms, projections, residual adds), so it
  // may be off by ~10u ≈ 2% of the logits' scale; the loss, a mean over 32 tokens of errors of
  // both signs, agrees far better (observed 1e-5 relative). Gradients are products of several
  // rounded factors (observed ≤1.5% of the tensor's scale; bound 5%). The 10-step trajectory
  // compounds the gradient error through AdamW's normalised updates (observed ≤1.1%; bound 3%).
  const Tolerances tol =
      bf16 ? Tolerances{1e-3, 2e-2, 5e-2, 3e-2} : Tolerances{1e-5, 1e-5, 1e-4, 1e-5};

  // Logits at the initial weights.
  engine.model().forward(inputs.data(), targets.data(), 1.0f, false);
  auto logits =
      to_f32(engine.model().logits(0).data, cfg.param_dtype(), 0, int64_t(inputs.size()) * V);
  SafetensorView rl = ref.get("logits", "F32");
  ASSERT_EQ(rl.numel(), int64_t(logits.size()));
  const float* rlp = static_cast<const float*>(rl.data);
  double lmax = 0, ldiff = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    lmax = std::max(lmax, double(std::fabs(rlp[i])));
    ldiff = std::max(ldiff, double(std::fabs(logits[i] - rlp[i])));
  }
  EXPECT_LE(ldiff, tol.logits_abs * lmax) << "logits differ by " << ldiff;

  // Loss and gradients.
  double loss = engine.forward_backward(inputs.data(), targets.data());
  double ref_loss = *static_cast<const float*>(ref.get("loss", "F32").data);
  EXPECT_NEAR(loss, ref_loss, tol.loss_rel * ref_loss);
  const DType gt = engine.grad_dtype();
  for (const ParamSpec& p : engine.spec().params) {
    SafetensorView rg = ref.get("grad." + p.name, "F32");
    ASSERT_EQ(rg.numel(), p.numel()) << p.name;
    const auto strata_order = to_f32(engine.grads(), gt, p.offset, p.numel());
    std::vector<float> g(strata_order.size());  // PyTorch's (Hugging Face) row order
    to_canonical(p, strata_order.data(), g.data());
    const float* r = static_cast<const float*>(rg.data);
    double gmax = 0, worst = 0;
    for (int64_t i = 0; i < p.numel(); ++i) gmax = std::max(gmax, double(std::fabs(r[i])));
    for (int64_t i = 0; i < p.numel(); ++i) {
      worst = std::max(worst, double(std::fabs(g[size_t(i)] - r[i])));
    }
    EXPECT_LE(worst, tol.grad * gmax + 1e-9)
        << p.name << ": max |Δgrad| " << worst << " vs max |grad| " << gmax;
  }
  engine.zero_grads();

  // Ten AdamW steps with clipping on the same batch.
  SafetensorView rs = ref.get("losses", "F32");
  ASSERT_EQ(rs.numel(), golden::kSteps);
  const float* ref_steps = static_cast<const float*>(rs.data);
  for (int k = 0; k < golden::kSteps; ++k) {
    StepMetrics s = engine.train_batch_on(inputs.data(), targets.data());
    EXPECT_NEAR(s.loss, ref_steps[k], tol.steps_rel * ref_steps[k]) << "step " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Golden,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) +
                                              (std::get<1>(info.param) ? "_bf16" : "_fp32");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata
