#include "strata/comm/peer_exchange.h"

#include <climits>
#include <cstring>
#include <string>
#include <thread>

#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/wire_reduce.h"
#include "strata/core/check.h"
#include "strata/core/device_memory.h"
#include "strata/kernels/ops.h"

namespace strata::comm {

PeerExchange::PeerExchange(const Communicator& group, std::chrono::seconds timeout, int slots,
                           size_t slot_bytes)
    : timeout_(timeout),
      ring_(Buffer::host(MemCategory::CommBuffers, size_t(std::max(slots, 1)) * slot_bytes)),
      recv_stage_(default_device() == Device::CUDA
                      ? Buffer::host(MemCategory::CommBuffers, slot_bytes)
                      : Buffer()),
      slot_bytes_(slot_bytes),
      requests_(size_t(std::max(slots, 1)), MPI_REQUEST_NULL),
      peer_of_(requests_.size(), -1),
      tag_of_(requests_.size(), -1),
      flight_of_(requests_.size(), 0) {
  STRATA_MPI_CHECK(MPI_Comm_dup(group.mpi_comm(), &comm_));
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  int* ub = nullptr;
  int found = 0;
  STRATA_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found));
  if (found && ub != nullptr) tag_ub_ = *ub;
  flight_group_ = flight::register_group(group.name() + "-p2p", comm_);
}

PeerExchange::~PeerExchange() {
  // Sends still in flight when an error unwinds the stack belong to a dying job: leave them.
  for (MPI_Request r : requests_) {
    if (r != MPI_REQUEST_NULL) {
      ring_.leak();
      return;
    }
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PeerExchange::send(const void* buf, size_t n, DType dtype, int dst, int tag, const char* what,
                        const ops::Event& after) {
  check_tag(tag, what);
  const size_t bytes = n * dtype_size(dtype);
  STRATA_CHECK(bytes <= slot_bytes_ && n <= size_t(INT_MAX), "a pipeline message of ", bytes,
               " bytes (", what, ") exceeds its ", slot_bytes_, "-byte send buffer");
  const size_t k = next_;
  next_ = (next_ + 1) % requests_.size();
  if (requests_[k] != MPI_REQUEST_NULL) {
    wait(requests_[k], what, peer_of_[k], tag_of_[k], flight_of_[k]);
  }
  char* slot = static_cast<char*>(ring_.data()) + k * slot_bytes_;
  after.wait();
  // Staged through the host ring: the send may complete after the sender's buffer is reused.
  ops::copy_to_host(slot, Tensor(const_cast<void*>(buf), dtype, {int64_t(n)}));
  peer_of_[k] = dst, tag_of_[k] = tag;
  flight_of_[k] = flight::issue(flight_group_, flight::Kind::Send, "send", dst, tag, bytes);
  flight::start(flight_of_[k]);
  STRATA_MPI_CHECK(
      MPI_Isend(slot, int(n), detail::mpi_datatype(dtype), dst, tag, comm_, &requests_[k]));
}

ops::Event PeerExchange::recv(void* buf, size_t n, DType dtype, int src, int tag,
                              const char* what) {
  STRATA_CHECK(n <= size_t(INT_MAX), "a pipeline message of ", n, " elements (", what,
               ") exceeds MPI's count");
  check_tag(tag, what);
  MPI_Request r = MPI_REQUEST_NULL;
  const uint64_t id =
      flight::issue(flight_group_, flight::Kind::Recv, "recv", src, tag, n * dtype_size(dtype));
  flight::start(id);
  if (ops::device_of(buf) == Device::CUDA) {
    // MPI reads and writes host memory: receive into the stage, then copy it onto the device
    // (the copy is complete, and the stage free again, when copy_from_host returns).
    const size_t bytes = n * dtype_size(dtype);
    STRATA_CHECK(bytes <= recv_stage_.bytes(), "a pipeline message of ", bytes, " bytes (", what,
                 ") exceeds its ", recv_stage_.bytes(), "-byte receive stage");
    STRATA_MPI_CHECK(
        MPI_Irecv(recv_stage_.data(), int(n), detail::mpi_datatype(dtype), src, tag, comm_, &r));
    wait(r, what, src, tag, id);
    ops::copy_from_host(Tensor(buf, dtype, {int64_t(n)}), recv_stage_.data());
    return {};
  }
  // The transport writes the (CPU) device buffer itself, as NCCL would.
  const device_memory::Access access;
  STRATA_MPI_CHECK(MPI_Irecv(buf, int(n), detail::mpi_datatype(dtype), src, tag, comm_, &r));
  wait(r, what, src, tag, id);
  return {};
}

void PeerExchange::check_tag(int tag, const char* what) const {
  STRATA_INPUT_CHECK(tag >= 0 && tag <= tag_ub_, "pipeline message tag ", tag, " (", what,
                     ") exceeds this MPI library's MPI_TAG_UB ", tag_ub_,
                     ": fewer micro-batches per step (gradient_accumulation_steps) or model "
                     "chunks (parallelism.pipeline x virtual_stages)");
}

void PeerExchange::wait_sends() {
  for (size_t k = 0; k < requests_.size(); ++k) {
    if (requests_[k] != MPI_REQUEST_NULL) {
      wait(requests_[k], "a send", peer_of_[k], tag_of_[k], flight_of_[k]);
    }
  }
}

// MPI_Test in a loop (progressing every other request of this process too), yielding the core;
// past the timeout the job is aborted naming what was awaited. Allocates nothing unless it fails.
// `id`: the operation's flight recorder entry, completed here.
void PeerExchange::wait(MPI_Request& r, const char* what, int peer, int tag, uint64_t id) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    STRATA_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) return flight::complete(id);
    if (timeout_.count() > 0 && std::chrono::steady_clock::now() - t0 > timeout_) {
      flight::mark_stuck(id);
      abort_job(1, "waited more than " + std::to_string(timeout_.count()) + " s for " + what +
                       " with pipeline peer " + std::to_string(peer) + " (tag " +
                       std::to_string(tag) +
                       "): a stage failed or the schedules disagree; aborting the job");
    }
    if (spins > 64) std::this_thread::yield();
  }
}

}  // namespace strata::comm
