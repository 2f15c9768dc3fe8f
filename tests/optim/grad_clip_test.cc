// Global-norm clipping (optim/grad_clip.h): torch's clip_grad_norm_ coefficient, the overflow
// check and skip decision, and the step it folds into the optimizer's gradient scale, on one rank
// (the tp and pp sums run under mpirun in tests/tp and tests/pp).
#include "strata/optim/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace strata {
namespace {

TEST(GradClip, BelowTheLimitNothingIsClipped) {
  // Σg² = 9 · 4² of gradients scaled by 4: the unscaled norm is 3.
  const ClipDecision d = clip_decision(9.0 * 16.0, 4.0f, {5.0f, true});
  EXPECT_DOUBLE_EQ(d.grad_norm, 3.0);
  EXPECT_FALSE(d.overflow);
  EXPECT_FALSE(d.skipped);
  EXPECT_EQ(d.clip, 1.0f);
}

TEST(GradClip, AboveTheLimitTorchsCoefficient) {
  const ClipDecision d = clip_decision(100.0, 1.0f, {1.0f, true});
  EXPECT_DOUBLE_EQ(d.grad_norm, 10.0);
  EXPECT_EQ(d.clip, float(1.0f / (10.0 + 1e-6)));
  // At the limit exactly: no clipping (torch clamps the coefficient at 1).
  EXPECT_EQ(clip_decision(1.0, 1.0f, {1.0f, true}).clip, 1.0f);
  // gradient_clipping 0 turns it off.
  EXPECT_EQ(clip_decision(1e12, 1.0f, {0.0f, true}).clip, 1.0f);
}

TEST(GradClip, AnOverflowSkipsTheStepWhenChecked) {
  for (double sumsq :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const ClipDecision d = clip_decision(sumsq, 1024.0f, {1.0f, true});
    EXPECT_TRUE(d.overflow);
    EXPECT_TRUE(d.skipped);
    EXPECT_FALSE(std::isfinite(d.grad_norm));
    // bf16 with check_grad_overflow off: the step goes on (the overflow is still reported).
    const ClipDecision unchecked = clip_decision(sumsq, 1024.0f, {1.0f, false});
    EXPECT_TRUE(unchecked.overflow);
    EXPECT_FALSE(unchecked.skipped);
  }
}

// One rank (no tp, no pp): the decision is the local Σg²'s, replicated ranges count whole (no
// other rank holds them), and the optimizer steps on grads × clip / loss_scale.
TEST(GradClip, OneRankStepsWithClippingFoldedIn) {
  const GradClipper clipper({1.0f, true}, nullptr, nullptr);
  std::vector<float> g = {3.0f, 4.0f, 0.0f, 0.0f};  // scaled by 2: unscaled norm 2.5
  struct Range {
    int64_t offset, numel;
    int replicas;
  };
  const std::vector<Range> replicated = {{0, 1, 2}};
  const double sumsq = clipper.flat_sum_squares(Tensor(g.data(), DType::F32, {4}), replicated);
  EXPECT_DOUBLE_EQ(sumsq, 25.0);
  const ClipDecision d = clipper.decide(sumsq, 2.0f);
  EXPECT_DOUBLE_EQ(d.grad_norm, 2.5);
  EXPECT_EQ(d.clip, float(1.0 / (2.5 + 1e-6)));

  OptimizerConfig sgd;
  sgd.type = "sgd";
  std::vector<float> p(4, 1.0f), want(4, 1.0f);
  Optimizer opt(sgd, DType::F32, DType::F32, p.data(), 4, {{0, 4, false}});
  Optimizer ref(sgd, DType::F32, DType::F32, want.data(), 4, {{0, 4, false}});
  clipper.step(opt, d, g.data(), 0.1f, 2.0f);
  ref.step(g.data(), 0.1f, d.clip / 2.0f);
  EXPECT_EQ(opt.steps_taken(), 1);
  EXPECT_EQ(p, want);
  EXPECT_NE(p[0], 1.0f);

  ClipDecision skipped = d;
  skipped.skipped = true;
  clipper.step(opt, skipped, g.data(), 0.1f, 2.0f);
  EXPECT_EQ(opt.steps_taken(), 1);
  EXPECT_EQ(p, want);
}

}  // namespace
}  // namespace strata
