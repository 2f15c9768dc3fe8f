// Data parallelism and ZeRO stages 0-3 (DESIGN.md §3-§5; semantics as DeepSpeed's, see
// ../shared/reference/deepspeed.md): the UnitHook the engine hands the model when it trains on a
// data-parallel group. Stage 0 keeps every state whole and sums the gradients; stages 1-3
// partition the model states over a shard group of G ranks: the data-parallel group, or with
// MiCS (zero_optimization.mics_shard_size) groups of G consecutive data-parallel ranks,
// replicated across the groups.
//
//   stage 1: fp32 master and moments partitioned (partition.h);
//   stage 2: gradients partitioned too (grad_reducer.h);
//   stage 3: parameters partitioned too, gathered unit by unit as the model reads them
//            (param_cache.h); units of at most stage3_param_persistence_threshold elements are
//            kept whole on every rank.
//
// At the boundary finish() waits for every reduction; with MiCS the gradient partition is then
// all-reduced across the replica group, once per step. The optimizer steps the partition (or the
// whole buffers at stage 0); after_step() all-gathers the updated parameters (stages 1-2: into
// the full buffer; stage 3: the persistent units; gathered units are dropped).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/optim/optimizer.h"
#include "strata/zero/grad_reducer.h"
#include "strata/zero/param_cache.h"
#include "strata/zero/partition.h"

namespace strata {

class ZeroSync final : public UnitHook {
 public:
  // shard: the group the states are partitioned over (at stage 0: the data-parallel group, over
  // which gradients are summed); spec built with align = shard.size() (stage 0: any).
  // replicas: the MiCS replica group (same chunk on other shard groups), or nullptr.
  // full_params: the flat parameters (stages 0-2; nullptr for stage 3). full_grads: the flat
  // gradients (stages 0-1; nullptr for stages 2-3). Both outlive this object.
  // experts: under expert parallelism the expert-data-parallel group (the ranks of the shard
  // group holding this rank's experts; with whole experts, of the stage's tp × shard ranks), over
  // which the Experts units are summed and sharded; nullptr without (no MiCS with it).
  ZeroSync(comm::Communicator& shard, comm::Communicator* replicas, const ModelSpec& spec,
           const ZeroOptions& o, void* full_params, void* full_grads,
           comm::Communicator* experts = nullptr);
  ~ZeroSync() override;

  // Stages 1-3: the partition (the Optimizer's ranges and packing).
  const ZeroPartition& partition() const { return *part_; }
  // Where the optimizer reads gradients and writes parameters, and how it addresses them.
  void* optimizer_params() const;
  const void* optimizer_grads() const;
  Packed packed() const { return {stage_ == 3, stage_ >= 2}; }

  // At the start of a step (resets the wait counters; stage 3 follows the step's gather order
  // from its start).
  void begin_step();
  // Before an evaluation's forward passes (stage 3: their gather order, from its start).
  void begin_eval();
  // Before each micro-batch: `boundary` for the last one of the accumulation.
  void begin_micro(bool boundary) override { reducer_.begin_micro(boundary); }
  void begin_pass(Pass pass) override;
  const void* acquire_params(int unit) override;
  void release_params(int unit) override;
  void* grads_for(int unit) override { return reducer_.grads_for(unit); }
  void unit_done(int unit, bool final) override { reducer_.unit_done(unit, final); }
  // At the boundary, after backward: every reduction is complete and the gradients (stage 0:
  // the whole buffer; else the partition) hold the global sum (across the replica group too).
  void finish();
  // Σ g² over the whole model's reduced gradients (a collective over the shard group at stages
  // 1-3).
  // replicated: flat ranges tensor-parallel ranks hold alike, counted 1/replicas each.
  double sum_squares(const std::vector<ReplicatedRange>& replicated = {});
  // After the optimizer stepped (or skipped): the parameters are re-gathered (stages 1-3).
  void after_step();
  // After a forward-only pass (evaluation): stage 3's gathered units, including those prefetched
  // for a backward that will not come, are dropped; the next pass gathers from the start.
  void drop_gathered();
  // Zeroes the gradient partition (stages 2-3); flat gradients are the engine's.
  void zero_grads();
  // The whole flat parameters (spec.numel of the parameter dtype) into out; a collective at
  // stage 3 (gathered from the partitions), a copy otherwise.
  void gather_all_params(void* out);

  bool in_flight() const;
  // This step so far: seconds the compute thread waited for reductions, for gathers.
  double reduce_wait_seconds() const { return reducer_.wait_seconds() + replica_wait_s_; }
  double gather_wait_seconds() const { return cache_ ? cache_->wait_seconds() : 0.0; }
  // Stage 3: most elements of gathered (non-persistent) units resident at once since creation.
  int64_t peak_live_elements() const { return cache_ ? cache_->peak_live_elements() : 0; }

 private:
  static std::unique_ptr<ZeroPartition> make_partition(const comm::Communicator& shard,
                                                       const comm::Communicator* experts,
                                                       const ModelSpec& spec, int stage);
  // The group unit u is summed, sharded and gathered over.
  comm::Communicator& group_of(const UnitSpec& u) const {
    return experts_ != nullptr && u.kind == UnitKind::Experts ? *experts_ : shard_;
  }

  comm::Communicator& shard_;
  comm::Communicator* replicas_;
  comm::Communicator* experts_;
  std::vector<UnitSpec> units_;
  const int stage_;
  ZeroOptions o_;
  size_t ps_, gs_;
  int64_t numel_;
  std::unique_ptr<ZeroPartition> part_;  // stages 1-3
  ZeroBuffers bufs_;
  char* full_params_;
  char* full_grads_;
  double local_sum_squares(int64_t offset, int64_t n) const;
  double sq(const void* g, int64_t n) const;                 // Σ g² of n gradients
  Buffer grad_part_buf_, grad_slot_buf_;                     // stages 2-3
  Buffer param_part_buf_, persistent_buf_, param_slot_buf_;  // stage 3
  GradReducer reducer_;
  std::unique_ptr<ParamCache> cache_;  // stage 3
  std::vector<comm::Handle> gathers_;  // parameter gathers and replica all-reduces, per unit
  double replica_wait_s_ = 0.0;
};

}  // namespace strata
