// Data order is a pure function of (seed, global sample index): DESIGN.md §1.
#include "strata/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data_test_util.h"
#include "strata/data/llmc_shard.h"

namespace strata::data {
namespace {

using test_util::VectorDataset;

// Token i of the dataset is i, so a window's first input names its position.
VectorDataset positions(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return VectorDataset(std::move(t));
}

std::vector<int64_t> windows(const Sampler& s, int64_t first, int64_t count) {
  std::vector<int64_t> w;
  for (int64_t i = first; i < first + count; ++i) w.push_back(s.window_of(i));
  return w;
}

TEST(SamplerTest, EveryWindowOncePerEpoch) {
  for (int64_t n_windows : {1, 2, 3, 5, 16, 17, 1000, 4097}) {
    const int T = 4;
    VectorDataset ds = positions(n_windows * T + 1 + (n_windows % 3));  // leftover tokens unused
    Sampler s(ds, T, 42);
    ASSERT_EQ(s.num_windows(), n_windows);
    for (int64_t e = 0; e < 3; ++e) {
      std::vector<int64_t> w = windows(s, e * n_windows, n_windows);
      std::sort(w.begin(), w.end());
      std::vector<int64_t> all(static_cast<size_t>(n_windows));
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(w, all) << "N=" << n_windows << " epoch " << e;
    }
  }
}

TEST(SamplerTest, DeterministicAndSeedAndEpochDependent) {
  VectorDataset ds = positions(8 * 1000 + 1);
  Sampler a(ds, 8, 1234), b(ds, 8, 1234), c(ds, 8, 1235);
  const std::vector<int64_t> e0 = windows(a, 0, 1000);
  EXPECT_EQ(e0, windows(b, 0, 1000));
  EXPECT_NE(e0, windows(c, 0, 1000));
  EXPECT_NE(e0, windows(a, 1000, 1000));  // each epoch has its own order
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(e0, identity);
  // Any sample can be asked for in any order: no hidden state.
  for (int64_t i : {999, 5, 3000, 0, 1001}) EXPECT_EQ(a.window_of(i), b.window_of(i));
}

// Pinned so a change to the permutation, which would silently change the data order of
// every resumed run, fails here first.
TEST(SamplerTest, PinnedOrder) {
  VectorDataset ds = positions(8 * 1000 + 1);
  Sampler s(ds, 8, 1234);
  EXPECT_EQ(windows(s, 0, 8), (std::vector<int64_t>{818, 96, 343, 507, 789, 466, 535, 794}));
}

TEST(SamplerTest, TargetsAreInputsShiftedByOne) {
  std::vector<int32_t> tokens(257);
  uint32_t x = 7;
  for (auto& t : tokens) t = int32_t((x = x * 1103515245u + 12345u) >> 20);
  VectorDataset ds(tokens);
  const int T = 16;
  Sampler s(ds, T, 9);
  std::vector<int32_t> in(T), tgt(T);
  for (int64_t i = 0; i < 2 * s.num_windows(); ++i) {
    s.get(i, in.data(), tgt.data());
    const int64_t start = s.window_of(i) * T;
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[size_t(t)], tokens[size_t(start + t)]);
      EXPECT_EQ(tgt[size_t(t)], tokens[size_t(start + t + 1)]);
    }
  }
}

TEST(SamplerTest, SeqLenOne) {
  VectorDataset ds = positions(6);
  Sampler s(ds, 1, 3);
  EXPECT_EQ(s.num_windows(), 5);
  int32_t in, tgt;
  for (int64_t i = 0; i < 5; ++i) {
    s.get(i, &in, &tgt);
    EXPECT_EQ(tgt, in + 1);
  }
}

TEST(SamplerTest, BatchIsConsecutiveSamples) {
  VectorDataset ds = positions(32 * 50 + 1);
  const int T = 32;
  Sampler s(ds, T, 5);
  const int64_t B = 6, first = 47;  // crosses from epoch 0 into epoch 1
  std::vector<int32_t> in(size_t(B * T)), tgt(size_t(B * T)), one_in(T), one_tgt(T);
  s.get_batch(first, B, in.data(), tgt.data());
  for (int64_t b = 0; b < B; ++b) {
    s.get(first + b, one_in.data(), one_tgt.data());
    EXPECT_TRUE(std::equal(one_in.begin(), one_in.end(), in.begin() + b * T));
    EXPECT_TRUE(std::equal(one_tgt.begin(), one_tgt.end(), tgt.begin() + b * T));
    EXPECT_EQ(in[size_t(b * T)], s.window_of(first + b) * T);
  }
}

TEST(SamplerTest, DataParallelRanksPartitionEachGlobalBatch) {
  const int64_t GBS = 8;
  for (int D : {1, 2, 4}) {
    for (int64_t k : {0, 1, 7}) {
      std::vector<int64_t> covered;
      for (int r = 0; r < D; ++r) {
        const int64_t first = Sampler::first_sample_of(k * GBS, r, D, GBS);
        for (int64_t i = 0; i < GBS / D; ++i) covered.push_back(first + i);
      }
      std::vector<int64_t> want(GBS);
      std::iota(want.begin(), want.end(), k * GBS);
      EXPECT_EQ(covered, want) << "dp=" << D << " batch " << k;  // in order, no gaps, no overlap
    }
  }
  test_util::expect_input_error([] { Sampler::first_sample_of(0, 0, 3, 8); },
                                {"global batch size 8", "data-parallel size 3"});
}

// The tokens of a global batch do not depend on how many ranks read it.
TEST(SamplerTest, GlobalBatchTokensIndependentOfDpSize) {
  VectorDataset ds = positions(16 * 64 + 1);
  const int T = 16;
  const int64_t GBS = 8, consumed = 3 * GBS;
  Sampler s(ds, T, 77);
  std::vector<int32_t> serial(size_t(GBS * T)), tgt(size_t(GBS * T));
  s.get_batch(consumed, GBS, serial.data(), tgt.data());
  for (int D : {2, 4}) {
    std::vector<int32_t> gathered;
    for (int r = 0; r < D; ++r) {
      Sampler rank_sampler(ds, T, 77);  // each rank builds its own
      std::vector<int32_t> in(size_t(GBS / D * T)), t(size_t(GBS / D * T));
      rank_sampler.get_batch(Sampler::first_sample_of(consumed, r, D, GBS), GBS / D, in.data(),
                             t.data());
      gathered.insert(gathered.end(), in.begin(), in.end());
    }
    EXPECT_EQ(gathered, serial) << "dp=" << D;
  }
}

class SamplerFileTest : public test_util::TempDirTest {};

TEST_F(SamplerFileTest, WindowsSpanShardBoundaries) {
  std::vector<int32_t> all(301);
  std::iota(all.begin(), all.end(), 0);
  write_llmc_shard(path("s0.bin"), std::vector<int32_t>(all.begin(), all.begin() + 100), false);
  write_llmc_shard(path("s1.bin"), std::vector<int32_t>(all.begin() + 100, all.begin() + 101),
                   true);
  write_llmc_shard(path("s2.bin"), std::vector<int32_t>(all.begin() + 101, all.end()), false);
  auto ds = open_dataset(path("s*.bin"));
  Sampler s(*ds, 30, 1);
  ASSERT_EQ(s.num_windows(), 10);
  std::vector<int32_t> in(30), tgt(30);
  std::set<int32_t> starts;
  for (int64_t i = 0; i < 10; ++i) {
    s.get(i, in.data(), tgt.data());
    for (int t = 0; t < 30; ++t) {
      EXPECT_EQ(in[size_t(t)], in[0] + t);
      EXPECT_EQ(tgt[size_t(t)], in[0] + t + 1);
    }
    starts.insert(in[0]);
  }
  EXPECT_EQ(starts.size(), 10u);
  s.check_vocab(301);
}

}  // namespace
}  // namespace strata::data
