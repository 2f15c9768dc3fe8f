// LR schedules against DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py), computed by hand.
#include "strata/optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace strata {
namespace {

TEST(LrSchedule, NoSchedulerKeepsOptimizerLr) {
  SchedulerConfig s;
  EXPECT_FLOAT_EQ(lr_at(s, 3e-4f, 0), 3e-4f);
  EXPECT_FLOAT_EQ(lr_at(s, 3e-4f, 1000), 3e-4f);
}

TEST(LrSchedule, WarmupLrLog) {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0f, s.warmup_max_lr = 1e-3f, s.warmup_num_steps = 100;
  EXPECT_FLOAT_EQ(lr_at(s, 0.5f, 0), 0.0f);  // log(1) = 0
  EXPECT_NEAR(lr_at(s, 0.5f, 9), 1e-3 * std::log(10.0) / std::log(100.0), 1e-9);
  EXPECT_FLOAT_EQ(lr_at(s, 0.5f, 100), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 0.5f, 5000), 1e-3f);
}

TEST(LrSchedule, WarmupLrLinear) {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_min_lr = 1e-4f, s.warmup_max_lr = 1e-3f, s.warmup_num_steps = 10,
  s.warmup_type = "linear";
  EXPECT_NEAR(lr_at(s, 0.f, 5), 1e-4 + 9e-4 * 0.5, 1e-9);
}

TEST(LrSchedule, WarmupDecayLrDecaysLinearlyToZero) {
  SchedulerConfig s;
  s.type = "WarmupDecayLR";
  s.warmup_max_lr = 1e-3f, s.warmup_num_steps = 10, s.total_num_steps = 110,
  s.warmup_type = "linear";
  EXPECT_NEAR(lr_at(s, 0.f, 10), 1e-3, 1e-9);
  EXPECT_NEAR(lr_at(s, 0.f, 60), 1e-3 * 50.0 / 100.0, 1e-9);
  EXPECT_NEAR(lr_at(s, 0.f, 110), 0.0, 1e-12);
  EXPECT_NEAR(lr_at(s, 0.f, 200), 0.0, 1e-12);
}

TEST(LrSchedule, WarmupCosineLr) {
  SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_num_steps = 10, s.total_num_steps = 110, s.cos_min_ratio = 0.1f,
  s.warmup_min_ratio = 0.0f, s.warmup_type = "linear";
  EXPECT_NEAR(lr_at(s, 2e-3f, 5), 2e-3 * 0.5, 1e-9);
  // real_last_step = it - warmup + 1, real_total = total - warmup
  const double mid = (1 + std::cos(M_PI * 51.0 / 100.0)) / 2;
  EXPECT_NEAR(lr_at(s, 2e-3f, 60), 2e-3 * (0.1 + 0.9 * mid), 1e-8);
  EXPECT_NEAR(lr_at(s, 2e-3f, 109), 2e-3 * 0.1, 1e-8);
}

}  // namespace
}  // namespace strata
