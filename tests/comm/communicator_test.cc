// Collectives on MPI_COMM_WORLD against exact references every rank computes for itself.
// Run under mpirun with 2 and 4 ranks (tests/CMakeLists.txt).
#include "strata/comm/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "tests/comm/comm_test_util.h"

namespace strata::comm {
namespace {

using testing::input;
using testing::same_on_all_ranks;
using testing::sum_tolerance;
using testing::TypedBuffer;

// One world communicator for the whole binary; a test that diverges aborts after 60 s instead
// of hanging.
class WorldEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    comm = std::make_unique<Communicator>(MPI_COMM_WORLD, "world");
    comm->set_timeout(std::chrono::seconds(60));
  }
  void TearDown() override { comm.reset(); }
  static inline std::unique_ptr<Communicator> comm;
};
::testing::Environment* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnv);

Communicator& world() {
  return *WorldEnv::comm;
}

struct Types {
  DType dtype, wire;
};
const Types kTypes[] = {{DType::F32, DType::F32},  {DType::F32, DType::BF16},
                        {DType::F32, DType::F16},  {DType::BF16, DType::BF16},
                        {DType::BF16, DType::F32}, {DType::F16, DType::F16},
                        {DType::F16, DType::F32}};
const size_t kSizes[] = {1, 1000, 1000003};

class Reduction : public ::testing::TestWithParam<std::tuple<Types, size_t>> {};

std::string name_of(const ::testing::TestParamInfo<Reduction::ParamType>& info) {
  const auto [t, n] = info.param;
  return std::string(dtype_name(t.dtype)) + "_wire_" + dtype_name(t.wire) + "_n" +
         std::to_string(n);
}

// Checks buf[i] == sum over ranks of input(r, offset + i) within the wire's rounding.
void expect_sums(const TypedBuffer& buf, size_t offset, DType wire, const char* what) {
  const int P = world().size();
  int bad = 0;
  for (size_t i = 0; i < buf.size() && bad < 5; ++i) {
    double exact = 0, abs_sum = 0;
    for (int r = 0; r < P; ++r) {
      const double v = input(r, offset + i, buf.t);
      exact += v;
      abs_sum += std::fabs(v);
    }
    const double tol = sum_tolerance(P, abs_sum, buf.t, wire);
    if (std::fabs(buf.get(i) - exact) > tol) {
      ++bad;
      ADD_FAILURE() << what << " element " << offset + i << ": got " << buf.get(i) << ", exact "
                    << exact << ", tolerance " << tol;
    }
  }
}

TEST_P(Reduction, AllReduceSumsWithinTheWireRounding) {
  const auto [t, n] = GetParam();
  TypedBuffer buf(t.dtype, n);
  for (size_t i = 0; i < n; ++i) buf.set(i, input(world().rank(), i, t.dtype));
  world().all_reduce(buf.data(), n, t.dtype, t.wire);
  expect_sums(buf, 0, t.wire, "all_reduce");
  EXPECT_TRUE(same_on_all_ranks(buf.data(), buf.bytes.size()));
}

TEST_P(Reduction, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const auto [t, n] = GetParam();
  const int P = world().size(), rank = world().rank();
  TypedBuffer in(t.dtype, n * size_t(P)), out(t.dtype, n);
  for (size_t i = 0; i < in.size(); ++i) in.set(i, input(rank, i, t.dtype));
  world().reduce_scatter(in.data(), out.data(), n, t.dtype, t.wire);
  expect_sums(out, size_t(rank) * n, t.wire, "reduce_scatter");
  // In place, Megatron/ZeRO style: the result lands on this rank's own block of the input.
  TypedBuffer again = in;
  void* own = again.bytes.data() + size_t(rank) * n * dtype_size(t.dtype);
  world().reduce_scatter(again.data(), own, n, t.dtype, t.wire);
  EXPECT_EQ(std::memcmp(own, out.data(), out.bytes.size()), 0);
}

TEST(Collectives, TheSumRoundsInTheWireDtype) {
  // 1 on rank 0 plus a small term from every other rank: each partial sum involving the 1 rounds
  // back to 1 in a half-precision wire (the small terms are below half its spacing at 1), while
  // an fp32 wire keeps them.
  const int P = world().size();
  for (DType wire : {DType::F32, DType::BF16, DType::F16}) {
    const float small = wire == DType::F16 ? 1.0f / 8192 : 1.0f / 1024;
    float v[3];
    for (float& x : v) x = world().rank() == 0 ? 1.0f : small;
    world().all_reduce(v, 3, DType::F32, wire);
    const float want = wire == DType::F32 ? 1.0f + float(P - 1) * small : 1.0f;
    for (float x : v) EXPECT_EQ(x, want) << dtype_name(wire);
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, Reduction,
                         ::testing::Combine(::testing::ValuesIn(kTypes),
                                            ::testing::ValuesIn(kSizes)),
                         name_of);

TEST(Collectives, AllGatherConcatenatesByRankExactly) {
  const int P = world().size(), rank = world().rank();
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (size_t n : kSizes) {
      TypedBuffer in(t, n), out(t, n * size_t(P));
      for (size_t i = 0; i < n; ++i) in.set(i, input(rank, i, t));
      world().all_gather(in.data(), out.data(), n, t);
      for (int r = 0; r < P; ++r) {
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(out.get(size_t(r) * n + i), input(r, i, t)) << dtype_name(t) << " " << r;
        }
      }
      // In place: this rank's block of out is the input.
      TypedBuffer inplace(t, n * size_t(P));
      char* own = inplace.bytes.data() + size_t(rank) * n * dtype_size(t);
      std::memcpy(own, in.data(), in.bytes.size());
      world().all_gather(own, inplace.data(), n, t);
      EXPECT_EQ(inplace.bytes, out.bytes) << dtype_name(t) << " n=" << n;
    }
  }
}

TEST(Collectives, BroadcastCopiesTheRootsBufferFromEveryRoot) {
  const int P = world().size(), rank = world().rank();
  for (int root = 0; root < P; ++root) {
    for (size_t n : kSizes) {
      TypedBuffer buf(DType::BF16, n);
      for (size_t i = 0; i < n; ++i) buf.set(i, input(rank, i, DType::BF16));
      world().broadcast(buf.data(), n, DType::BF16, root);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf.get(i), input(root, i, DType::BF16)) << i;
    }
  }
}

TEST(Collectives, SendRecvAroundARing) {
  const int P = world().size(), rank = world().rank();
  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  for (size_t n : kSizes) {
    std::vector<float> mine(n), got(n, -9.0f);
    for (size_t i = 0; i < n; ++i) mine[i] = input(rank, i, DType::F32);
    // Even ranks send first: a blocking send of a large message waits for its receive.
    if (rank % 2 == 0) {
      world().send(mine.data(), n, DType::F32, next, 11);
      world().recv(got.data(), n, DType::F32, prev, 11);
    } else {
      world().recv(got.data(), n, DType::F32, prev, 11);
      world().send(mine.data(), n, DType::F32, next, 11);
    }
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], input(prev, i, DType::F32)) << i;
  }
}

TEST(Async, SendRecvAndBarrierAroundARing) {
  const int P = world().size(), rank = world().rank();
  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  for (size_t n : kSizes) {
    std::vector<float> mine(n), got(n, -9.0f);
    for (size_t i = 0; i < n; ++i) mine[i] = input(rank, i, DType::F32);
    // Issued in the order the blocking ring pairs them; waited only at the end.
    Handle a, b;
    if (rank % 2 == 0) {
      a = world().send_async(mine.data(), n, DType::F32, next, 12);
      b = world().recv_async(got.data(), n, DType::F32, prev, 12);
    } else {
      a = world().recv_async(got.data(), n, DType::F32, prev, 12);
      b = world().send_async(mine.data(), n, DType::F32, next, 12);
    }
    Handle c = world().barrier_async();
    c.wait();  // waits for everything issued before it too
    EXPECT_TRUE(a.done());
    EXPECT_TRUE(b.done());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], input(prev, i, DType::F32)) << i;
  }
}

TEST(Collectives, BarrierAndEmptyBuffersAreFine) {
  world().barrier();
  world().all_reduce(nullptr, 0, DType::F32, DType::BF16);
  world().all_gather(nullptr, nullptr, 0, DType::F32);
}

TEST(Async, BackToBackOperationsWaitedInReverseOrder) {
  const int P = world().size(), rank = world().rank();
  const size_t n = 1000003;
  std::vector<float> a(n), rs_in(n * size_t(P)), rs_out(n), ag_out(n * size_t(P)), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = float(rank + 1);
  for (size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = float(i % 7);
  const float ag_in = float(rank * 10);
  std::vector<Handle> h;
  h.push_back(world().all_reduce_async(a.data(), n, DType::F32, DType::F32));
  h.push_back(
      world().reduce_scatter_async(rs_in.data(), rs_out.data(), n, DType::F32, DType::BF16));
  h.push_back(world().all_gather_async(&ag_in, ag_out.data(), 1, DType::F32));
  h.push_back(world().broadcast_async(b.data(), n, DType::F32, P - 1));
  for (size_t k = h.size(); k-- > 0;) {
    h[k].wait();
    EXPECT_TRUE(h[k].done());
  }
  const float tri = float(P * (P + 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], tri);
    ASSERT_EQ(rs_out[i], float(P * int((size_t(rank) * n + i) % 7)));
    ASSERT_EQ(b[i], float(P));
  }
  for (int r = 0; r < P; ++r) EXPECT_EQ(ag_out[size_t(r)], float(r * 10));
}

TEST(Async, ManyMoreOperationsInFlightThanRingSlots) {
  const int P = world().size(), rank = world().rank();
  const size_t count = 1000;  // the ring holds 256
  std::vector<float> x(count);
  for (size_t k = 0; k < count; ++k) x[k] = float(k + size_t(rank));
  std::vector<Handle> h;
  h.reserve(count);
  for (size_t k = 0; k < count; ++k) {
    h.push_back(world().all_reduce_async(&x[k], 1, DType::F32, DType::F32));
  }
  // A blocking call issued now runs after all of them.
  float total = 1.0f;
  world().all_reduce(&total, 1, DType::F32, DType::F32);
  EXPECT_EQ(total, float(P));
  for (size_t k = 0; k < count; ++k) EXPECT_TRUE(h[k].done()) << k;
  for (size_t k = 0; k < count; ++k) {
    h[k].wait();
    ASSERT_EQ(x[k], float(P * int(k) + P * (P - 1) / 2)) << k;
  }
}

TEST(Async, BlockingCallsWaitForTheOperationsIssuedBeforeThem) {
  const int P = world().size();
  std::vector<float> x(100000, 1.0f);
  Handle first = world().all_reduce_async(x.data(), x.size(), DType::F32, DType::F32);
  world().all_reduce(x.data(), x.size(), DType::F32, DType::F32);  // on the first's result
  first.wait();
  for (float v : x) ASSERT_EQ(v, float(P * P));
  world().synchronize();
}

TEST(Async, HandlesAreCheapAndMovable) {
  Handle empty;
  EXPECT_TRUE(empty.done());
  empty.wait();
  float v = 1.0f;
  Handle h = world().all_reduce_async(&v, 1, DType::F32, DType::F32);
  Handle moved = std::move(h);
  EXPECT_TRUE(h.done());  // NOLINT(bugprone-use-after-move): a moved-from handle is empty
  moved.wait();
  moved.wait();
  EXPECT_EQ(v, float(world().size()));
  std::vector<Handle> many(8);  // as a bucketed gradient sync keeps them
  for (Handle& x : many) x.wait();
}

// The last rank joins world's all-reduce a second late; the others issue a reduction on a second
// communicator `after` their world handle's event. Every rank has joined that one at once, yet it
// may not start before the world reduction completes.
TEST(Async, AnOperationWaitsForItsAfterEventFromAnotherCommunicator) {
  const int P = world().size(), last = P - 1;
  std::unique_ptr<Communicator> other = world().split(0, world().rank(), "other");
  EXPECT_TRUE(Handle().event().done());
  float a = 1.0f, b = 1.0f;
  Handle first, second;
  if (world().rank() == last) {
    second = other->all_reduce_async(&b, 1, DType::F32, DType::F32);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    first = world().all_reduce_async(&a, 1, DType::F32, DType::F32);
  } else {
    first = world().all_reduce_async(&a, 1, DType::F32, DType::F32);
    second = other->all_reduce_async(&b, 1, DType::F32, DType::F32, first.event());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(first.event().done());
    EXPECT_FALSE(second.event().done());
  }
  second.event().wait();
  EXPECT_TRUE(world().rank() == last || first.done());
  first.event().wait();
  EXPECT_TRUE(first.done());
  EXPECT_EQ(a, float(P));
  EXPECT_EQ(b, float(P));
}

TEST(Errors, AnMpiErrorThrowsNamingTheCallInlineOrFromTheCommThread) {
  // Ranks pair up; the receiver expects fewer elements than are sent: MPI_ERR_TRUNCATE.
  const int rank = world().rank();
  const int peer = rank ^ 1;
  if (peer >= world().size()) GTEST_SKIP() << "odd world";
  std::vector<float> buf(8, 1.0f);
  float one = 1.0f;
  for (bool queued : {false, true}) {
    // Queued behind an unfinished operation, the receive runs on the comm thread.
    Handle before;
    if (queued) before = world().all_reduce_async(&one, 1, DType::F32, DType::F32);
    if (rank % 2 == 0) {
      world().send(buf.data(), 8, DType::F32, peer, 5);
    } else {
      try {
        world().recv(buf.data(), 4, DType::F32, peer, 5);
        ADD_FAILURE() << "truncated receive did not throw";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("MPI_Recv"), std::string::npos) << e.what();
      }
    }
    before.wait();
  }
  // An asynchronous operation that fails on the comm thread (its wire scratch cannot be
  // allocated) throws from wait(), on every rank alike, and the stream goes on.
  float small = 1.0f;
  Handle bad = world().all_reduce_async(&small, size_t(1) << 61, DType::F32, DType::BF16);
  try {
    bad.wait();
    ADD_FAILURE() << "no exception from wait()";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm_buffers"), std::string::npos) << e.what();
  }
  float v = 1.0f;
  world().all_reduce(&v, 1, DType::F32, DType::F32);
  EXPECT_EQ(v, float(world().size()));
}

TEST(Errors, BadArgumentsThrowAtTheCall) {
  float v = 0;
  EXPECT_THROW(world().broadcast(&v, 1, DType::F32, world().size()), Error);
  EXPECT_THROW(world().send(&v, 1, DType::F32, -1, 0), Error);
  EXPECT_THROW(world().all_reduce(nullptr, 4, DType::F32, DType::F32), Error);
  std::vector<float> out(size_t(world().size()) * 4);
  try {
    world().all_gather(out.data() + 1, out.data(), 4, DType::F32);  // overlaps, not in place
    ADD_FAILURE() << "overlap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group world"), std::string::npos) << e.what();
  }
}

TEST(Memory, WireScratchIsCommBuffersAndReusedAfterWarmUp) {
  auto& tracker = MemoryTracker::instance();
  std::vector<float> x(200000, 1.0f);
  world().all_reduce(x.data(), x.size(), DType::F32, DType::BF16);  // warm-up: grows scratch
  const size_t after_warmup = tracker.current(MemCategory::CommBuffers);
  EXPECT_GE(after_warmup, x.size() * 2);
  for (int i = 0; i < 5; ++i) {
    world().all_reduce(x.data(), x.size(), DType::F32, DType::BF16);
    world().all_reduce_async(x.data(), x.size() / 2, DType::F32, DType::F16).wait();
  }
  EXPECT_EQ(tracker.current(MemCategory::CommBuffers), after_warmup);
}

TEST(Communicator, NameRankSizeAndTimeout) {
  EXPECT_EQ(world().name(), "world");
  EXPECT_EQ(world().rank(), world_rank());
  EXPECT_EQ(world().size(), world_size());
  Communicator c(MPI_COMM_WORLD, "other");
  EXPECT_EQ(c.timeout(), std::chrono::seconds(600));
  c.set_timeout(std::chrono::seconds(5));
  EXPECT_EQ(c.timeout(), std::chrono::seconds(5));
  int v = 0;
  c.all_reduce(&v, 0, DType::F32, DType::F32);
}

}  // namespace
}  // namespace strata::comm
