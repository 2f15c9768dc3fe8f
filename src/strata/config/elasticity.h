// DeepSpeed elasticity (deepspeed/elasticity/elasticity.py, `compute_elastic_config`): from the
// `elasticity` block, a global batch size that stays fixed while the GPU count changes within a
// list, and for one of those counts the micro-batch and gradient accumulation that make it up.
// With the block enabled, `strata train` takes its batch from it (apply_elastic_batch), and
// `strata launch --elastic` restarts a job only on the GPU counts the plan allows.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/config/config.h"

namespace strata {

struct ElasticPlan {
  int64_t train_batch_size = 0;
  // Data-parallel sizes the batch divides into (DeepSpeed's `valid_gpus`): GPU counts for version
  // 0.1; for 0.2 multiples of num_gpus_per_node / model_parallel_size.
  std::vector<int> valid_dp_sizes;
  // The GPU counts: valid_dp_sizes × model_parallel_size.
  std::vector<int> valid_world_sizes;
};

// One step at a valid data-parallel size: micro_batch × grad_accum × dp = train_batch_size.
struct ElasticStep {
  int64_t micro_batch = 0;  // the largest of micro_batch_sizes dividing the batch per rank
  int64_t grad_accum = 0;
};

// Throws InputError, naming the key, where DeepSpeed raises ElasticityError: elasticity disabled
// or incomplete, a version other than 0.1 or 0.2, a micro-batch above the maximum batch,
// num_gpus_per_node not divisible by model_parallel_size, or no GPU count in [min_gpus, max_gpus].
// `world_size` (all GPUs, model-parallel included) matters only for version 0.2: when its
// data-parallel size is not in the per-node search's list, DeepSpeed falls back to the largest
// multiple of micro_batch × dp within the maximum, valid for that size alone. 0 skips the fallback
// (DeepSpeed would ask for WORLD_SIZE here; the search itself does not need it).
ElasticPlan compute_elastic(const ElasticityConfig& e, int world_size = 0);

// The micro-batch and accumulation at `world_size` GPUs (dp = world_size / model_parallel_size);
// InputError when that size is not in the plan (DeepSpeed's ElasticityIncompatibleWorldSize).
ElasticStep elastic_step(const ElasticityConfig& e, const ElasticPlan& plan, int world_size);

// DeepSpeed's engine with elasticity enabled: the batch triangle comes from the plan at
// `world_size` (all ranks). Sets the config's given batch keys for resolve_batch. InputError, as
// DeepSpeed raises ElasticityConfigError, when the config also gives a batch key and
// ignore_non_elastic_batch_info is false, and when parallelism.tensor x pipeline differs from
// model_parallel_size (the block's data-parallel size would not be the job's).
void apply_elastic_batch(Config& c, int world_size);

}  // namespace strata
