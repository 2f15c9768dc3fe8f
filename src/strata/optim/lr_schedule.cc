#include "strata/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace strata {

namespace {

// Warm-up fraction in [0, 1) during warm-up, 1 after.
double warmup_gamma(const SchedulerConfig& s, int64_t it) {
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  if (it >= warmup) return 1.0;
  if (s.warmup_type == "linear") return double(it) / double(warmup);
  return std::log(double(it + 1)) / std::log(double(warmup));
}

}  // namespace

float lr_at(const SchedulerConfig& s, float optimizer_lr, int64_t it) {
  if (s.type.empty()) return optimizer_lr;
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    if (it < 0) return s.warmup_min_lr;  // get_lr() before the first step(): min_lrs
    double gamma = warmup_gamma(s, it);
    if (s.type == "WarmupDecayLR" && it >= warmup) {
      // Reaches 0 at total_num_steps and stays there: warmup_min_lr is held past the end.
      gamma = std::max(0.0, double(s.total_num_steps - it) /
                                double(std::max<int64_t>(1, s.total_num_steps - warmup)));
    }
    return float(s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma);
  }
  // WarmupCosineLR: a ratio of the optimizer's lr; 0 before the first step().
  if (it < 0) return 0.0f;
  double ratio;
  if (it < warmup) {
    ratio = s.warmup_min_ratio + warmup_gamma(s, it) * (1.0 - s.warmup_min_ratio);
  } else {
    const double real_step = double(it - warmup + 1);
    const double real_total = double(std::max<int64_t>(1, s.total_num_steps - warmup));
    // The progress is clamped: past total_num_steps the ratio holds cos_min_ratio.
    const double progress = std::min(1.0, real_step / real_total);
    const double cosine = (1.0 + std::cos(M_PI * progress)) / 2.0;
    ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  return float(optimizer_lr * ratio);
}

float lr_of_step(const SchedulerConfig& s, float optimizer_lr, int64_t steps_taken) {
  return lr_at(s, optimizer_lr, steps_taken - 1);
}

}  // namespace strata
