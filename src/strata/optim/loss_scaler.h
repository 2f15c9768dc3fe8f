// fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py): a
// static scale when fp16.loss_scale > 0, else dynamic: start at 2^initial_scale_power, halve on
// overflow once `hysteresis` overflows have been tolerated, double after `loss_scale_window`
// steps without one, never below min_loss_scale. An overflowing step is skipped. An overflow that
// would halve the scale when it is already at min_loss_scale (its hysteresis spent) is a runtime
// Error, as DeepSpeed's raise_error_at_min_scale: the job stops (exit 1) instead of skipping
// every step.
#pragma once

#include <cstdint>

#include "strata/optim/optim_config.h"

namespace strata {

class LossScaler {
 public:
  LossScaler() = default;  // disabled: scale 1, never changes
  explicit LossScaler(const Fp16Config& c);

  float scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Records the outcome of a step: overflow = the gradients held Inf or NaN. Throws Error on an
  // overflow at the minimum scale.
  void update(bool overflow);
  // What a checkpoint keeps of it (the dynamic schedule's place).
  struct State {
    float scale = 1.0f;
    int64_t iter = 0, last_overflow_iter = -1;
    int hysteresis_left = 1;
  };
  State state() const { return {scale_, iter_, last_overflow_iter_, hysteresis_left_}; }
  void restore(const State& s) {
    scale_ = s.scale, iter_ = s.iter, last_overflow_iter_ = s.last_overflow_iter;
    hysteresis_left_ = s.hysteresis_left;
  }

 private:
  bool dynamic_ = false;
  float scale_ = 1.0f, min_scale_ = 1.0f;
  int64_t window_ = 1000, iter_ = 0, last_overflow_iter_ = -1;
  int hysteresis_ = 1, hysteresis_left_ = 1;
  bool consecutive_hysteresis_ = false;
  int64_t skipped_in_a_row_ = 0;  // for the message at the minimum
};

}  // namespace strata
