// The step-time model of a layout: from what each pipeline stage's rank computes and moves
// (StageWork) and the device's rates (device_profile.h), one optimizer step's time by part
// (compute, recompute, tensor- and context-parallel collectives, the pipeline's bubble and sends,
// exposed data-parallel and ZeRO communication, the optimizer), simulated on shared cores where
// CPU ranks outnumber them, and the counts a step fit prices. DESIGN.md §8 says what it charges.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/cost/device_profile.h"
#include "strata/pipeline/schedule.h"

namespace strata::cost {

// What one pipeline stage's rank holds, computes and moves per micro-batch: the step-time model's
// input for that stage, which the planner sizes with the engine's own functions (its spec, arena
// and schedule).
struct StageWork {
  std::array<size_t, kNumMemCategories> bytes{};
  double forward_flops = 0;    // per micro-batch, this rank
  double recompute_flops = 0;  // per micro-batch
  // Of those, causal attention's scores and values (4·T²·width a block and sequence), which run
  // at the attention kernels' rate rather than a GEMM's.
  double attention_flops = 0, attention_recompute_flops = 0;
  double gemm_call_flops = 0;    // a typical GEMM's FLOPs (its efficiency)
  double gemm_rows = 0;          // and its rows: the micro-batch's tokens here
  double elementwise_bytes = 0;  // per micro-batch forward: norms, activations, residuals
  // Zero-bubble schedules, per micro-batch: what the deferred weight pass stashes and reads back
  // (each linear's output gradient written and read again, its input read again).
  double deferred_bytes = 0;
  int blocks = 0;
  int64_t numel = 0;  // this rank's parameter elements
  uint64_t tp_bytes = 0;
  int tp_collectives = 0;  // per micro-batch
  // Context parallelism, per micro-batch: bytes of the exchanges the compute waits for, their
  // calls, and the ring's key/value passes (overlapped with the blocks' compute).
  double cp_bytes = 0, cp_overlapped_bytes = 0;
  int cp_collectives = 0;
  // Expert parallelism, per micro-batch: the MoE layers' all-to-alls (the compute waits for them).
  double ep_bytes = 0;
  int ep_collectives = 0;
  double forward_calls = 0;  // kernel calls per micro-batch forward
  int units = 0;             // ZeRO's units held here
  int gathered_units = 0;    // of which stage 3 gathers (above the persistence threshold)
};

// The layout the step is timed for, as the model reads it.
struct StepShape {
  int world = 1, per_node = 1;  // ranks, and ranks per node
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int ep = 1;                  // parallelism.expert (over dp × cp)
  bool whole_experts = false;  // expert_tensor 1: ep over tp × dp × cp
  int virtual_stages = 1;      // with pp > 1
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;
  std::string context_impl = "ulysses";
  bool sequence_parallel = false;
  int64_t micro_batch = 1, accumulation = 1;
  int shard = 1;                   // ZeRO's shard group
  bool zero = false;               // ZeRO in effect
  double message_bytes = 0;        // one pipeline send (pp > 1)
  std::vector<int> stage_of_rank;  // each rank's pipeline stage (the rank grid's)
  double param_numel = 0;          // the whole model's parameters (for MFU)
};

// One optimizer step, seconds: the pipeline's span (compute with its tensor-parallel and
// point-to-point communication, and the bubble), plus exposed data-parallel communication and
// the optimizer.
struct StepTime {
  double compute_s = 0;        // the slowest stage's forward, backward and recompute
  double recompute_s = 0;      // of which recompute
  double tp_comm_s = 0;        // tensor-parallel collectives (all exposed)
  double cp_comm_s = 0;        // context-parallel exchanges (Ulysses' all-to-alls, the ring's
                               // gradient hops; the ring's key/value passes overlap compute)
  double ep_comm_s = 0;        // expert-parallel all-to-alls (all exposed)
  double pp_comm_s = 0;        // pipeline sends of the slowest stage
  double bubble_s = 0;         // the span beyond the slowest stage's own work
  double bubble_fraction = 0;  // the schedule checker's, over every stage
  double dp_comm_s = 0;        // data-parallel / ZeRO collectives
  double dp_exposed_s = 0;     // of which not hidden behind backward
  double optimizer_s = 0;
  // CPU ranks outnumbering their node's cores: the busiest node's compute and optimizer
  // core-seconds over its cores, a floor under the step (0 otherwise). The columns above are then
  // at a rank's share of the cores, and the bubble what the simulated step leaves beyond them.
  double cores_bound_s = 0;
  double model_step_s = 0;  // the sum of the above (simulated on shared cores): the model's step
  // Per step on the critical rank: collective calls (but for stage 3's parameter gathers, counted
  // apart), pipeline sends and receives, kernel calls.
  double collectives = 0, gathers = 0, messages = 0, kernel_calls = 0;
  // Of the tensor-parallel collectives, those beside overlap_comm's background reductions.
  double tp_beside_reductions = 0;
  // CPU ranks outnumbering the cores: the tensor- and context-parallel collectives issued while
  // the group's cores also run another stage's ranks (pipeline::SharedResult::contended), whose
  // peers the scheduler may have switched away from.
  double contended_collectives = 0;
  // The model's step, or where the device profile has a step fit for these ranks per node, the
  // fit's (device_profile.h).
  double step_s = 0;
  double tokens_per_s = 0, mfu = 0;
};

// The step of a run of cfg (resolved for the shape's data-parallel size) on device d, its stages
// doing stages[s]'s work.
StepTime predict_step_time(const Config& cfg, const DeviceProfile& d, const StepShape& c,
                           const std::vector<StageWork>& stages);

// Stage 3: how often a step gathers each unit of a stage. Released after each use
// (stage3_reshard_after_forward): for every micro-batch's forward and backward, and for a full
// recompute (twice under zero-bubble: its weight-gradient pass recomputes again). Kept for the
// step: once.
double stage3_gather_passes(const Config& cfg, const StageWork& sc, int64_t micro);

}  // namespace strata::cost
