// What one training step reports: the loss, the norm, the learning rate and where the time,
// the bytes and the memory went. The engine fills it (train/engine.h); the metrics log, the
// monitors and the straggler watch read it.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "strata/core/memory.h"

namespace strata {

struct StepMetrics {
  int64_t step = 0;   // optimizer steps attempted so far (1-based)
  double loss = 0.0;  // mean loss over the global batch's trained targets
  // A mixture of experts' balancing and z-losses, weighted (in loss), mean over the sequences;
  // -1 for a dense model.
  double moe_aux_loss = -1.0;
  // A mixture of experts: the tokens routed to each expert (top_k choices a token) over the global
  // batch, per MoE layer (expert_layers, in order), experts values each; valid until the next
  // step. Empty for a dense model.
  std::span<const int> expert_layers;
  std::span<const double> expert_tokens;
  int experts = 0;
  double moe_dropped = -1.0;  // with a capacity: the fraction of the choices dropped; else -1
  float lr = 0.0f;
  double grad_norm = 0.0;  // global norm of the unscaled gradients, before clipping
  float loss_scale = 1.0f;
  bool skipped = false;  // the step was skipped: gradients overflowed
  int64_t tokens = 0;    // tokens in the global batch
  // Its targets the loss counts: every one of raw text, fewer with a loss mask (conversations:
  // the assistant's turns), packing's padding and document boundaries (data/sampler.h).
  int64_t trained_tokens = 0;
  double seconds = 0.0;  // wall time of the step
  // Where the time went (DeepSpeed's wall_clock_breakdown): forward incl. loss, backward, and
  // the rest of the step (norm, clipping, optimizer, zeroing).
  double forward_s = 0.0, backward_s = 0.0, optimizer_s = 0.0;
  double tokens_per_s = 0.0, trained_tokens_per_s = 0.0;
  double flops = 0.0;           // matmul FLOPs of the step (peers' convention)
  double comm_exposed_s = 0.0;  // time the step waited for gradient reductions
  double tp_comm_s = 0.0;       // time spent in tensor-parallel collectives (all exposed)
  // Expert parallelism: time in the MoE layers' all-to-alls (all exposed); -1 without it.
  double ep_comm_s = -1.0;
  uint64_t tp_bytes = 0;          // bytes this rank put on the wire in tensor-parallel groups
  double gather_exposed_s = 0.0;  // ZeRO-3: time forward and backward waited for gathers
  // Activation checkpointing: time spent recomputing (inside backward_s); per model block with
  // activation_checkpointing.profile (this rank's blocks, others 0).
  double recompute_s = 0.0;
  std::span<const double> recompute_block_s;  // valid until the next step
  // Waiting for the other pipeline stages: in receives, and in the sums over stages after the
  // schedule (tied embedding gradients, the loss).
  double pipeline_wait_s = 0.0;
  uint64_t comm_bytes =
      0;  // bytes this rank put on the wire in the step (Communicator::wire_bytes)
  uint64_t cross_group_bytes = 0;  // of which across MiCS shard groups (the replica group)
  std::array<size_t, kNumMemCategories> peak_bytes{};  // peak per category during the step
};

}  // namespace strata
