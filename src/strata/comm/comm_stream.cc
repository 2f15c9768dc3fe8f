#include "strata/comm/comm_stream.h"

#include <omp.h>
#include <pthread.h>

#include "strata/comm/flight_recorder.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"

namespace strata::comm::detail {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce:
      return "all_reduce";
    case OpKind::ReduceScatter:
      return "reduce_scatter";
    case OpKind::AllGather:
      return "all_gather";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Send:
      return "send";
    case OpKind::Recv:
      return "recv";
    case OpKind::Barrier:
      return "barrier";
    case OpKind::AllToAll:
      return "all_to_all";
    case OpKind::AllToAllV:
      return "all_to_all_v";
    case OpKind::SendRecv:
      return "send_recv";
  }
  return "?";
}

CommStream::CommStream(const std::string& thread_name, Execute execute, Describe describe)
    : ring_(kRingSize),
      after_(kRingSize),
      execute_(std::move(execute)),
      describe_(std::move(describe)) {
  thread_ = std::thread([this, thread_name] { run(thread_name); });
}

CommStream::~CommStream() {
  if (abandoned_.load()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_or_abort(lock, [&] { return completed_.load() == issued_; });
    stop_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

void CommStream::abort_stuck(int64_t timeout_s) {
  // The oldest unfinished operation is the one blocked in MPI.
  const Op& stuck = ring_[completed_.load() % kRingSize];
  flight::mark_stuck(stuck.flight);
  abort_job(1, strata::detail::concat(describe_(stuck), " waited more than ", timeout_s,
                                      " s; a rank is stuck or dead"));
}

template <typename Pred>
void CommStream::wait_or_abort(std::unique_lock<std::mutex>& lock, Pred pred) {
  const int64_t t = timeout_s_.load();
  ++waiters_;
  if (t <= 0) {
    done_cv_.wait(lock, pred);
  } else {
    // Stuck means no operation finished for t seconds, however long the queue ahead is.
    for (uint64_t seen = completed_.load(); !done_cv_.wait_for(lock, std::chrono::seconds(t), pred);
         seen = completed_.load()) {
      if (completed_.load() == seen) abort_stuck(t);
    }
  }
  --waiters_;
}

uint64_t CommStream::submit(const Op& op, const ops::Event& after) {
  uint64_t seq;
  {
    std::unique_lock<std::mutex> lock(mu_);
    STRATA_CHECK(!stop_ && !abandoned_.load(), "operation submitted to a stopped stream");
    if (issued_ - completed_.load() >= kRingSize) {
      wait_or_abort(lock, [&] { return issued_ - completed_.load() < kRingSize; });
    }
    ring_[issued_ % kRingSize] = op;
    after_[issued_ % kRingSize] = after;
    seq = ++issued_;
  }
  work_cv_.notify_one();
  return seq;
}

void CommStream::wait(uint64_t seq) {
  if (!done(seq)) {
    std::unique_lock<std::mutex> lock(mu_);
    wait_or_abort(lock, [&] { return completed_.load() >= seq; });
  }
  if (!has_errors_.load(std::memory_order_acquire)) return;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < errors_.size(); ++i) {
      if (errors_[i].first != seq) continue;
      error = errors_[i].second;
      errors_.erase(errors_.begin() + std::ptrdiff_t(i));
      break;
    }
    has_errors_.store(!errors_.empty(), std::memory_order_release);
  }
  if (error) std::rethrow_exception(error);
}

void CommStream::run_blocking(const Op& op) {
  uint64_t seq;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (inline_active_ || issued_ != completed_.load()) {
      lock.unlock();
      wait(submit(op));
      return;
    }
    ring_[issued_ % kRingSize] = op;
    after_[issued_ % kRingSize] = {};
    seq = ++issued_;
    inline_active_ = true;
  }
  std::exception_ptr error;
  try {
    execute_(op);
  } catch (...) {
    error = std::current_exception();
  }
  bool queued_meanwhile, waited_on;  // by other threads
  {
    std::lock_guard<std::mutex> lock(mu_);
    inline_active_ = false;
    completed_.store(seq, std::memory_order_release);
    queued_meanwhile = issued_ > seq;
    waited_on = waiters_ > 0;
  }
  if (queued_meanwhile) work_cv_.notify_one();
  if (waited_on) done_cv_.notify_all();
  if (error) std::rethrow_exception(error);
}

void CommStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t last = issued_;
  wait_or_abort(lock, [&] { return completed_.load() >= last; });
}

size_t CommStream::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(issued_ - completed_.load());
}

void CommStream::set_timeout(std::chrono::seconds t) {
  timeout_s_.store(t.count());
  work_cv_.notify_one();  // an idle thread re-reads how often to look at an inline operation
}

void CommStream::abandon() {
  abandoned_.store(true);
  work_cv_.notify_one();
  thread_.detach();
}

void CommStream::run(std::string thread_name) {
  pthread_setname_np(pthread_self(), thread_name.substr(0, 15).c_str());
  // Format conversions on this thread stay on it instead of starting an OpenMP team that would
  // compete with the compute threads.
  omp_set_num_threads(1);
  uint64_t watched = 0;  // an operation seen running on the caller's thread, and since when
  std::chrono::steady_clock::time_point watched_since;
  for (;;) {
    Op op;
    ops::Event after;
    uint64_t seq;
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        if (abandoned_.load()) return;
        if (!inline_active_ && issued_ > completed_.load()) break;
        if (stop_ && issued_ == completed_.load()) return;
        // Idle: watch an operation running on the caller's thread, waking at least every second.
        const int64_t t = timeout_s_.load();
        if (t <= 0) {
          work_cv_.wait(lock);
          continue;
        }
        if (inline_active_) {
          const auto now = std::chrono::steady_clock::now();
          if (watched != completed_.load() + 1) {
            watched = completed_.load() + 1;
            watched_since = now;
          } else if (now - watched_since >= std::chrono::seconds(t)) {
            abort_stuck(t);
          }
        }
        work_cv_.wait_for(lock, std::chrono::seconds(std::min<int64_t>(t, 1)));
      }
      seq = completed_.load() + 1;
      op = ring_[(seq - 1) % kRingSize];
      after = after_[(seq - 1) % kRingSize];
    }
    try {
      after.wait();
      execute_(op);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      errors_.emplace_back(seq, std::current_exception());
      has_errors_.store(true, std::memory_order_release);
    }
    bool waited_on;
    {
      std::lock_guard<std::mutex> lock(mu_);
      completed_.store(seq, std::memory_order_release);
      waited_on = waiters_ > 0;
    }
    if (waited_on) done_cv_.notify_all();
  }
}

}  // namespace strata::comm::detail
