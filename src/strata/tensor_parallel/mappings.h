// The tensor-parallel group as the model's layers use it: Megatron's mappings between the
// replicated, tensor-parallel and sequence-parallel regions (../shared/reference/megatron.md §1),
// on views of (rows, C) activations. Every call is a blocking collective over the group, issued in
// the same order on every rank by construction (the model's static order); the time spent in
// them is the step's exposed tensor-parallel communication.
#pragma once

#include <cstdint>

#include "strata/core/tensor.h"

namespace strata::comm {
class Communicator;
}

namespace strata::tp {

class Group {
 public:
  // comm: the tensor-parallel communicator, or nullptr for one rank (all_reduce is then a no-op;
  // the model calls all_gather and reduce_scatter only with more than one rank). kv: the ranks
  // that hold the same key/value heads (kv_heads < tp), or nullptr.
  Group(comm::Communicator* comm = nullptr, comm::Communicator* kv = nullptr,
        bool sequence_parallel = false);
  // A group's shape alone, without communicators: for dry runs (kernels/ops.h DryRun), in which
  // no collective runs.
  Group(int size, int rank) : size_(size), rank_(rank) {}

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sp_ && size_ > 1; }
  comm::Communicator* comm() const { return comm_; }
  comm::Communicator* kv() const { return kv_; }

  // t summed over the group, in place (reduce_from_tensor_model_parallel_region's forward, and
  // copy_to_…'s backward).
  void all_reduce(Tensor t);
  // Σ over `over` (the group, or kv()), in place.
  void all_reduce(Tensor t, comm::Communicator* over);
  // shard (rows/size, …) of every rank → full (rows, …), concatenated in rank order
  // (gather_from_sequence_parallel_region's forward).
  void all_gather(Tensor full, Tensor shard);
  // full (rows, …) summed over the group, this rank's block of rows → shard
  // (reduce_scatter_to_sequence_parallel_region's forward).
  void reduce_scatter(Tensor shard, Tensor full);

  // Seconds spent in the collectives since the last reset (their bytes: the communicators'
  // wire_bytes).
  double seconds() const { return seconds_; }
  void reset_seconds() { seconds_ = 0.0; }

 private:
  comm::Communicator* comm_ = nullptr;
  comm::Communicator* kv_ = nullptr;
  bool sp_ = false;
  int size_ = 1, rank_ = 0;
  double seconds_ = 0.0;
};

}  // namespace strata::tp
