// The tensor-parallel mappings (tensor_parallel/mappings.h) with MPI_COMM_WORLD as the group:
// each half against its definition (identity, sum, gather or scatter of rows), which every rank
// computes for itself; each forward/backward pair adjoint (⟨forward(x), y⟩ = ⟨x, backward(y)⟩);
// and what each half adds to the accounting (wire bytes, seconds). Run under mpirun with 2 and 4
// ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/tensor_parallel/mappings.h"
#include "tests/comm/comm_test_util.h"

namespace strata::tp {
namespace {

using comm::testing::same_on_all_ranks;
using comm::testing::TypedBuffer;

// One world communicator for the whole binary; a test that diverges aborts after 60 s instead
// of hanging.
class WorldEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    comm = std::make_unique<comm::Communicator>(MPI_COMM_WORLD, "world");
    comm->set_timeout(std::chrono::seconds(60));
  }
  void TearDown() override { comm.reset(); }
  static inline std::unique_ptr<comm::Communicator> comm;
};
::testing::Environment* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnv);

comm::Communicator& world() {
  return *WorldEnv::comm;
}

constexpr int64_t kShardRows = 3, kC = 5;  // a sequence-parallel shard (Ns, C); N = Ns · ranks

// Rank r's element i of the tensor `salt`: a small integer, so that sums over the ranks and
// inner products are exact in every dtype and each half must match its definition bit for bit.
float value(int r, int64_t i, uint64_t salt) {
  const uint64_t h = comm::testing::mix(uint64_t(i) * 1315423911ull + uint64_t(r) * 2654435761ull +
                                        salt * 97531ull);
  return float(int64_t(h % 17) - 8);
}

// (rows, C) of rank r's values of tensor `salt`, in dtype t.
struct Rows {
  TypedBuffer buf;
  int64_t rows;
  Rows(DType t, int64_t rows, int r, uint64_t salt) : buf(t, size_t(rows * kC)), rows(rows) {
    for (size_t i = 0; i < buf.size(); ++i) buf.set(i, value(r, int64_t(i), salt));
  }
  Tensor view() { return Tensor(buf.data(), buf.t, {rows, kC}); }
  float at(int64_t i) const { return buf.get(size_t(i)); }
  bool same_everywhere() const { return same_on_all_ranks(buf.bytes.data(), buf.bytes.size()); }
};

// Σ over the ranks of element i of their tensor `salt`.
float sum_over_ranks(int ranks, int64_t i, uint64_t salt) {
  float s = 0;
  for (int q = 0; q < ranks; ++q) s += value(q, i, salt);
  return s;
}

double dot(const Rows& a, const Rows& b) {
  double s = 0;
  for (size_t i = 0; i < a.buf.size(); ++i) s += double(a.buf.get(i)) * double(b.buf.get(i));
  return s;
}

// The inner product of a tensor-parallel or sequence-parallel pair: Σ over the ranks of theirs.
double dot_over_ranks(const Rows& a, const Rows& b) {
  double s = dot(a, b);
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

class Mappings : public ::testing::TestWithParam<DType> {
 protected:
  DType t = GetParam();
  int p = world().size(), r = world().rank();
  int64_t Ns = kShardRows, N = kShardRows * world().size();
  Group g{&world()};
};

TEST_P(Mappings, CopyToRegionIsIdentityForwardAndSumBackward) {
  Rows x(t, N, 0, 1);  // replicated: rank 0's values on every rank
  const Tensor y = copy_to_region::forward(g, x.view());
  EXPECT_EQ(y.data, x.buf.data());
  for (int64_t i = 0; i < N * kC; ++i) ASSERT_EQ(x.at(i), value(0, i, 1)) << i;

  Rows dx(t, N, r, 2);  // each rank's partial input gradient
  EXPECT_EQ(copy_to_region::backward(g, dx.view()).data, dx.buf.data());
  for (int64_t i = 0; i < N * kC; ++i) ASSERT_EQ(dx.at(i), sum_over_ranks(p, i, 2)) << i;
  EXPECT_TRUE(dx.same_everywhere());
}

TEST_P(Mappings, ReduceFromRegionIsSumForwardAndIdentityBackward) {
  Rows out(t, N, r, 3);  // each rank's partial output
  EXPECT_EQ(reduce_from_region::forward(g, out.view()).data, out.buf.data());
  for (int64_t i = 0; i < N * kC; ++i) ASSERT_EQ(out.at(i), sum_over_ranks(p, i, 3)) << i;
  EXPECT_TRUE(out.same_everywhere());

  Rows dy(t, N, 0, 4);  // replicated output gradient
  EXPECT_EQ(reduce_from_region::backward(g, dy.view()).data, dy.buf.data());
  for (int64_t i = 0; i < N * kC; ++i) ASSERT_EQ(dy.at(i), value(0, i, 4)) << i;
}

TEST_P(Mappings, GatherFromSpRegionIsGatherForwardAndReduceScatterBackward) {
  Rows shard(t, Ns, r, 5), full(t, N, r, 0);
  EXPECT_EQ(gather_from_sp_region::forward(g, full.view(), shard.view()).data, full.buf.data());
  // Row block q of full is rank q's shard.
  for (int64_t i = 0; i < N * kC; ++i) {
    ASSERT_EQ(full.at(i), value(int(i / (Ns * kC)), i % (Ns * kC), 5)) << i;
  }

  Rows dfull(t, N, r, 6), dshard(t, Ns, r, 0);
  EXPECT_EQ(gather_from_sp_region::backward(g, dshard.view(), dfull.view()).data,
            dshard.buf.data());
  // This rank's row block of the ranks' summed dfull.
  for (int64_t i = 0; i < Ns * kC; ++i) {
    ASSERT_EQ(dshard.at(i), sum_over_ranks(p, r * Ns * kC + i, 6)) << i;
  }
}

TEST_P(Mappings, ReduceScatterToSpRegionIsReduceScatterForwardAndGatherBackward) {
  Rows full(t, N, r, 7), shard(t, Ns, r, 0);
  EXPECT_EQ(reduce_scatter_to_sp_region::forward(g, shard.view(), full.view()).data,
            shard.buf.data());
  for (int64_t i = 0; i < Ns * kC; ++i) {
    ASSERT_EQ(shard.at(i), sum_over_ranks(p, r * Ns * kC + i, 7)) << i;
  }

  Rows dshard(t, Ns, r, 8), dfull(t, N, r, 0);
  EXPECT_EQ(reduce_scatter_to_sp_region::backward(g, dfull.view(), dshard.view()).data,
            dfull.buf.data());
  for (int64_t i = 0; i < N * kC; ++i) {
    ASSERT_EQ(dfull.at(i), value(int(i / (Ns * kC)), i % (Ns * kC), 8)) << i;
  }
}

// ⟨forward(x), y⟩ = ⟨x, backward(y)⟩: the backward half is the forward's transpose, which is
// what makes it the right gradient. Replicated tensors (the same on every rank) count once;
// tensor-parallel and sequence-parallel ones sum over the ranks.
TEST_P(Mappings, ForwardAndBackwardAreAdjoint) {
  {
    Rows x(t, N, 0, 11), y(t, N, r, 12);  // x replicated, y tensor-parallel
    Rows fx = x, by = y;
    copy_to_region::forward(g, fx.view());
    copy_to_region::backward(g, by.view());
    EXPECT_EQ(dot_over_ranks(fx, y), dot(x, by)) << "copy_to_region";
  }
  {
    Rows x(t, N, r, 13), y(t, N, 0, 14);  // x tensor-parallel, y replicated
    Rows fx = x, by = y;
    reduce_from_region::forward(g, fx.view());
    reduce_from_region::backward(g, by.view());
    EXPECT_EQ(dot(fx, y), dot_over_ranks(x, by)) << "reduce_from_region";
  }
  {
    Rows x(t, Ns, r, 15), y(t, N, r, 16);  // x sequence-parallel, y tensor-parallel
    Rows fx(t, N, r, 0), by(t, Ns, r, 0);
    gather_from_sp_region::forward(g, fx.view(), x.view());
    gather_from_sp_region::backward(g, by.view(), y.view());
    EXPECT_EQ(dot_over_ranks(fx, y), dot_over_ranks(x, by)) << "gather_from_sp_region";
  }
  {
    Rows x(t, N, r, 17), y(t, Ns, r, 18);  // x tensor-parallel, y sequence-parallel
    Rows fx(t, Ns, r, 0), by(t, N, r, 0);
    reduce_scatter_to_sp_region::forward(g, fx.view(), x.view());
    reduce_scatter_to_sp_region::backward(g, by.view(), y.view());
    EXPECT_EQ(dot_over_ranks(fx, y), dot_over_ranks(x, by)) << "reduce_scatter_to_sp_region";
  }
}

// The identity halves issue nothing; every other half is one collective whose bytes and seconds
// the step's tp figures count. Sequence parallelism moves the same bytes: an all-reduce is a
// reduce-scatter plus an all-gather.
TEST_P(Mappings, EachHalfAccountsItsCollective) {
  Rows full(t, N, r, 21), shard(t, Ns, r, 22);
  auto bytes_of = [&](auto&& half) {
    const uint64_t b0 = world().wire_bytes();
    const double s0 = g.seconds();
    half();
    const uint64_t b = world().wire_bytes() - b0;
    if (b == 0) {
      EXPECT_EQ(g.seconds(), s0);
    } else {
      EXPECT_GT(g.seconds(), s0);
    }
    return b;
  };
  EXPECT_EQ(bytes_of([&] { copy_to_region::forward(g, full.view()); }), 0u);
  EXPECT_EQ(bytes_of([&] { reduce_from_region::backward(g, full.view()); }), 0u);
  const uint64_t sum = bytes_of([&] { copy_to_region::backward(g, full.view()); });
  EXPECT_EQ(bytes_of([&] { reduce_from_region::forward(g, full.view()); }), sum);
  const uint64_t block = uint64_t(p - 1) * uint64_t(Ns * kC) * dtype_size(t);
  EXPECT_EQ(bytes_of([&] { gather_from_sp_region::forward(g, full.view(), shard.view()); }), block);
  EXPECT_EQ(bytes_of([&] { gather_from_sp_region::backward(g, shard.view(), full.view()); }),
            block);
  EXPECT_EQ(bytes_of([&] { reduce_scatter_to_sp_region::forward(g, shard.view(), full.view()); }),
            block);
  EXPECT_EQ(bytes_of([&] { reduce_scatter_to_sp_region::backward(g, full.view(), shard.view()); }),
            block);
  EXPECT_EQ(sum, 2 * block);
  g.reset_seconds();
  EXPECT_EQ(g.seconds(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Mappings, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// One rank (no communicator): the summing halves are no-ops, which the model relies on to call
// them at tensor-parallel size 1.
TEST(MappingsOneRank, SumsAreNoOps) {
  Group g;
  Rows x(DType::F32, 4, 0, 31);
  copy_to_region::backward(g, x.view());
  reduce_from_region::forward(g, x.view());
  for (int64_t i = 0; i < 4 * kC; ++i) ASSERT_EQ(x.at(i), value(0, i, 31)) << i;
  EXPECT_EQ(g.seconds(), 0.0);
}

}  // namespace
}  // namespace strata::tp
