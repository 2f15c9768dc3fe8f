// Gradient reduction over a data-parallel group, for every stage (DESIGN.md §3, §5; semantics as
// DeepSpeed's). Each micro-batch's loss gradient is already scaled by 1/(tokens of the global
// batch), so a sum across ranks is the gradient of the global mean: nothing is divided after.
//
//   stage 0:    the flat gradients are all-reduced at the accumulation boundary, in buckets of
//               reduce_bucket_size elements cut from the end of the buffer (where backward
//               finishes first) towards its start; reduce_bucket_size 0 (DeepSpeed: each
//               gradient alone) makes each unit its own bucket.
//   stage 1:    the flat gradients; at the boundary each unit is reduce-scattered, so that each
//               rank holds the sum of the chunks it owns (ZeroPartition).
//   stages 2-3: backward accumulates each unit into a buffer handed out by grads_for(); when the
//               unit is reported done its buffer is reduce-scattered, on every micro-batch, and
//               the owned chunk added into the gradient partition (numel/G elements).
//
// Stages 0-1 issue each range (a bucket, a unit) once backward has finished every unit it
// touches — as backward goes with overlap_comm, else at finish(). The ranges are cut once, in
// descending offsets, so every rank issues the same collectives in the same order by
// construction. Stages 2-3 alternate two buffers with overlap_comm (one reduces while backward
// fills the other); without it each reduction is waited at once.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/model/param_spec.h"
#include "strata/zero/partition.h"

namespace strata {

class GradReducer {
 public:
  // part: the shard group's partition (stages 1-3; nullptr at stage 0). flat: the flat gradients
  // (stages 0-1), partition: the gradient partition and slots: bufs.grad_slots bytes (stages
  // 2-3). experts: the expert-data-parallel group the Experts units are reduced over under expert
  // parallelism (nullptr: group, as every other unit); a stage-0 bucket holds units of one group.
  // All outlive the reducer.
  GradReducer(comm::Communicator& group, comm::Communicator* experts, const ModelSpec& spec,
              const ZeroPartition* part, const ZeroOptions& o, const ZeroBuffers& bufs, void* flat,
              void* partition, void* slots);

  // Before each micro-batch's backward (or its forward: the same with one chunk): `boundary` for
  // the last backward of the accumulation over the units it reaches (under a pipeline schedule,
  // per model chunk); reductions of units below the lowest such unit wait for finish().
  void begin_micro(bool boundary);
  // Stages 2-3: where backward accumulates the unit (its first element; zeroed); else nullptr.
  void* grads_for(int unit);
  // The contribution asked for last is complete; `final`: no more in this backward.
  void unit_done(int unit, bool final);
  // At the boundary, after backward: every reduction is complete.
  void finish();

  struct Range {
    int64_t begin, end;   // flat elements
    int unit;             // stage 1: the unit; stage 0: -1 (a bucket)
    bool expert = false;  // reduced over the expert-data-parallel group
  };
  // Stages 0-1: the ranges in issue order.
  const std::vector<Range>& ranges() const { return ranges_; }
  bool in_flight() const;
  // Seconds the compute thread waited for reductions since reset_wait().
  double wait_seconds() const { return wait_s_; }
  void reset_wait() { wait_s_ = 0.0; }

 private:
  struct Slot {
    char* data = nullptr;
    int unit = -1;  // whose reduction is pending in it
    comm::Handle pending;
  };
  void issue(size_t range);
  void issue_slot(int unit);
  void settle(Slot& s);

  comm::Communicator& group_;
  comm::Communicator* experts_;
  comm::Communicator& group_of(int unit) const {
    return experts_ != nullptr && units_[size_t(unit)].kind == UnitKind::Experts ? *experts_
                                                                                 : group_;
  }
  const ZeroPartition* part_;
  int stage_;
  DType grad_, wire_;
  bool overlap_;
  size_t gs_;
  std::vector<UnitSpec> units_;
  char* flat_;
  char* partition_;
  // Stages 0-1.
  std::vector<Range> ranges_;
  std::vector<comm::Handle> pending_;  // one per range
  size_t next_ = 0;                    // next range to issue
  int64_t done_floor_ = 0;             // every element at or above this offset is final
  bool armed_ = false;     // the running backward is the last one of its units in this step
  bool stepping_ = false;  // a final backward ran since the last finish()
  // Stages 2-3.
  std::vector<Slot> slots_;
  std::vector<int> slot_of_;  // per unit: the slot its last grads_for() handed out
  int next_slot_ = 0;
  double wait_s_ = 0.0;
};

}  // namespace strata
