// Communicator: the collectives of one process group (DESIGN.md §5). It owns a duplicate of
// the MPI communicator it is given and one communication thread (comm_stream.h) that runs its
// operations in issue order; the asynchronous forms return as soon as the operation is queued.
//
// Buffers are flat arrays of `dtype` elements. `wire` is DeepSpeed's communication_data_type:
// when it differs from dtype, the comm thread converts into a scratch buffer (CommBuffers,
// grown once and reused), reduces in the wire dtype (bf16/fp16 sums add in fp32 and round to
// nearest even at every step) and converts back.
//
// Every rank of the group must issue the same operations in the same order (strata's schedules
// are static, so they do by construction); issue them from one thread. A buffer belongs to the
// communicator from the call until its handle's wait() returns. A blocking call waits for the
// operations issued before it, then runs (on the caller's thread when nothing is queued).
//
// Ordering with the device (kernels/ops.h, streams and events): a blocking call reads buffers
// written by work issued to the compute stream before it, and its results are visible to work
// issued there after it returns. The CPU keeps that by running the call to completion; a device
// backend keeps it inside this layer (the collective issued on the communication stream after
// an event recorded on compute, compute waiting on its completion), so callers of the blocking
// forms (the tensor-parallel mappings, the loss and norm reductions) need no events of their own.
// The asynchronous forms take and give events explicitly.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/core/dtype.h"
#include "strata/core/stream.h"

namespace strata::comm {

namespace detail {
class CommStream;
struct CommState;
struct Op;
}  // namespace detail

// Completion of one asynchronous operation. Cheap to move; must not outlive its Communicator.
// An empty (default) or already waited handle is done and waits for nothing.
class Handle {
 public:
  Handle() = default;
  Handle(Handle&& o) noexcept : stream_(o.stream_), seq_(o.seq_) { o.stream_ = nullptr; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // Blocks until the operation has completed (and every operation issued before it); rethrows
  // the exception it raised on the comm thread. Past the communicator's timeout, aborts the job.
  void wait();
  bool done() const;
  // The event of its completion on the communication stream, for the stream that consumes the
  // result: ops::wait(compute, h.event()) where the data is read. Complete for an empty handle.
  ops::Event event() const;

 private:
  friend class Communicator;
  Handle(detail::CommStream* stream, uint64_t seq) : stream_(stream), seq_(seq) {}
  detail::CommStream* stream_ = nullptr;
  uint64_t seq_ = 0;
};

class Communicator {
 public:
  // Collective over the ranks of comm (MPI_Comm_dup). name ("world", "dp", "tp", "pp") appears
  // in error and watchdog messages. comm::init must have run.
  Communicator(MPI_Comm comm, std::string name);
  // Runs what is queued, then joins the thread. When an exception is unwinding the stack while
  // operations are still queued (a peer may never join them), it does not wait: the thread is
  // detached and its state left to the dying job.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // A new communicator over the ranks of this group with the same color, ordered by key (as
  // MPI_Comm_split); collective over this group. Waits for the operations issued so far.
  std::unique_ptr<Communicator> split(int color, int key, std::string name);
  // The ranks of the `inner` groups of every member of this group, as one communicator ordered
  // by (this group's rank, inner rank): e.g. the tensor-parallel groups of a stage's data-parallel
  // ranks, the stage's tp × dp ranks. Every member's inner group has one size and holds the same
  // members in the same order for each of its ranks (the axis groups of a grid do). Collective
  // over those ranks only.
  std::unique_ptr<Communicator> product(Communicator& inner, std::string name);

  const std::string& name() const;
  // The group's MPI communicator (this object's duplicate), for PeerExchange to duplicate.
  MPI_Comm mpi_comm() const;
  int rank() const;
  int size() const;

  // Watchdog: an operation that runs longer than t while this rank waits for it (or for a
  // later one) aborts the job with a message naming the rank, the operation and the group.
  // Default 600 s; 0 disables it.
  void set_timeout(std::chrono::seconds t);
  std::chrono::seconds timeout() const;
  // Asynchronous all-reduces and reduce-scatters issued from now on run as non-blocking MPI
  // requests their thread polls, sleeping while another thread of the process is inside a
  // blocking MPI operation (which progresses them too), instead of blocking calls that spin.
  // For the background reductions beside the compute thread's own blocking collectives (tensor
  // or context parallelism) on cores the ranks share: measured 43 -> 18 ms a step at dp 2 x tp 2
  // + sp with overlap_comm on 2 cores. Off by default: alone, MPI's blocking algorithms are
  // faster (dp 2 on bench-23M: 0.50 s a step against 0.53 s polled).
  void set_polled_background(bool on);

  // buf (n): summed over the group, in place.
  void all_reduce(void* buf, size_t n, DType dtype, DType wire);
  // in (size * n_per_rank), out (n_per_rank): out = block `rank` of the sum over the group.
  // out may lie inside in (e.g. out = in + rank * n_per_rank).
  void reduce_scatter(const void* in, void* out, size_t n_per_rank, DType dtype, DType wire);
  // in (n_per_rank), out (size * n_per_rank): out = the ranks' inputs concatenated by rank.
  // in may be out's own block (in = out + rank * n_per_rank): the in-place form.
  void all_gather(const void* in, void* out, size_t n_per_rank, DType dtype);
  // buf (n): root's buf on every rank.
  void broadcast(void* buf, size_t n, DType dtype, int root);
  // Point-to-point within the group; dst and src are ranks of this group. Ordered with the
  // collectives like every other operation.
  void send(const void* buf, size_t n, DType dtype, int dst, int tag);
  void recv(void* buf, size_t n, DType dtype, int src, int tag);
  // in (size · n_per_rank), out (size · n_per_rank), apart: block j of in goes to rank j, whose
  // block `rank` of out receives it (MPI_Alltoall).
  void all_to_all(const void* in, void* out, size_t n_per_rank, DType dtype);
  // counts (2 · size): counts[j] elements of in go to rank j and counts[size + j] come from rank j,
  // both in rank order (MPI_Alltoallv); each rank's counts must match its peers'.
  void all_to_all_v(const void* in, void* out, const size_t* counts, DType dtype);
  // Sends in (n) to dst and receives out (n) from src at once (MPI_Sendrecv): a ring's step,
  // which cannot deadlock however the ranks' sends and receives pair.
  void send_recv(const void* in, int dst, void* out, int src, size_t n, DType dtype, int tag);
  void barrier();

  // `after`: the event the communication stream waits for before it reads the buffers (the
  // compute that wrote them, or the release of a buffer an operation overwrites).
  Handle all_reduce_async(void* buf, size_t n, DType dtype, DType wire,
                          const ops::Event& after = {});
  Handle reduce_scatter_async(const void* in, void* out, size_t n_per_rank, DType dtype, DType wire,
                              const ops::Event& after = {});
  Handle all_gather_async(const void* in, void* out, size_t n_per_rank, DType dtype,
                          const ops::Event& after = {});
  Handle broadcast_async(void* buf, size_t n, DType dtype, int root, const ops::Event& after = {});
  // counts must stay as they are until the operation has completed.
  Handle all_to_all_v_async(const void* in, void* out, const size_t* counts, DType dtype,
                            const ops::Event& after = {});
  // Point-to-point and barrier run in issue order like the collectives: pair sends and receives
  // across ranks as the blocking forms would be paired.
  Handle send_async(const void* buf, size_t n, DType dtype, int dst, int tag,
                    const ops::Event& after = {});
  Handle recv_async(void* buf, size_t n, DType dtype, int src, int tag,
                    const ops::Event& after = {});
  Handle send_recv_async(const void* in, int dst, void* out, int src, size_t n, DType dtype,
                         int tag, const ops::Event& after = {});
  Handle barrier_async();

  // Blocks until every operation issued so far has completed.
  void synchronize();

  // Bytes this rank has put on the wire for the operations issued so far, as bandwidth-optimal
  // algorithms move them (ring all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather
  // (N-1)/N of the N blocks, in the wire dtype): the volume ZeRO's 2Ψ / 3Ψ analysis counts.
  // Counted at issue from what strata really asks MPI to move, not from a formula of the model.
  uint64_t wire_bytes() const;

 private:
  Handle enqueue(const detail::Op& op, const ops::Event& after);
  void run(const detail::Op& op);
  std::unique_ptr<detail::CommState> s_;
};

}  // namespace strata::comm
