// ZeRO's partition arithmetic, without communication (DESIGN.md §5): which chunk of each unit a
// rank of a shard group of G ranks owns, where the chunks sit in the rank's packed partition, and
// how many bytes each stage's buffers take. The model spec is built with align = G, so every
// unit's flat range splits into G equal contiguous chunks and rank r owns chunk r of every unit.
// Packed, the owned chunks of all units form a partition of numel/G elements, in unit order.
// Under expert parallelism the Experts units are split into G/ep larger chunks over the
// expert-data-parallel group (the ranks holding the same experts) instead; with whole experts
// beside tensor parallelism that group spans the tensor-parallel ranks too (tp·G/ep chunks).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/param_spec.h"
#include "strata/optim/optimizer.h"
#include "strata/zero/gather_order.h"

namespace strata {

struct ZeroOptions {
  int stage = 1;
  DType param_dtype = DType::F32, grad_dtype = DType::F32, wire = DType::F32;
  bool overlap = true;
  int64_t bucket_elems = 500000000;  // stage 0: reduce_bucket_size
  int64_t prefetch_elems = 50000000;
  int64_t persistence_threshold = 100000;
  int64_t max_live = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  // stage3_reshard_after_forward. true: a unit is released after each use and gathered again at
  // its next one, unless max_reuse_distance keeps it resident while a buffer is free (DeepSpeed's
  // rule; 1 + ⌈prefetch / unit⌉ buffers). false: a unit stays resident from its first gather in
  // the step to its last use (torchtitan's reshard_after_forward=False: under a pipeline one
  // gather per unit per step instead of one per micro-batch pass), with a buffer for every
  // gathered unit of the stage (max_live still bounds them).
  bool reshard_after_forward = true;
  // By model block: fully recomputed (activation checkpointing). Stage 3 gathers such a block's
  // units again for the recompute, in param_trace()'s order.
  std::vector<char> recompute_full;
  // Stage 3's gather order (gather_order.h) of a training step and of an evaluation's forward
  // passes; empty: one micro-batch of the whole model (forward then backward) repeated, and its
  // forward repeated.
  GatherOrder step_order, eval_order;
};

// Bytes of each buffer ZeRO allocates on one rank, for the start-up prediction and the tests.
struct ZeroBuffers {
  int64_t param_partition = 0;   // stage 3: numel/G elements of the parameter dtype
  int64_t persistent = 0;        // stage 3: whole persistent units
  int64_t param_slots = 0;       // stage 3: buffers units are gathered into
  int64_t grad_partition = 0;    // stages 2-3: numel/G elements of the gradient dtype
  int64_t grad_slots = 0;        // stages 2-3: gradient buffers units accumulate in
  int64_t grad_slot_elems = 0;   // stages 2-3: elements of one (the largest unit)
  int grad_slot_count = 0;       // stages 2-3: 2 with overlap_comm, else 1
  int64_t param_slot_elems = 0;  // stage 3: elements of one gathered-unit buffer (the largest
                                 // non-persistent unit)
  int param_slot_count = 0;      // stage 3: units resident at once: 1 + ⌈prefetch / slot⌉
                                 // (without reshard_after_forward: every gathered unit), at most
                                 // max_live / slot (at least 1)
};
// expert_size: the expert-data-parallel group's size, which the Experts units are sharded over
// under expert parallelism (0: the shard group, as every other unit).
ZeroBuffers zero_buffers(const ModelSpec& spec, int shard_size, const ZeroOptions& o,
                         int expert_size = 0);

// Stage 3 keeps units of at most stage3_param_persistence_threshold elements whole on every rank
// (DeepSpeed applies the threshold per parameter; strata's unit of gathering is the unit).
bool persistent_unit(const UnitSpec& u, const ZeroOptions& o);

class ZeroPartition {
 public:
  // The partition of rank `rank` in a shard group of `size`; spec built with align = size.
  // Under expert parallelism the Experts units are sharded over the expert-data-parallel group
  // instead (expert_rank of expert_size, dividing size, or with whole experts beside tensor
  // parallelism a multiple of it); expert_size 0: no such group.
  ZeroPartition(const ModelSpec& spec, int rank, int size, int expert_rank = 0,
                int expert_size = 0);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Whether the unit is sharded over the expert-data-parallel group; its group's size and this
  // rank's place there.
  bool expert(int unit) const {
    return expert_size_ > 0 && units_[size_t(unit)].kind == UnitKind::Experts;
  }
  int group_size(int unit) const { return expert(unit) ? expert_size_ : size_; }
  int group_rank(int unit) const { return expert(unit) ? expert_rank_ : rank_; }
  // Elements of every rank's chunk of the unit.
  int64_t chunk(int unit) const { return units_[size_t(unit)].numel / group_size(unit); }
  // Flat offset of this rank's chunk of the unit.
  int64_t chunk_begin(int unit) const {
    return units_[size_t(unit)].offset + group_rank(unit) * chunk(unit);
  }
  // Offset of the unit's chunk in the packed partition.
  int64_t packed_offset(int unit) const { return packed_[size_t(unit)]; }
  // Every parameter's part inside an owned chunk, with state_offset its place in the packed
  // partition (padding belongs to no range): the Optimizer's ranges.
  const std::vector<ParamRange>& owned_ranges() const { return owned_ranges_; }
  int64_t owned_numel() const { return owned_numel_; }
  const std::vector<UnitSpec>& units() const { return units_; }

 private:
  int rank_, size_, expert_rank_, expert_size_;
  std::vector<UnitSpec> units_;
  std::vector<int64_t> packed_;  // by unit
  std::vector<ParamRange> owned_ranges_;
  int64_t owned_numel_ = 0;
};

}  // namespace strata
