// The config -> plan::Layout: what the memory and communication models (plan/predict.h) and
// ZeRO's options (plan::zero_options) read of a run.
#include <algorithm>
#include <cstdlib>

#include "strata/train/config.h"

namespace strata {

plan::Layout plan_layout(const Config& c) {
  plan::Layout l;
  l.seq_len = c.model.seq_len, l.hidden = c.model.hidden, l.layers = c.model.layers;
  l.micro_batch = c.train_micro_batch_size_per_gpu;
  l.accumulation = c.gradient_accumulation_steps;
  l.param_dtype = c.param_dtype();
  l.grad_dtype = c.fp16.enabled || c.bf16.enabled ? c.grad_accum_dtype : DType::F32;
  l.wire_dtype = c.comm_dtype();
  const bool sgd = c.optimizer.type == "sgd";
  l.moments = sgd ? (c.optimizer.momentum != 0.0f ? 1 : 0) : 2;
  const ZeroConfig& z = c.zero;
  l.zero_stage = z.stage;
  l.overlap_comm = z.overlap_comm;
  l.reduce_bucket_size = z.reduce_bucket_size;
  l.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  l.stage3_param_persistence_threshold = z.stage3_param_persistence_threshold;
  l.stage3_max_live_parameters = z.stage3_max_live_parameters;
  l.stage3_max_reuse_distance = z.stage3_max_reuse_distance;
  l.stage3_reshard_after_forward = z.stage3_reshard_after_forward;
  l.sequence_parallel = c.parallelism.sequence_parallel;
  l.recompute = recompute_options(c);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  l.local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  return l;
}

}  // namespace strata
