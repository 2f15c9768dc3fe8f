// ZeRO stages 1, 2 and 3 (DESIGN.md §3-§5; semantics as DeepSpeed's, see
// ../shared/reference/deepspeed.md). The model states are partitioned over a shard group of G
// ranks: the data-parallel group, or with MiCS (zero_optimization.mics_shard_size) groups of G
// consecutive data-parallel ranks, replicated across the groups.
//
// The model spec is built with align = G, so every unit's flat range splits into G equal
// contiguous chunks and rank r of the shard group owns chunk r of every unit. Packed, the owned
// chunks of all units form this rank's partition of numel/G elements; unit u's chunk sits at
// u.offset/G in it (every unit offset is a multiple of G).
//
//   stage 1: fp32 master and moments partitioned. Gradients accumulate in the full flat buffer;
//            at the accumulation boundary each unit is reduce-scattered in
//            communication_data_type as backward finishes it (overlap_comm) or after backward.
//   stage 2: gradients partitioned too. Backward accumulates a unit into a unit-sized buffer
//            handed out by grads_for(); when the unit is done it is reduce-scattered on every
//            micro-step and the owned chunk added into the gradient partition. Units are the
//            buckets; with overlap_comm two buffers alternate between blocks, so a block's
//            reduction overlaps the next block's backward (without it, one buffer: each
//            reduction is waited at once).
//   stage 3: parameters partitioned too. A unit's parameters are all-gathered into a buffer
//            before forward or backward reads them and released after. The order of acquires is
//            static (param_trace()), checked on every call, so ranks cannot diverge into a hang;
//            gathers of the next units in that order are issued ahead while compute runs, up to
//            stage3_prefetch_bucket_size elements; a released unit stays resident when its next
//            use is within stage3_max_reuse_distance elements, until its buffer is needed for a
//            unit used sooner; at most stage3_max_live_parameters elements are resident, except
//            that the unit being acquired is always gathered (also past the limit, when nothing
//            else can be released). Units of at most stage3_param_persistence_threshold elements
//            are kept whole on every rank (DeepSpeed applies the threshold per parameter; strata's
//            unit of gathering is the unit).
//
// At the boundary finish() waits for every reduction; with MiCS the gradient partition is then
// all-reduced across the replica group, once per step. The optimizer steps the partition;
// after_step() all-gathers the updated parameters (stages 1-2: into the full buffer; stage 3:
// the persistent units; gathered units are dropped).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/optim/optimizer.h"

namespace strata {

struct ZeroOptions {
  int stage = 1;
  DType param_dtype = DType::F32, grad_dtype = DType::F32, wire = DType::F32;
  bool overlap = true;
  int64_t prefetch_elems = 50000000;
  int64_t persistence_threshold = 100000;
  int64_t max_live = 1000000000;
  int64_t max_reuse_distance = 1000000000;
};

// Bytes of each buffer ZeRO allocates on one rank, for the start-up prediction and the tests.
struct ZeroBuffers {
  int64_t param_partition = 0;    // stage 3: numel/G elements of the parameter dtype
  int64_t persistent = 0;         // stage 3: whole persistent units
  int64_t param_slots = 0;        // stage 3: buffers units are gathered into
  int64_t grad_partition = 0;     // stages 2-3: numel/G elements of the gradient dtype
  int64_t grad_slots = 0;         // stages 2-3: per-unit gradient buffers
  int64_t grad_block_elems = 0;   // stages 2-3: elements of one block gradient buffer
  int64_t param_block_elems = 0;  // stage 3: elements of one gathered-block buffer
  int block_param_slots = 0;      // stage 3: how many blocks can be resident at once
};
ZeroBuffers zero_buffers(const ModelSpec& spec, int shard_size, const ZeroOptions& o);

class ZeroSync final : public UnitHook {
 public:
  // shard: the group the states are partitioned over; spec built with align = shard.size().
  // replicas: the MiCS replica group (same chunk on other shard groups), or nullptr.
  // full_params: the flat parameters (stages 1-2; nullptr for stage 3). full_grads: the flat
  // gradients (stage 1; nullptr for stages 2-3). Both outlive this object.
  ZeroSync(comm::Communicator& shard, comm::Communicator* replicas, const ModelSpec& spec,
           const ZeroOptions& o, void* full_params, void* full_grads);
  ~ZeroSync() override;

  // The partition's ranges for the Optimizer: every parameter's part inside an owned chunk,
  // with state_offset its place in the partition (padding belongs to no range).
  const std::vector<ParamRange>& owned_ranges() const { return owned_ranges_; }
  int64_t owned_numel() const { return owned_numel_; }
  // Where the optimizer reads gradients and writes parameters, and how it addresses them.
  void* optimizer_params() const;
  const void* optimizer_grads() const;
  Packed packed() const { return {stage_ == 3, stage_ >= 2}; }

  // At the start of a step (resets the wait counters).
  void begin_step();
  // Before each micro-batch: `boundary` for the last one of the accumulation.
  void begin_micro(bool boundary);
  void begin_pass(Pass pass) override;
  const void* acquire_params(int unit) override;
  void release_params(int unit) override;
  void* grads_for(int unit) override;
  void unit_done(int unit) override;
  // At the boundary, after backward: every reduction is complete and the partition holds the
  // global sum of the gradients (across the replica group too).
  void finish();
  // Σ g² over the whole model's reduced gradients (a collective over the shard group).
  double sum_squares();
  // After the optimizer stepped the partition (or skipped): the parameters are re-gathered.
  void after_step();
  // Zeroes the gradient partition (stages 2-3); stage 1's full buffer is the engine's.
  void zero_grads();
  // The whole flat parameters (spec.numel of the parameter dtype) into out; a collective at
  // stage 3 (gathered from the partitions), a copy otherwise.
  void gather_all_params(void* out);

  bool in_flight() const;
  // This step so far: seconds the compute thread waited for reductions, for gathers.
  double reduce_wait_seconds() const { return reduce_wait_s_; }
  double gather_wait_seconds() const { return gather_wait_s_; }
  // Stage 3: most elements of gathered (non-persistent) units resident at once since creation.
  int64_t peak_live_elements() const { return peak_live_; }

 private:
  struct GradSlot {
    char* data = nullptr;
    int unit = -1;  // whose reduction is pending in it
    comm::Handle pending;
  };
  struct ParamState {
    int pool = 0, slot = -1;  // slot in the pool while gathered or gathering
    bool persistent = false, gathering = false, prefetched = false;
    int refs = 0;
    comm::Handle gather;
  };
  struct Pool {
    char* base = nullptr;
    int64_t slot_elems = 0;
    std::vector<int> free;  // slot indices
  };

  int64_t chunk(int unit) const { return units_[size_t(unit)].numel / size_; }
  char* grad_part(int unit) const;
  int grad_slot_of(int unit) const;
  void settle(GradSlot& s);
  void issue_reduce(int unit);
  // Stage 3.
  char* slot_data(const ParamState& p) const;
  int next_use(int unit, size_t from) const;  // trace position, or -1
  int64_t distance(size_t from, size_t to) const;
  bool make_room(int unit, int64_t use_at, bool must);
  void evict(int unit);
  void gather(int unit);
  void prefetch();
  void drop_all();

  comm::Communicator& shard_;
  comm::Communicator* replicas_;
  const int rank_, size_, stage_;
  ZeroOptions o_;
  size_t ps_, gs_;  // element bytes: parameters, gradients
  std::vector<UnitSpec> units_;
  std::vector<ParamRange> owned_ranges_;
  int64_t owned_numel_ = 0;
  ZeroBuffers bufs_;
  char* full_params_;
  char* full_grads_;
  bool armed_ = false;  // stage 1: this micro-batch is the boundary

  // Stage 1: reductions in the full buffer, issued from the last unit.
  std::vector<comm::Handle> pending_;
  size_t next_ = 0;
  int64_t done_floor_ = 0;
  // Stages 2-3.
  Buffer grad_part_buf_, grad_slot_buf_;
  std::vector<GradSlot> grad_slots_;
  // Stage 3.
  Buffer param_part_buf_, persistent_buf_, param_slot_buf_;
  std::vector<char*> persistent_at_;  // per unit, nullptr unless persistent
  std::vector<ParamState> pstate_;
  std::vector<Pool> pools_;
  std::vector<int> trace_;
  size_t forward_len_ = 0, pos_ = 0;
  int64_t live_ = 0, peak_live_ = 0;
  // Gathers at every step end for stages 1-2; replica all-reduces.
  std::vector<comm::Handle> gathers_;

  double reduce_wait_s_ = 0.0, gather_wait_s_ = 0.0;
};

}  // namespace strata
