#include "strata/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "strata/core/check.h"

namespace strata {

LossScaler::LossScaler(const Fp16Config& c) {
  dynamic_ = c.loss_scale == 0.0f;
  scale_ = dynamic_ ? std::ldexp(1.0f, c.initial_scale_power) : c.loss_scale;
  min_scale_ = c.min_loss_scale;
  window_ = c.loss_scale_window;
  hysteresis_ = hysteresis_left_ = c.hysteresis;
  consecutive_hysteresis_ = c.consecutive_hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (hysteresis_ == 1 || hysteresis_left_ == 1) {
      if (scale_ <= min_scale_) {
        // DeepSpeed's DynamicLossScaler raises here too (raise_error_at_min_scale): skipping
        // every step from now on would only look like training.
        STRATA_RUNTIME_FAIL(
            "fp16: the gradients overflowed with the loss scale already at its minimum "
            "(fp16.min_loss_scale=",
            min_scale_, ") after ", skipped_in_a_row_ + 1,
            " skipped steps in a row; the step cannot be taken at any allowed scale. Lower "
            "fp16.min_loss_scale, lower the learning rate or the gradient clipping threshold, "
            "check the data, or train in bf16");
      }
      scale_ = std::max(scale_ / 2.0f, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iter_ = iter_;
    ++skipped_in_a_row_;
  } else {
    skipped_in_a_row_ = 0;
    if (consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
    if ((iter_ - last_overflow_iter_) % window_ == 0) {
      if (!consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
      scale_ *= 2.0f;
    }
  }
  ++iter_;
}

}  // namespace strata
