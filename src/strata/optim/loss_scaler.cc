#include "strata/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

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
      scale_ = std::max(scale_ / 2.0f, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
    if ((iter_ - last_overflow_iter_) % window_ == 0) {
      if (!consecutive_hysteresis_) hysteresis_left_ = hysteresis_;
      scale_ *= 2.0f;
    }
  }
  ++iter_;
}

}  // namespace strata
