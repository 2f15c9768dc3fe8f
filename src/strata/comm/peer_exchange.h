// Point-to-point transfers between pipeline stages that cannot deadlock, whatever the message
// size (DESIGN.md §6): every send is non-blocking (MPI_Isend) and completes in the background
// while the sender goes on; a receive waits for its message (MPI_Irecv, then MPI_Test with the
// watchdog), so a stage only ever waits for data some peer has sent or will send without waiting
// itself. A schedule the checker accepts (pipeline/schedule.h, under exactly these semantics)
// therefore runs to completion. wait_sends() completes the sends (at the end of a step, before
// their buffers are reused).
//
// Runs on the calling thread, on its own duplicate of the group's MPI communicator, beside the
// group's collectives (MPI_THREAD_MULTIPLE).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/dtype.h"

namespace strata::comm {

class Communicator;

class PeerExchange {
 public:
  // Over the ranks of `group` (a collective over it: the communicator is duplicated). A receive
  // waiting longer than `timeout` (0: forever) aborts the job naming this rank, the peer and
  // the message.
  PeerExchange(const Communicator& group, std::chrono::seconds timeout);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // buf (n elements) to group rank dst; buf must stay unchanged until wait_sends().
  void send(const void* buf, size_t n, DType dtype, int dst, int tag, const char* what);
  // Blocks until the message from src with tag arrives in buf.
  void recv(void* buf, size_t n, DType dtype, int src, int tag, const char* what);
  // Completes every send issued so far.
  void wait_sends();
  uint64_t bytes_sent() const { return bytes_; }

 private:
  void wait(MPI_Request& r, const std::string& what);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::string name_;
  std::chrono::seconds timeout_;
  std::vector<MPI_Request> sends_;
  uint64_t bytes_ = 0;
};

}  // namespace strata::comm
