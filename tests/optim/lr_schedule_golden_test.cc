// The lr of each applied optimizer step, as a DeepSpeed engine runs it: the scheduler is built
// (lr = get_lr() at last_batch_iteration -1) and stepped after every applied optimizer step, so
// step k runs at iteration k - 2. Every number below was worked out by hand from
// deepspeed/runtime/lr_schedules.py for warmup_num_steps W = 4 and total_num_steps T = 10:
//   log warm-up gamma = ln(it + 1) / ln(W), linear it / W;
//   WarmupDecayLR after warm-up: gamma = max(0, (T - it) / (T - W));
//   WarmupCosineLR after warm-up: p = min(1, (it - W + 1) / (T - W)),
//     ratio = cos_min_ratio + (1 - cos_min_ratio) (1 + cos(pi p)) / 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/optim/lr_schedule.h"

namespace strata {
namespace {

struct Golden {
  const char* type;
  const char* warmup_type;
  std::vector<double> lr;  // steps 1..14
};

// WarmupLR / WarmupDecayLR: warmup_min_lr 1e-4, warmup_max_lr 1e-3. WarmupCosineLR: optimizer lr
// 2e-3, warmup_min_ratio 0.1, cos_min_ratio 0.05.
const Golden kGolden[] = {
    {"WarmupLR",
     "log",
     {1e-4, 1e-4, 5.5e-4, 8.13233125e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3,
      1e-3}},
    {"WarmupLR",
     "linear",
     {1e-4, 1e-4, 3.25e-4, 5.5e-4, 7.75e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3}},
    {"WarmupDecayLR",
     "log",
     {1e-4, 1e-4, 5.5e-4, 8.13233125e-4, 1e-3, 1e-3, 8.5e-4, 7e-4, 5.5e-4, 4e-4, 2.5e-4, 1e-4, 1e-4,
      1e-4}},
    {"WarmupDecayLR",
     "linear",
     {1e-4, 1e-4, 3.25e-4, 5.5e-4, 7.75e-4, 1e-3, 8.5e-4, 7e-4, 5.5e-4, 4e-4, 2.5e-4, 1e-4, 1e-4,
      1e-4}},
    {"WarmupCosineLR",
     "log",
     {0.0, 2e-4, 1.1e-3, 1.62646625e-3, 2e-3, 1.87272413e-3, 1.525e-3, 1.05e-3, 5.75e-4,
      2.27275866e-4, 1e-4, 1e-4, 1e-4, 1e-4}},
    {"WarmupCosineLR",
     "linear",
     {0.0, 2e-4, 6.5e-4, 1.1e-3, 1.55e-3, 1.87272413e-3, 1.525e-3, 1.05e-3, 5.75e-4, 2.27275866e-4,
      1e-4, 1e-4, 1e-4, 1e-4}},
};

TEST(LrScheduleGolden, EachAppliedStepRunsAtDeepSpeedsValue) {
  for (const Golden& g : kGolden) {
    SchedulerConfig s;
    s.type = g.type, s.warmup_type = g.warmup_type;
    s.warmup_num_steps = 4, s.total_num_steps = 10;
    s.warmup_min_lr = 1e-4f, s.warmup_max_lr = 1e-3f;
    s.warmup_min_ratio = 0.1f, s.cos_min_ratio = 0.05f;
    const float optimizer_lr = 2e-3f;
    for (size_t k = 1; k <= g.lr.size(); ++k) {
      // steps_taken: the applied steps before step k.
      EXPECT_NEAR(lr_of_step(s, optimizer_lr, int64_t(k) - 1), g.lr[k - 1], 1e-9)
          << g.type << " " << g.warmup_type << " step " << k;
    }
  }
}

TEST(LrScheduleGolden, CosineHoldsItsFloorLongPastTheEnd) {
  SchedulerConfig s;
  s.type = "WarmupCosineLR", s.warmup_num_steps = 4, s.total_num_steps = 10,
  s.cos_min_ratio = 0.05f;
  // Unclamped, progress 2 at iteration 15 would bring the ratio back to 1.
  for (int64_t it : {10, 11, 15, 16, 1000}) {
    EXPECT_NEAR(lr_at(s, 2e-3f, it), 1e-4, 1e-9) << "iteration " << it;
  }
}

TEST(LrScheduleGolden, DecayHoldsWarmupMinLrPastTheEnd) {
  SchedulerConfig s;
  s.type = "WarmupDecayLR", s.warmup_num_steps = 4, s.total_num_steps = 10, s.warmup_min_lr = 1e-4f,
  s.warmup_max_lr = 1e-3f;
  for (int64_t it : {10, 11, 100000}) EXPECT_NEAR(lr_at(s, 0.f, it), 1e-4, 1e-9);
}

TEST(LrScheduleGolden, NoScheduleIsTheOptimizersLrFromTheFirstStep) {
  SchedulerConfig s;
  EXPECT_FLOAT_EQ(lr_of_step(s, 3e-4f, 0), 3e-4f);
}

}  // namespace
}  // namespace strata
