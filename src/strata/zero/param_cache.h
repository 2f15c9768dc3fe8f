// ZeRO stage 3's parameter cache (DESIGN.md §5): which units are gathered, into which buffer,
// and when. Decisions depend only on the static gather order of a step (gather_order.h: every
// pass of every micro-batch and model chunk a pipeline stage runs, in its schedule's order) and
// the settings, so every rank of a shard group issues the same gathers in the same order; the
// gathers themselves go through a callback, so the cache can be tested without MPI.
//
// A unit's parameters are gathered into a buffer before forward or backward reads them and
// released after. Every begin_pass and every acquire is checked against the static order (ranks
// cannot diverge into a hang); the order repeats (the next step, the next evaluation pass).
// Gathers of the next units in that order are issued ahead while compute runs, up to
// stage3_prefetch_bucket_size elements; a released unit stays resident when its next use in the
// order is within stage3_max_reuse_distance elements (without reshard_after_forward: whenever it
// has a next use), until its buffer is needed for a unit used sooner; at most
// stage3_max_live_parameters elements are resident, except that the unit being acquired is always
// gathered (also past the limit, when nothing else can be released). Persistent units
// (persistent_unit()) are never gathered here: the owner keeps them whole.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/stream.h"
#include "strata/model/transformer.h"
#include "strata/zero/partition.h"

namespace strata {

class ParamCache {
 public:
  // Starts gathering `unit` into dst (the unit's numel elements) once `released` is done (the
  // compute that last read the buffer); returns its completion.
  using Gather = std::function<comm::Handle(int unit, void* dst, const ops::Event& released)>;

  // slots: bufs.param_slot_count buffers of bufs.param_slot_elems elements of elem_bytes each.
  // persistent: per unit, its whole copy or nullptr.
  ParamCache(const ModelSpec& spec, const ZeroOptions& o, const ZeroBuffers& bufs,
             size_t elem_bytes, char* slots, std::vector<char*> persistent, Gather gather);
  ParamCache(const ParamCache&) = delete;  // follows its own orders by pointer
  ParamCache& operator=(const ParamCache&) = delete;

  // At the start of a training step: its order (o.step_order), from the top.
  void begin_step() { use(step_); }
  // Before an evaluation's forward passes: their order (o.eval_order), from the top.
  void begin_eval() { use(eval_); }
  void begin_pass(UnitHook::Pass pass);
  // The unit's parameters, gathered (waiting for its gather if needed).
  const void* acquire(int unit);
  void release(int unit);
  // End of the step: every unit is released; gathered units are dropped (they change).
  void drop_all();

  // The unit's whole copy when it is persistent, else nullptr.
  char* persistent(int unit) const { return persistent_[size_t(unit)]; }

  bool in_flight() const;
  double wait_seconds() const { return wait_s_; }
  void reset_wait() { wait_s_ = 0.0; }
  // Most elements of gathered units resident at once since creation.
  int64_t peak_live_elements() const { return peak_live_; }

 private:
  struct State {
    int slot = -1;  // buffer while gathered or gathering
    bool gathering = false, prefetched = false;
    int refs = 0;
    comm::Handle gather;
  };

  // An order with, per unit, its positions in it and the elements acquired before each position.
  struct Order {
    GatherOrder order;
    std::vector<std::vector<int>> uses;  // per unit, ascending
    std::vector<int64_t> before;         // before[j]: elements of units[0, j)
  };
  Order index(GatherOrder o) const;
  void use(const Order& o);

  char* slot_data(const State& st) const;
  int next_use(int unit, size_t from) const;  // trace position, or -1
  int64_t distance(size_t from, size_t to) const;
  bool make_room(int unit, int64_t use_at, bool must);
  void evict(int unit);
  void gather(int unit);
  void prefetch();

  std::vector<UnitSpec> units_;
  ZeroOptions o_;
  size_t ps_;
  int64_t slot_elems_;
  char* slots_;
  std::vector<char*> persistent_;
  Gather issue_;
  std::vector<State> state_;
  std::vector<int> free_slots_;
  std::vector<ops::Event> released_;  // per slot: its last reader, which a gather into it follows
  Order step_, eval_;
  const Order* now_ = nullptr;               // the order being followed
  const std::vector<int>* trace_ = nullptr;  // its units
  size_t pos_ = 0, next_pass_ = 0;
  int64_t live_ = 0, peak_live_ = 0;
  double wait_s_ = 0.0;
};

}  // namespace strata
