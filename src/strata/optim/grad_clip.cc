#include "strata/optim/grad_clip.h"

#include <cmath>

#include "strata/comm/communicator.h"

namespace strata {

ClipDecision clip_decision(double sumsq, float loss_scale, const ClipOptions& o) {
  ClipDecision d;
  d.grad_norm = std::sqrt(sumsq) / loss_scale;
  d.overflow = !std::isfinite(sumsq);
  d.skipped = d.overflow && o.check_overflow;
  if (!d.skipped && o.gradient_clipping > 0.0f && d.grad_norm > o.gradient_clipping) {
    d.clip = float(o.gradient_clipping / (d.grad_norm + 1e-6));
  }
  return d;
}

GradClipper::GradClipper(const ClipOptions& o, comm::Communicator* tp, comm::Communicator* pp)
    : o_(o),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      parts_(tp_ != nullptr || pp_ != nullptr) {}

ClipDecision GradClipper::decide(double local_sumsq, float loss_scale) const {
  double sumsq = local_sumsq;
  if (parts_) {
    float total = float(sumsq);
    if (tp_ != nullptr) tp_->all_reduce(&total, 1, DType::F32, DType::F32);
    if (pp_ != nullptr) pp_->all_reduce(&total, 1, DType::F32, DType::F32);
    sumsq = total;
  }
  return clip_decision(sumsq, loss_scale, o_);
}

void GradClipper::step(Optimizer& optimizer, const ClipDecision& d, const void* grads, float lr,
                       float loss_scale) const {
  if (!d.skipped) optimizer.step(grads, lr, d.clip / loss_scale);
}

}  // namespace strata
