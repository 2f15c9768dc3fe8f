// activation_checkpointing -> the model's RecomputeOptions: which blocks are fully recomputed
// (Megatron's recompute_method over DeepSpeed's number_checkpoints) and how checkpoints are kept.
#include <cstdint>

#include "strata/config/config.h"

namespace strata {

RecomputeOptions recompute_options(const Config& c) {
  const ActivationCheckpointingConfig& a = c.activation_checkpointing;
  RecomputeOptions r;
  if (!a.enabled || a.recompute_granularity == "none") return r;
  r.synchronize = a.synchronize_checkpoint_boundary;
  if (a.recompute_granularity == "selective") {
    r.selective = true;  // no checkpoints: partition and host have nothing to act on
    return r;
  }
  const int L = c.model.layers;
  const int n = a.number_checkpoints.value_or(L);
  r.full.assign(size_t(L), n >= L ? 1 : 0);
  if (n < L) {
    for (int k = 0; k < n; ++k) {
      const int64_t b = a.recompute_method == "block" ? k : int64_t(k) * L / n;
      r.full[size_t(b)] = 1;
    }
  }
  const ParallelismConfig& p = c.parallelism;
  r.partition = a.partition_activations && p.tensor > 1 && !p.sequence_parallel;
  r.host = a.cpu_checkpointing;
  return r;
}

}  // namespace strata
