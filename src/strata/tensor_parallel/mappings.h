// The tensor-parallel group and Megatron's mappings between the model's regions
// (../shared/reference/megatron.md §1, megatron/core/tensor_parallel/mappings.py), on views of
// (rows, C) activations, N rows in all:
//   replicated:         every rank holds the same (N, C) (a norm's output without sequence
//                       parallelism, the residual stream);
//   tensor-parallel:    every rank holds its own (N, C), a partial sum or its own columns' part
//                       (a column-parallel linear's input gradient, a row-parallel linear's
//                       output before the sum);
//   sequence-parallel:  rank r holds rows [r·Ns, (r+1)·Ns) of (N, C), Ns = N / size.
// Each mapping is a pair of halves: forward, issued in the forward pass, and backward, its adjoint
// issued in the backward pass (⟨forward(x), y⟩ = ⟨x, backward(y)⟩, where the inner product of a
// tensor-parallel or sequence-parallel tensor sums over the ranks and that of a replicated one
// is taken once). Each half returns the view it leaves its result in.
//
// Every call is a blocking collective over the group, issued in the same order on every rank by
// construction (the model's static order); the time spent in them is the step's exposed
// tensor-parallel communication. Megatron's scatter_to_ and gather_from_tensor_model_parallel_
// region (split and gather of the last dimension) have no use here: no layer gathers its output
// columns (the head's logits stay vocabulary-parallel into the cross-entropy).
#pragma once

#include <cstdint>

#include "strata/core/tensor.h"

namespace strata::comm {
class Communicator;
}

namespace strata::tp {

// The group's raw collectives: what the mappings below are built on, and what the few
// collectives that are no mapping's half call directly (each says why where it is issued).
class Group {
 public:
  // comm: the tensor-parallel communicator, or nullptr for one rank (all_reduce is then a no-op;
  // all_gather and reduce_scatter need more than one rank). kv: the ranks that hold the same
  // key/value heads (kv_heads < tp), or nullptr.
  Group(comm::Communicator* comm = nullptr, comm::Communicator* kv = nullptr,
        bool sequence_parallel = false);
  // A group's shape alone, without communicators: for dry runs (kernels/ops.h DryRun), in which
  // no collective runs, and for sizing a chunk's memory (transformer_arena_bytes).
  Group(int size, int rank, bool sequence_parallel = false)
      : sp_(sequence_parallel), size_(size), rank_(rank) {}

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sp_ && size_ > 1; }
  comm::Communicator* comm() const { return comm_; }
  comm::Communicator* kv() const { return kv_; }

  // t summed over the group, in place.
  void all_reduce(Tensor t);
  // Σ over `over` (the group, or kv()), in place.
  void all_reduce(Tensor t, comm::Communicator* over);
  // shard (rows/size, …) of every rank → full (rows, …), concatenated in rank order.
  void all_gather(Tensor full, Tensor shard);
  // full (rows, …) summed over the group, this rank's block of rows → shard (rows/size, …).
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

// copy_to_tensor_model_parallel_region: a replicated (N, C) tensor entering a column-parallel
// linear, whose ranks each compute their own output columns from all of it.
namespace copy_to_region {
// Identity: every rank already holds x (N, C).
inline Tensor forward(Group&, Tensor x) {
  return x;
}
// dx (N, C): each rank's input gradient from its own columns, summed over the group in place.
inline Tensor backward(Group& g, Tensor dx) {
  g.all_reduce(dx);
  return dx;
}
}  // namespace copy_to_region

// reduce_from_tensor_model_parallel_region: a row-parallel linear's partial outputs (each rank's
// sum over its own input columns) into the replicated result.
namespace reduce_from_region {
// y (N, C) summed over the group in place.
inline Tensor forward(Group& g, Tensor y) {
  g.all_reduce(y);
  return y;
}
// Identity: the replicated dy (N, C) is every rank's gradient of its partial output.
inline Tensor backward(Group&, Tensor dy) {
  return dy;
}
}  // namespace reduce_from_region

// gather_from_sequence_parallel_region: a sequence-parallel (Ns, C) tensor entering a
// column-parallel linear, which reads every row.
namespace gather_from_sp_region {
// full (N, C) = every rank's shard (Ns, C), concatenated in rank order.
inline Tensor forward(Group& g, Tensor full, Tensor shard) {
  g.all_gather(full, shard);
  return full;
}
// dshard (Ns, C) = this rank's rows of the group's sum of dfull (N, C): each rank's input
// gradient from its own columns covers every row.
inline Tensor backward(Group& g, Tensor dshard, Tensor dfull) {
  g.reduce_scatter(dshard, dfull);
  return dshard;
}
}  // namespace gather_from_sp_region

// reduce_scatter_to_sequence_parallel_region: a row-parallel linear's partial outputs (N, C)
// into the sequence-parallel sum, each rank keeping its block of rows.
namespace reduce_scatter_to_sp_region {
// shard (Ns, C) = this rank's rows of the group's sum of full (N, C).
inline Tensor forward(Group& g, Tensor shard, Tensor full) {
  g.reduce_scatter(shard, full);
  return shard;
}
// dfull (N, C) = every rank's dshard (Ns, C), concatenated in rank order: each rank's partial
// output covers every row.
inline Tensor backward(Group& g, Tensor dfull, Tensor dshard) {
  g.all_gather(dfull, dshard);
  return dfull;
}
}  // namespace reduce_scatter_to_sp_region

}  // namespace strata::tp
