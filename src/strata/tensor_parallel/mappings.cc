#include "strata/tensor_parallel/mappings.h"

#include <chrono>

#include "strata/comm/communicator.h"
#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata::tp {

namespace {

class Timer {
 public:
  explicit Timer(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Group::Group(comm::Communicator* comm, comm::Communicator* kv, bool sequence_parallel)
    : comm_(comm), kv_(kv), sp_(sequence_parallel) {
  if (comm_ != nullptr) size_ = comm_->size(), rank_ = comm_->rank();
}

void Group::all_reduce(Tensor t) {
  all_reduce(t, comm_);
}

void Group::all_reduce(Tensor t, comm::Communicator* over) {
  if (over == nullptr || over->size() == 1 || ops::dry_run()) return;
  Timer timer(seconds_);
  over->all_reduce(t.data, size_t(t.numel()), t.dtype, t.dtype);
}

void Group::all_gather(Tensor full, Tensor shard) {
  STRATA_CHECK(full.numel() == shard.numel() * size_ && full.dtype == shard.dtype,
               "tensor-parallel all-gather of ", shard.shape_str(), " into ", full.shape_str());
  STRATA_CHECK(size_ > 1, "all-gather over a tensor-parallel group of one rank");
  if (ops::dry_run()) return;
  Timer timer(seconds_);
  comm_->all_gather(shard.data, full.data, size_t(shard.numel()), full.dtype);
}

void Group::reduce_scatter(Tensor shard, Tensor full) {
  STRATA_CHECK(full.numel() == shard.numel() * size_ && full.dtype == shard.dtype,
               "tensor-parallel reduce-scatter of ", full.shape_str(), " into ", shard.shape_str());
  STRATA_CHECK(size_ > 1, "reduce-scatter over a tensor-parallel group of one rank");
  if (ops::dry_run()) return;
  Timer timer(seconds_);
  comm_->reduce_scatter(full.data, shard.data, size_t(shard.numel()), full.dtype, full.dtype);
}

}  // namespace strata::tp
