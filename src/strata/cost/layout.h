// A layout of a training run as the memory and communication models read it (predict.h): the
// shape of what each rank holds and moves, not the run itself (no data, no steps, no seed). The
// engine builds one from its config (layout_of); a search over layouts varies its fields. The
// parallel degrees come with the ModelSpec the models are given (its tp slices, its padding to the
// shard group) and the shard group's size.
#pragma once

#include <cstdint>

#include "strata/config/config.h"
#include "strata/model/transformer.h"
#include "strata/zero/partition.h"

namespace strata::cost {

struct Layout {
  // The model's activations: tokens per sequence, hidden size, blocks.
  int64_t seq_len = 1, hidden = 1, layers = 1;
  // Sequences per micro-batch, micro-batches per optimizer step (gradient accumulation).
  int64_t micro_batch = 1, accumulation = 1;
  // ZeRO as the engine runs it (zero_options(Config)): the stage (in effect only over a shard
  // group), the parameter, gradient and wire dtypes, and what sizes its buffers. Stage 0 and no
  // overlap unless set.
  ZeroOptions zero = [] {
    ZeroOptions o;
    o.stage = 0, o.overlap = false;
    return o;
  }();
  // fp32 moments the optimizer keeps per element: Adam's 2, SGD's momentum 1 (0 without).
  int moments = 2;
  bool sequence_parallel = false;
  RecomputeOptions recompute;  // activation checkpointing, by model block
  int local_ranks = 1;         // ranks per host (their model states share its memory)
};

// The layout of a run of config c (resolved for its data-parallel size); local_ranks from
// OpenMPI's OMPI_COMM_WORLD_LOCAL_SIZE (1 outside mpirun).
Layout layout_of(const Config& c);

}  // namespace strata::cost
