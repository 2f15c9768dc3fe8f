// Point-to-point transfers between pipeline stages that cannot deadlock, whatever the message
// size (DESIGN.md §6): every send is non-blocking (MPI_Isend from a copy in a ring of send
// buffers) and completes in the background while the sender goes on; a receive waits for its
// message (MPI_Irecv, then MPI_Test with the watchdog), so a stage only ever waits for data a
// peer has sent or will send without waiting itself. A schedule the checker accepts
// (pipeline/schedule_check.h, under exactly these semantics) therefore runs to completion.
//
// The ring holds as many messages as the caller bounds in flight (a schedule's sends that its
// peers have not yet received); a send that finds every buffer busy first completes the oldest
// send. Nothing is allocated after construction. Runs on the calling thread, on its own duplicate
// of the group's MPI communicator, beside the group's collectives (MPI_THREAD_MULTIPLE). On a GPU
// both directions are staged through pinned host memory (the send ring and one receive buffer).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/core/stream.h"

namespace strata::comm {

class Communicator;

class PeerExchange {
 public:
  // Over the ranks of `group` (a collective over it: the communicator is duplicated), with
  // `slots` send buffers of `slot_bytes` each. A receive or send waiting longer than `timeout`
  // (0: forever) aborts the job naming this rank, the peer and the message.
  PeerExchange(const Communicator& group, std::chrono::seconds timeout, int slots,
               size_t slot_bytes);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // Copies buf (n elements) into a send buffer, once `after` (the compute that wrote buf) is
  // done, and sends it to group rank dst; buf is free on return. `what` names the message in
  // errors.
  void send(const void* buf, size_t n, DType dtype, int dst, int tag, const char* what,
            const ops::Event& after);
  // Blocks until the message from src with tag arrives in buf; returns the event a consumer
  // waits on before reading buf (complete: the message is in buf when this returns).
  [[nodiscard]] ops::Event recv(void* buf, size_t n, DType dtype, int src, int tag,
                                const char* what);
  // Completes every send issued so far.
  void wait_sends();

 private:
  void wait(MPI_Request& r, const char* what, int peer, int tag, uint64_t flight_id);
  void check_tag(int tag, const char* what) const;
  int tag_ub_ = 32767;  // the MPI standard's least guarantee, until the library says
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::chrono::seconds timeout_;
  Buffer ring_;
  // A GPU run's receives land here first (the MPI transport reads and writes host memory), then
  // are copied onto the device; empty on the CPU device, where MPI receives in place.
  Buffer recv_stage_;
  size_t slot_bytes_;
  std::vector<MPI_Request> requests_;  // per slot; MPI_REQUEST_NULL when free
  std::vector<int> peer_of_, tag_of_;  // per slot, for error messages
  std::vector<uint64_t> flight_of_;    // per slot, the send's flight recorder entry
  int flight_group_ = 0;
  size_t next_ = 0;  // the oldest slot (sends are issued round robin)
};

}  // namespace strata::comm
