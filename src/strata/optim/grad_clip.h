// The end of a step's gradients (DESIGN.md §3): the global norm over dp × tp × pp, the clip
// coefficient (torch's clip_grad_norm_), the overflow check, and the optimizer step with
// unscaling and clipping folded into its gradient scale.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/tensor.h"
#include "strata/kernels/ops.h"
#include "strata/optim/optimizer.h"

namespace strata::comm {
class Communicator;
}

namespace strata {

struct ClipOptions {
  float gradient_clipping = 0.0f;  // the largest global norm of the unscaled gradients; 0: none
  bool check_overflow = true;      // a non-finite norm skips the step
};

struct ClipDecision {
  double grad_norm = 0.0;  // global norm of the unscaled gradients, before clipping
  bool overflow = false;   // Σ g² is not finite (the loss scaler's input)
  bool skipped = false;    // overflow with check_overflow: the optimizer does not step
  float clip = 1.0f;       // the unscaled gradients are multiplied by it
};

// From the global Σ g² of gradients scaled by loss_scale: norm = √Σg² / loss_scale, and above
// gradient_clipping the coefficient gradient_clipping / (norm + 1e-6) (clip_grad_norm_'s).
ClipDecision clip_decision(double sumsq, float loss_scale, const ClipOptions& o);

class GradClipper {
 public:
  // tp, pp: the tensor-parallel and pipeline groups whose ranks hold different parts of the
  // gradients (nullptr or one rank: none). Data-parallel ranks hold the same reduced gradients
  // (or, under ZeRO, the shard group's sum already spans them).
  GradClipper(const ClipOptions& o, comm::Communicator* tp, comm::Communicator* pp);

  // Σ g² of this rank's whole flat gradients (no ZeRO): with tp or pp parts, elements that
  // `replicas` ranks hold alike (model's ReplicatedRange: offset, numel, replicas) counted
  // 1/replicas.
  template <typename Range>
  double flat_sum_squares(Tensor grads, const std::vector<Range>& replicated) const {
    double s = ops::sum_squares(grads);
    if (!parts_) return s;
    for (const Range& r : replicated) {
      s -= (1.0 - 1.0 / r.replicas) *
           ops::sum_squares(
               Tensor(static_cast<char*>(grads.data) + size_t(r.offset) * dtype_size(grads.dtype),
                      grads.dtype, {r.numel}));
    }
    return s;
  }
  // The decision from this rank's Σ g² (its tp slices and pp units), summed over tp and pp (in
  // fp32, the all-reduce's dtype): the same on every rank.
  ClipDecision decide(double local_sumsq, float loss_scale) const;
  // Unless skipped: the optimizer steps at lr on grads × clip / loss_scale.
  void step(Optimizer& optimizer, const ClipDecision& d, const void* grads, float lr,
            float loss_scale) const;

 private:
  ClipOptions o_;
  comm::Communicator* tp_;
  comm::Communicator* pp_;
  bool parts_;  // tp or pp splits the gradients
};

}  // namespace strata
