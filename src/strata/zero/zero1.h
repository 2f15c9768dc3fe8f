// ZeRO stage 1 (DESIGN.md §3-§5): the optimizer states are partitioned across the data-parallel
// group, the parameters and gradients are not. The model spec is built with align = dp, so every
// unit's flat range splits into dp equal contiguous chunks; rank r owns chunk r of every unit.
//
// At the accumulation boundary each unit's gradients are reduce-scattered in
// communication_data_type, so that each rank holds the sum over the group of its owned chunks
// (the rest of its gradient buffer is left stale). Units are issued from the end of the flat
// buffer towards its start (the order backward finishes them), the same on every rank by
// construction; with overlap_comm a unit is handed to the communication thread as soon as
// backward has finished it. After the optimizer has updated the owned chunks of the parameters,
// gather_params() all-gathers every unit in the parameter dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/dtype.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/optim/optimizer.h"

namespace strata {

class Zero1Sync final : public UnitHook {
 public:
  // spec: built with align = dp.size(). grads: the flat gradient buffer (spec.numel elements of
  // grad_dtype), outliving this object.
  Zero1Sync(comm::Communicator& dp, const ModelSpec& spec, void* grads, DType grad_dtype,
            DType wire_dtype, bool overlap);

  // The parameter ranges this rank owns, for a partitioned Optimizer: every parameter's part
  // inside an owned chunk, packed in unit order (padding elements belong to no range).
  const std::vector<ParamRange>& owned_ranges() const { return owned_ranges_; }
  // Elements of the optimizer state on this rank: spec.numel / dp (padding included).
  int64_t owned_numel() const { return owned_numel_; }

  // Arms the hook for the last micro-batch of an accumulation; other micro-batches reduce nothing.
  void begin_boundary();
  void unit_done(int unit) override;
  // Issues what is left and waits: each owned chunk of the gradients then holds the group's sum.
  void finish();

  // Σ g² over this rank's owned chunks of the gradients (after finish()); summed over the group
  // it is the global squared norm.
  double owned_sum_squares() const;
  // All-gathers every unit of params (spec.numel elements of param_dtype) from the owners.
  void gather_params(void* params, DType param_dtype);

  bool in_flight() const;
  // Seconds finish() spent waiting for communication in the last step: the exposed part.
  double exposed_seconds() const { return exposed_s_; }

 private:
  void issue(size_t unit);

  comm::Communicator& dp_;
  const int rank_, size_;
  char* grads_;
  DType grad_dtype_, wire_;
  bool overlap_;
  std::vector<UnitSpec> units_;
  std::vector<ParamRange> owned_ranges_;
  int64_t owned_numel_ = 0;
  std::vector<comm::Handle> pending_;  // reduce-scatters, one per unit
  std::vector<comm::Handle> gathers_;  // all-gathers, one per unit; reused every step
  size_t next_ = 0;                    // issued units so far, counting from the last
  int64_t done_floor_ = 0;             // every element at or above this offset is final
  int64_t numel_ = 0;
  bool armed_ = false;
  double exposed_s_ = 0.0;
};

}  // namespace strata
