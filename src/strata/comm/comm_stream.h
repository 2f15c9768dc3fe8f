// An in-order executor of communication operations on one thread: the CPU analogue of a CUDA
// communication stream (DESIGN.md §5). OpenMPI's non-blocking collectives progress only inside
// MPI calls, so an issued MPI_Iallreduce overlaps nothing by itself; here a dedicated thread
// runs each queued operation with a blocking MPI call, strictly in issue order, while the
// issuing thread computes. Every rank issues the same operations in the same order, so the
// order on the wire matches across ranks.
//
// Operations live in a ring of kRingSize preallocated slots: submitting allocates nothing, and
// blocks while the ring is full. A blocking operation issued while the stream is idle runs on
// the caller's thread instead (nothing is queued before it, so the order is the same) and saves
// two thread hand-offs; the idle comm thread then watches it. A watchdog bounds every wait: when
// no operation has finished for the timeout, the job is aborted with a message naming the
// operation that is stuck.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/stream.h"

namespace strata::comm::detail {

enum class OpKind : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Send,
  Recv,
  Barrier,
  AllToAll,   // in (size · n), out (size · n): block j of in goes to rank j's block `rank`
  SendRecv,   // in (n) to peer, out (n) from src, at once
  AllToAllV,  // counts[j] elements of in to rank j, counts[size + j] from rank j into out
};
const char* op_name(OpKind k);  // "all_reduce", ...

// One queued operation: plain data, copied into a ring slot.
struct Op {
  OpKind kind = OpKind::Barrier;
  const void* in = nullptr;
  void* out = nullptr;
  size_t n = 0;  // elements (per rank for reduce_scatter and all_gather)
  DType dtype = DType::F32;
  DType wire = DType::F32;
  int peer = 0;  // root, destination or source
  int src = 0;   // SendRecv: the source (peer is the destination)
  int tag = 0;
  // AllToAllV: 2 · size element counts, what goes to each rank then what comes from each, in
  // rank order (the caller's, valid until the operation completes).
  const size_t* counts = nullptr;
  uint64_t flight = 0;  // its flight recorder entry (comm/flight_recorder.h); 0: not recorded
  // Issued asynchronously on a communicator set_polled_background: while it waits for its peers
  // its thread polls and sleeps instead of spinning inside MPI (Communicator, communicator.cc).
  bool background = false;
};

// Its sequence numbers are the events of the communication stream it plays (ops::Completion).
class CommStream final : public ops::Completion {
 public:
  static constexpr size_t kRingSize = 256;
  using Execute = std::function<void(const Op&)>;
  using Describe = std::function<std::string(const Op&)>;  // for the watchdog's message

  // Starts the thread, named thread_name (Linux keeps 15 characters).
  CommStream(const std::string& thread_name, Execute execute, Describe describe);
  // Runs what is queued (the watchdog still applies), then joins the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues op and returns its sequence number (1, 2, ...). The thread waits for `after` before it
  // runs op (before op reads its buffers).
  uint64_t submit(const Op& op, const ops::Event& after = {});
  // Blocks until operation seq has run; rethrows the exception it raised, once.
  void wait(uint64_t seq) override;
  // Runs op and everything queued before it, and returns when op is done; throws its error.
  void run_blocking(const Op& op);
  bool done(uint64_t seq) const override {
    return completed_.load(std::memory_order_acquire) >= seq;
  }
  // Blocks until everything submitted so far has run.
  void synchronize();
  size_t in_flight() const;

  // Leaves the thread to finish the operation it is running and skip the rest, without waiting
  // for it: for a stream destroyed while an exception unwinds the stack, when a peer may never
  // arrive. The caller must then leak this object (the thread still uses it).
  void abandon();

  // 0 disables the watchdog.
  void set_timeout(std::chrono::seconds t);
  std::chrono::seconds timeout() const { return std::chrono::seconds(timeout_s_.load()); }

 private:
  void run(std::string thread_name);
  // Waits on done_cv_ until pred holds; past the timeout, aborts the job.
  template <typename Pred>
  void wait_or_abort(std::unique_lock<std::mutex>& lock, Pred pred);
  [[noreturn]] void abort_stuck(int64_t timeout_s);  // mu_ held

  std::vector<Op> ring_;           // slot of seq s: (s - 1) % kRingSize
  std::vector<ops::Event> after_;  // per slot, what its operation waits for
  Execute execute_;
  Describe describe_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the thread waits for work
  std::condition_variable done_cv_;  // issuers wait for completion or a free slot
  uint64_t issued_ = 0;              // guarded by mu_
  std::atomic<uint64_t> completed_{0};
  bool stop_ = false;  // guarded by mu_
  std::atomic<bool> abandoned_{false};
  bool inline_active_ = false;  // guarded by mu_
  int waiters_ = 0;             // threads in done_cv_; guarded by mu_
  std::atomic<int64_t> timeout_s_{600};
  std::atomic<bool> has_errors_{false};
  std::vector<std::pair<uint64_t, std::exception_ptr>> errors_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace strata::comm::detail
