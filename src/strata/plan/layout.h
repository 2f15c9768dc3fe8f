// A layout of a training run as the memory and communication models read it (predict.h): the
// shape of what each rank holds and moves, not the run itself (no data, no steps, no seed). The
// engine builds one from its config (train/config.h: plan_layout); a search over layouts varies
// its fields. The parallel degrees come with the ModelSpec the models are given (its tp slices,
// its padding to the shard group) and the shard group's size.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"
#include "strata/model/transformer.h"
#include "strata/zero/partition.h"

namespace strata::plan {

struct Layout {
  // The model's activations: tokens per sequence, hidden size, blocks.
  int64_t seq_len = 1, hidden = 1, layers = 1;
  // Sequences per micro-batch, micro-batches per optimizer step (gradient accumulation).
  int64_t micro_batch = 1, accumulation = 1;
  // Parameters, gradients, and the collectives' wire dtype (communication_data_type).
  DType param_dtype = DType::F32, grad_dtype = DType::F32, wire_dtype = DType::F32;
  // fp32 moments the optimizer keeps per element: Adam's 2, SGD's momentum 1 (0 without).
  int moments = 2;
  // ZeRO: the stage (in effect only over a shard group) and what sizes its buffers (DeepSpeed's
  // zero_optimization keys of the same names).
  int zero_stage = 0;
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 500000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_reshard_after_forward = true;
  bool sequence_parallel = false;
  RecomputeOptions recompute;  // activation checkpointing, by model block
  int local_ranks = 1;         // ranks per host (their model states share its memory)
};

// What ZeroSync and zero_buffers() take for this layout.
ZeroOptions zero_options(const Layout& l);

}  // namespace strata::plan
