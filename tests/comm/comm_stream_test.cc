// The communication thread's queue, with a fake executor in place of MPI.
#include "strata/comm/comm_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace strata::comm::detail {
namespace {

// Records the tags of the operations it runs, and the thread each ran on.
struct Recorder {
  std::mutex mu;
  std::vector<int> tags;
  std::vector<std::thread::id> threads;
  std::atomic<bool> gate{true};  // executor blocks while false
  CommStream::Execute execute() {
    return [this](const Op& op) {
      while (!gate.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (op.tag < 0) throw std::runtime_error("op " + std::to_string(-op.tag) + " failed");
      std::lock_guard<std::mutex> lock(mu);
      tags.push_back(op.tag);
      threads.push_back(std::this_thread::get_id());
    };
  }
};

std::string describe(const Op& op) {
  return "op " + std::to_string(op.tag);
}

Op tagged(int tag) {
  return {.kind = OpKind::AllReduce, .tag = tag};
}

TEST(CommStream, RunsOperationsInIssueOrderOnItsThread) {
  Recorder rec;
  CommStream s("test", rec.execute(), describe);
  rec.gate = false;
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 5; ++i) seqs.push_back(s.submit(tagged(i)));
  EXPECT_FALSE(s.done(seqs.back()));
  rec.gate = true;
  for (size_t i = seqs.size(); i-- > 0;) s.wait(seqs[i]);  // reverse order
  for (uint64_t q : seqs) EXPECT_TRUE(s.done(q));
  EXPECT_EQ(rec.tags, (std::vector<int>{0, 1, 2, 3, 4}));
  for (auto id : rec.threads) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(CommStream, MoreOperationsThanRingSlotsBlockTheIssuerUntilSlotsFree) {
  Recorder rec;
  CommStream s("test", rec.execute(), describe);
  rec.gate = false;
  const int total = int(CommStream::kRingSize) * 4 + 3;
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(s.in_flight(), CommStream::kRingSize);  // the issuer is blocked on a full ring
    rec.gate = true;
  });
  std::vector<uint64_t> seqs;
  for (int i = 0; i < total; ++i) {
    seqs.push_back(s.submit(tagged(i)));
    EXPECT_LE(s.in_flight(), CommStream::kRingSize);
  }
  opener.join();
  s.synchronize();
  ASSERT_EQ(rec.tags.size(), size_t(total));
  for (int i = 0; i < total; ++i) EXPECT_EQ(rec.tags[size_t(i)], i);
}

TEST(CommStream, AnExceptionIsRethrownOnceFromItsOwnWait) {
  Recorder rec;
  CommStream s("test", rec.execute(), describe);
  const uint64_t a = s.submit(tagged(1));
  const uint64_t bad = s.submit(tagged(-7));
  const uint64_t c = s.submit(tagged(3));
  s.wait(c);  // later operations still run
  s.wait(a);
  try {
    s.wait(bad);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "op 7 failed");
  }
  EXPECT_NO_THROW(s.wait(bad));
  EXPECT_EQ(rec.tags, (std::vector<int>{1, 3}));
  EXPECT_THROW(s.run_blocking(tagged(-8)), std::runtime_error);
}

TEST(CommStream, BlockingRunsInlineWhenIdleAndAfterTheQueueOtherwise) {
  Recorder rec;
  CommStream s("test", rec.execute(), describe);
  s.run_blocking(tagged(0));
  EXPECT_EQ(rec.threads.back(), std::this_thread::get_id());  // idle: ran here
  rec.gate = false;
  s.submit(tagged(1));
  s.submit(tagged(2));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rec.gate = true;
  });
  s.run_blocking(tagged(3));  // queued behind 1 and 2
  opener.join();
  EXPECT_EQ(rec.tags, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(rec.threads.back(), std::this_thread::get_id());
  EXPECT_EQ(s.in_flight(), 0u);
}

TEST(CommStream, DestructionRunsWhatIsQueued) {
  Recorder rec;
  {
    CommStream s("test", rec.execute(), describe);
    rec.gate = false;
    for (int i = 0; i < 20; ++i) s.submit(tagged(i));
    rec.gate = true;
  }
  EXPECT_EQ(rec.tags.size(), 20u);
}

TEST(CommStream, TheWatchdogAllowsALongQueueThatKeepsMoving) {
  // 25 operations of 100 ms behind each other: 2.5 s of waiting, but never 1 s without one
  // finishing. The watchdog would abort this process.
  CommStream s(
      "test", [](const Op&) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); },
      describe);
  s.set_timeout(std::chrono::seconds(1));
  uint64_t last = 0;
  for (int i = 0; i < 25; ++i) last = s.submit(tagged(i));
  s.wait(last);
  EXPECT_TRUE(s.done(last));
}

TEST(CommStream, TimeoutIsConfigurable) {
  Recorder rec;
  CommStream s("test", rec.execute(), describe);
  EXPECT_EQ(s.timeout(), std::chrono::seconds(600));
  s.set_timeout(std::chrono::seconds(0));
  EXPECT_EQ(s.timeout(), std::chrono::seconds(0));
  s.run_blocking(tagged(1));  // no watchdog: still runs
  EXPECT_EQ(rec.tags.size(), 1u);
}

TEST(CommStream, AnOperationDoesNotStartBeforeItsAfterEvent) {
  Recorder first, second;
  CommStream a("test-a", first.execute(), describe);
  CommStream b("test-b", second.execute(), describe);
  first.gate = false;
  const uint64_t in_a = a.submit(tagged(1));
  const ops::Event a_done(&a, in_a);
  EXPECT_FALSE(a_done.done());
  const uint64_t in_b = b.submit(tagged(2), a_done);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(b.done(in_b));  // b's thread is idle but waits for a's operation
  {
    std::lock_guard<std::mutex> lock(second.mu);
    EXPECT_TRUE(second.tags.empty());
  }
  first.gate = true;
  b.wait(in_b);
  EXPECT_TRUE(a_done.done());
  EXPECT_EQ(first.tags, std::vector<int>{1});
  EXPECT_EQ(second.tags, std::vector<int>{2});
  const uint64_t free_to_go = b.submit(tagged(3), a_done);  // complete: runs at once
  b.wait(free_to_go);
  EXPECT_EQ(second.tags, (std::vector<int>{2, 3}));
}

TEST(CommStream, AFailedAfterEventFailsTheOperationWaitingForIt) {
  Recorder first, second;
  CommStream a("test-a", first.execute(), describe);
  CommStream b("test-b", second.execute(), describe);
  const uint64_t bad = a.submit(tagged(-3));
  const uint64_t in_b = b.submit(tagged(4), ops::Event(&a, bad));
  EXPECT_THROW(b.wait(in_b), std::runtime_error);
  EXPECT_TRUE(second.tags.empty());  // it never ran on data the failed operation left
}

}  // namespace
}  // namespace strata::comm::detail
