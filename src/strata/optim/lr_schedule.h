// Learning-rate schedules with DeepSpeed's semantics (deepspeed/runtime/lr_schedules.py):
// WarmupLR, WarmupDecayLR, WarmupCosineLR; an empty type keeps the optimizer's lr.
//
// DeepSpeed sets the lr to the schedule's value at last_batch_iteration -1 when the scheduler is
// built, and its engine calls scheduler.step() after every optimizer step that was applied (not
// skipped for an overflow). So applied optimizer step k (1-based) runs at the value of iteration
// k - 2: steps 1 and 2 both at warmup_min_lr (WarmupCosineLR: 0, then warmup_min_ratio).
#pragma once

#include <cstdint>

#include "strata/optim/optim_config.h"

namespace strata {

// The schedule's value at DeepSpeed's last_batch_iteration `iteration` (>= -1; -1 is before the
// first scheduler.step()), given the optimizer's lr.
float lr_at(const SchedulerConfig& s, float optimizer_lr, int64_t iteration);

// The lr of the optimizer step that follows `steps_taken` applied steps: lr_at(steps_taken - 1).
float lr_of_step(const SchedulerConfig& s, float optimizer_lr, int64_t steps_taken);

}  // namespace strata
