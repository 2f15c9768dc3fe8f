// The streams and events of the kernel interface (kernels/ops.h) on the CPU: the compute stream's
// events are complete at once, an event of a queue completes with its operation, and waiting on
// it, from either stream or the host, blocks until then and passes its error on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata::ops {
namespace {

constexpr Stream kCompute{Device::CPU, StreamKind::Compute};
constexpr Stream kComm{Device::CPU, StreamKind::Comm};

// A queue of one worker thread that completes operation 1 when opened, as a comm thread does.
class GatedQueue final : public Completion {
 public:
  bool done(uint64_t seq) const override { return completed_.load() >= seq; }
  void wait(uint64_t seq) override {
    while (!done(seq)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (fail_) throw std::runtime_error("the operation failed");
  }
  void complete(bool fail) {
    fail_ = fail;
    completed_.store(1);
  }

 private:
  std::atomic<uint64_t> completed_{0};
  bool fail_ = false;
};

TEST(Streams, AnEventRecordedOnTheComputeStreamIsCompleteAtOnce) {
  const Event e = record(kCompute);
  EXPECT_TRUE(e.done());
  wait(kCompute, e);
  wait(kComm, e);
  synchronize(e);
  EXPECT_TRUE(Event().done());
}

TEST(Streams, TheCommunicationStreamIsRecordedThroughItsOperationsOnly) {
  EXPECT_THROW(record(kComm), Error);
  EXPECT_THROW(record({Device::CUDA, StreamKind::Compute}), Error);
}

TEST(Streams, WaitingOnAQueuesEventBlocksUntilItsOperationCompletes) {
  for (const Stream s : {kCompute, kComm}) {
    GatedQueue q;
    const Event e(&q, 1);
    EXPECT_FALSE(e.done());
    std::atomic<bool> opened{false};
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      opened = true;
      q.complete(false);
    });
    wait(s, e);
    EXPECT_TRUE(opened.load());
    EXPECT_TRUE(e.done());
    opener.join();
  }
}

TEST(Streams, SynchronizeRethrowsTheOperationsError) {
  GatedQueue q;
  q.complete(true);
  EXPECT_THROW(synchronize(Event(&q, 1)), std::runtime_error);
}

}  // namespace
}  // namespace strata::ops
