// Data-parallel gradient reduction (DESIGN.md §3, §5): at the accumulation boundary the flat
// gradient buffer is summed across the data-parallel group in buckets of reduce_bucket_size
// elements, in communication_data_type. Buckets are cut once, from the end of the flat buffer
// (where backward finishes first) towards its start, so every rank issues the same collectives
// in the same order by construction. With overlap_comm a bucket is handed to the communication
// thread as soon as backward has finished every unit it touches, and reduces while backward
// goes on; without it, all buckets are reduced after backward.
//
// Each micro-batch's loss gradient is already scaled by 1/(tokens of the global batch), so a sum
// across ranks is the gradient of the global mean: nothing is divided afterwards.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/dtype.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"

namespace strata {

class GradSync final : public UnitHook {
 public:
  // grads: the flat gradient buffer (spec.numel elements of grad_dtype), outliving this object.
  GradSync(comm::Communicator& dp, const ModelSpec& spec, void* grads, DType grad_dtype,
           DType wire_dtype, int64_t bucket_elems, bool overlap);

  // Arms the hook for the last micro-batch of an accumulation; other micro-batches reduce nothing.
  void begin_boundary();
  void unit_done(int unit) override;
  // Issues what is left and waits for every bucket: the gradients are then summed on all ranks.
  void finish();

  struct Bucket {
    int64_t begin, end;  // element range in the flat buffer
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Whether a bucket's reduction may still be running (an error interrupted the step).
  bool in_flight() const;
  // Seconds finish() spent waiting for communication in the last step: the exposed part.
  double exposed_seconds() const { return exposed_s_; }

 private:
  void issue(size_t bucket);

  comm::Communicator& dp_;
  char* grads_;
  DType grad_dtype_, wire_;
  bool overlap_;
  std::vector<Bucket> buckets_;        // in issue order: descending offsets
  std::vector<int64_t> unit_begin_;    // flat offset where each unit starts
  std::vector<comm::Handle> pending_;  // one per bucket, reserved up front
  size_t next_ = 0;                    // next bucket to issue
  int64_t numel_ = 0;
  int64_t done_floor_ = 0;  // every element at or above this offset is final
  bool armed_ = false;
  double exposed_s_ = 0.0;
};

}  // namespace strata
