// ZeRO stage 3's static gather order (DESIGN.md §5): every parameter acquire of a step, in order,
// with the places where the model begins a pass. It is recorded from the model's own passes run
// dry (kernels/ops.h DryRun) with GatherRecorder as their hook, so the order is the code's:
// param_trace() for one micro-batch of the whole model, or the pipeline's dry run of a stage's
// whole schedule (pipeline/executor.h: dry_run_stage), whose forward, backward, input-gradient and
// weight-gradient actions of every micro-batch and model chunk come in the schedule's order. It is
// a pure function of (model, layout, schedule), so every rank of a shard group gathers the same
// units in the same order.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "strata/model/transformer.h"

namespace strata {

struct GatherOrder {
  struct PassStart {
    UnitHook::Pass pass = UnitHook::Pass::Forward;
    size_t at = 0;  // position in `units` of the pass's first acquire
  };
  std::vector<int> units;         // the acquired units, in order
  std::vector<PassStart> passes;  // each begin_pass, in order
  bool empty() const { return passes.empty(); }
};

// A hook that records begin_pass and acquire_params into an order. It places every unit (and its
// gradients) at a dummy address: for dry runs only, which touch no memory.
class GatherRecorder final : public UnitHook {
 public:
  void begin_pass(Pass p) override { order_.passes.push_back({p, order_.units.size()}); }
  const void* acquire_params(int unit) override {
    order_.units.push_back(unit);
    return nowhere_;
  }
  void* grads_for(int /*unit*/) override { return nowhere_; }
  const GatherOrder& order() const { return order_; }
  GatherOrder take() { return std::move(order_); }

 private:
  GatherOrder order_;
  alignas(64) char nowhere_[64] = {};
};

// One micro-batch of the whole model as one chunk: its forward, then its backward (param_trace),
// with blocks fully recomputed by `recompute_full`.
GatherOrder one_micro_order(const ModelSpec& spec, const std::vector<char>& recompute_full);
// Its forward alone (an evaluation pass).
GatherOrder forward_order(const ModelSpec& spec, const std::vector<char>& recompute_full);

}  // namespace strata
