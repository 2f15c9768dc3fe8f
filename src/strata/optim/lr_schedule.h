// Learning-rate schedules with DeepSpeed's semantics (deepspeed/runtime/lr_schedules.py):
// WarmupLR, WarmupDecayLR, WarmupCosineLR; an empty type keeps the optimizer's lr.
#pragma once

#include <cstdint>

#include "strata/optim/optim_config.h"

namespace strata {

// The lr of optimizer step `iteration` (0 for the first step), given the optimizer's lr.
float lr_at(const SchedulerConfig& s, float optimizer_lr, int64_t iteration);

}  // namespace strata
