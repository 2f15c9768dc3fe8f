#include "strata/comm/peer_exchange.h"

#include <thread>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/wire_reduce.h"
#include "strata/core/check.h"

namespace strata::comm {

PeerExchange::PeerExchange(const Communicator& group, std::chrono::seconds timeout)
    : name_(group.name()), timeout_(timeout) {
  STRATA_MPI_CHECK(MPI_Comm_dup(group.mpi_comm(), &comm_));
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  STRATA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

PeerExchange::~PeerExchange() {
  // Sends still in flight when an error unwinds the stack belong to a dying job: leave them.
  if (sends_.empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PeerExchange::send(const void* buf, size_t n, DType dtype, int dst, int tag,
                        const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  STRATA_CHECK(n <= size_t(INT32_MAX), "a pipeline message of ", n, " elements (", what,
               ") exceeds MPI's count");
  STRATA_MPI_CHECK(MPI_Isend(buf, int(n), detail::mpi_datatype(dtype), dst, tag, comm_, &r));
  sends_.push_back(r);
  bytes_ += n * dtype_size(dtype);
}

void PeerExchange::recv(void* buf, size_t n, DType dtype, int src, int tag, const char* what) {
  MPI_Request r = MPI_REQUEST_NULL;
  STRATA_MPI_CHECK(MPI_Irecv(buf, int(n), detail::mpi_datatype(dtype), src, tag, comm_, &r));
  wait(r, std::string(what) + " from " + name_ + " rank " + std::to_string(src) + " (tag " +
              std::to_string(tag) + ")");
}

void PeerExchange::wait_sends() {
  for (MPI_Request& r : sends_) wait(r, "completing a pipeline send on " + name_);
  sends_.clear();
}

// MPI_Test in a loop (progressing every other request of this process too), yielding the core;
// past the timeout the job is aborted naming what was awaited.
void PeerExchange::wait(MPI_Request& r, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    STRATA_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (timeout_.count() > 0 && std::chrono::steady_clock::now() - t0 > timeout_) {
      abort_job(1, "waited more than " + std::to_string(timeout_.count()) + " s for " + what +
                       " (a stage failed or the schedules disagree); aborting the job");
    }
    if (spins > 64) std::this_thread::yield();
  }
}

}  // namespace strata::comm
