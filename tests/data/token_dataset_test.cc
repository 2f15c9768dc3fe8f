// Round trips of both formats, and the ways open_dataset finds files (glob, directory, prefix).
#include "strata/data/token_dataset.h"

#include <gtest/gtest.h>

#include <numeric>

#include "data_test_util.h"
#include "strata/data/file_io.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/megatron_dataset.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;

using test_util::read_all;
using test_util::read_bytes;

class TokenDatasetTest : public test_util::TempDirTest {};

std::vector<int32_t> iota_tokens(int n, int start, int modulus) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (start + i) % modulus;
  return t;
}

TEST_F(TokenDatasetTest, LlmcUint16RoundTrip) {
  const std::vector<int32_t> tokens = {50256, 0, 1, 65535, 12, 7};
  write_llmc_shard(path("a.bin"), tokens, false);
  const std::vector<uint8_t> bytes = read_bytes(path("a.bin"));
  ASSERT_EQ(bytes.size(), 1024 + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], int32_t(tokens.size()));

  auto ds = open_dataset(path("a.bin"));
  EXPECT_EQ(ds->num_tokens(), int64_t(tokens.size()));
  EXPECT_EQ(read_all(*ds), tokens);
  EXPECT_EQ(ds->vocab_bound(), 65536);
  EXPECT_EQ(ds->source(), path("a.bin"));
  EXPECT_EQ(read_all(*open_dataset(path("a.bin"), "llmc")), tokens);
}

TEST_F(TokenDatasetTest, LlmcUint32RoundTrip) {
  const std::vector<int32_t> tokens = {128000, 5, 128255, 70000, 0};
  write_llmc_shard(path("b.bin"), tokens, true);
  const std::vector<uint8_t> bytes = read_bytes(path("b.bin"));
  ASSERT_EQ(bytes.size(), 1024 + 4 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  auto ds = open_dataset(path("b.bin"));
  EXPECT_EQ(read_all(*ds), tokens);
  EXPECT_EQ(ds->vocab_bound(), 128256);
}

TEST_F(TokenDatasetTest, LlmcWriterRejectsIdsThatDoNotFit) {
  test_util::expect_input_error([&] { write_llmc_shard(path("c.bin"), {70000}, false); },
                                {"70000", "uint16"});
  test_util::expect_input_error([&] { write_llmc_shard(path("c.bin"), {-1}, true); }, {"-1"});
  EXPECT_FALSE(fs::exists(path("c.bin")));
}

TEST_F(TokenDatasetTest, MegatronUint16RoundTrip) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {}, {40000}, {7, 8}};
  write_megatron_dataset(path("m"), docs);
  const std::vector<uint8_t> idx = read_bytes(path("m.idx"));
  ASSERT_EQ(idx.size(), 34 + 4 * 12 + 5 * 8);
  EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
  EXPECT_EQ(idx[9], 1);   // version
  EXPECT_EQ(idx[17], 8);  // uint16
  EXPECT_EQ(idx[18], 4);  // sequences
  EXPECT_EQ(idx[26], 5);  // doc_idx entries: documents + 1
  EXPECT_EQ(read_bytes(path("m.bin")).size(), 2u * 6);

  const std::vector<int32_t> all = {1, 2, 3, 40000, 7, 8};
  for (const char* p : {"m", "m.bin", "m.idx"}) {
    auto ds = open_dataset(path(p));
    EXPECT_EQ(read_all(*ds), all) << p;
    EXPECT_EQ(ds->vocab_bound(), 40001);
    EXPECT_EQ(read_all(*open_dataset(path(p), "megatron")), all) << p;
  }
}

TEST_F(TokenDatasetTest, MegatronInt32ForLargeVocab) {
  const std::vector<std::vector<int32_t>> docs = {{100000, 1}, {65499}};
  write_megatron_dataset(path("m"), docs);
  EXPECT_EQ(read_bytes(path("m.idx"))[17], 4);  // int32
  EXPECT_EQ(read_all(*open_dataset(path("m"))), (std::vector<int32_t>{100000, 1, 65499}));
  // A declared vocab of 65,500 or more picks int32 even when the ids are small.
  write_megatron_dataset(path("v"), {{1, 2}}, 65500);
  EXPECT_EQ(read_bytes(path("v.idx"))[17], 4);
  write_megatron_dataset(path("w"), {{1, 2}}, 65499);
  EXPECT_EQ(read_bytes(path("w.idx"))[17], 8);
}

// An index written by hand, in any dtype, with sequences pointing anywhere in the .bin.
void write_raw_megatron(const std::string& prefix, uint8_t code, int width,
                        const std::vector<int64_t>& bin_tokens,
                        const std::vector<std::pair<int32_t, int64_t>>& seqs /*size, ptr*/) {
  std::vector<uint8_t> bin;
  for (int64_t t : bin_tokens) {
    uint8_t b[8];
    std::memcpy(b, &t, 8);  // little-endian: the low `width` bytes are the value
    bin.insert(bin.end(), b, b + width);
  }
  test_util::write_bytes(prefix + ".bin", bin);
  std::vector<uint8_t> idx(std::begin(kMegatronMagic), std::end(kMegatronMagic));
  test_util::append_le<uint64_t>(idx, 1);
  idx.push_back(code);
  test_util::append_le<uint64_t>(idx, seqs.size());
  test_util::append_le<uint64_t>(idx, seqs.size() + 1);
  for (auto [n, p] : seqs) test_util::append_le<int32_t>(idx, n);
  for (auto [n, p] : seqs) test_util::append_le<int64_t>(idx, p);
  for (size_t d = 0; d <= seqs.size(); ++d) test_util::append_le<int64_t>(idx, int64_t(d));
  test_util::write_bytes(prefix + ".idx", idx);
}

TEST_F(TokenDatasetTest, MegatronEveryIntegerDtype) {
  struct Case {
    uint8_t code;
    int width;
  };
  for (Case c : {Case{1, 1}, Case{2, 1}, Case{3, 2}, Case{4, 4}, Case{5, 8}, Case{8, 2}}) {
    const std::string prefix = path("d") + std::to_string(c.code);
    write_raw_megatron(prefix, c.code, c.width, {3, 1, 4, 1, 5, 9, 2, 6},
                       {{3, 0}, {5, 3 * c.width}});
    auto ds = open_dataset(prefix);
    EXPECT_EQ(read_all(*ds), (std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6})) << int(c.code);
    EXPECT_EQ(ds->vocab_bound(), 10);
  }
}

TEST_F(TokenDatasetTest, MegatronSequencesInIndexOrderNotFileOrder) {
  // .bin holds A=[10,11] B=[20,21,22] C=[30]; the index lists C, A, B, then A again.
  write_raw_megatron(path("m"), 8, 2, {10, 11, 20, 21, 22, 30}, {{1, 10}, {2, 0}, {3, 4}, {2, 0}});
  auto ds = open_dataset(path("m"));
  const std::vector<int32_t> want = {30, 10, 11, 20, 21, 22, 10, 11};
  EXPECT_EQ(read_all(*ds), want);
  for (int64_t b = 0; b < ds->num_tokens(); ++b) {
    for (int64_t n = 0; b + n <= ds->num_tokens(); ++n) {
      std::vector<int32_t> got(static_cast<size_t>(n));
      ds->read(b, n, got.data());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + b)) << b << "+" << n;
    }
  }
}

TEST_F(TokenDatasetTest, GlobConcatenatesSortedShardsAcrossBoundaries) {
  // Written out of order, with a uint32 shard between uint16 ones and an empty shard.
  const auto s0 = iota_tokens(5, 0, 1000), s1 = iota_tokens(3, 100, 1000),
             s3 = iota_tokens(7, 200, 1000);
  write_llmc_shard(path("train_003.bin"), s3, false);
  write_llmc_shard(path("train_001.bin"), s1, true);
  write_llmc_shard(path("train_000.bin"), s0, false);
  write_llmc_shard(path("train_002.bin"), {}, false);
  write_llmc_shard(path("val_000.bin"), {999}, false);
  std::vector<int32_t> want = s0;
  want.insert(want.end(), s1.begin(), s1.end());
  want.insert(want.end(), s3.begin(), s3.end());

  auto ds = open_dataset(path("train_*.bin"));
  ASSERT_EQ(ds->num_tokens(), 15);
  EXPECT_EQ(read_all(*ds), want);
  for (int64_t b = 0; b <= 15; ++b) {
    for (int64_t n = 0; b + n <= 15; ++n) {
      std::vector<int32_t> got(size_t(n), -1);
      ds->read(b, n, got.data());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + b)) << b << "+" << n;
    }
  }
}

TEST_F(TokenDatasetTest, DirectoryReadsItsBinFilesSorted) {
  fs::create_directory(path("shards"));
  write_llmc_shard(path("shards/b.bin"), {4, 5}, false);
  write_llmc_shard(path("shards/a.bin"), {1, 2, 3}, false);
  test_util::write_text(path("shards/README.txt"), "not a shard");
  fs::create_directory(path("shards/nested.bin"));  // a directory is not a shard
  EXPECT_EQ(read_all(*open_dataset(path("shards"))), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(read_all(*open_dataset(path("shards") + "/")), (std::vector<int32_t>{1, 2, 3, 4, 5}));
}

TEST_F(TokenDatasetTest, DirectoryMixesMegatronPairsAndShards) {
  fs::create_directory(path("mix"));
  write_megatron_dataset(path("mix/a"), {{1, 2}, {3}});
  write_llmc_shard(path("mix/b.bin"), {4, 5}, false);
  EXPECT_EQ(read_all(*open_dataset(path("mix"))), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  // A glob that matches both files of a pair reads the pair once.
  EXPECT_EQ(read_all(*open_dataset(path("mix/a.*"))), (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(TokenDatasetTest, PrefixOfAnLlmcShard) {
  write_llmc_shard(path("tiny.bin"), {9, 8, 7}, false);
  EXPECT_EQ(read_all(*open_dataset(path("tiny"))), (std::vector<int32_t>{9, 8, 7}));
}

TEST_F(TokenDatasetTest, LargeRandomShardReadsMatch) {
  std::vector<int32_t> tokens(100003);
  uint32_t x = 12345;
  for (auto& t : tokens) t = int32_t((x = x * 1664525u + 1013904223u) >> 17);
  write_llmc_shard(path("big.bin"), tokens, false);
  auto ds = open_dataset(path("big.bin"));
  EXPECT_EQ(read_all(*ds), tokens);
  EXPECT_EQ(ds->vocab_bound(), *std::max_element(tokens.begin(), tokens.end()) + 1);
}

TEST_F(TokenDatasetTest, AtomicWriterLeavesNoFileWithoutCommit) {
  {
    AtomicFileWriter w(path("out.bin"));
    w.write("abc", 3);
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_FALSE(fs::exists(path("out.bin")));
  }
  EXPECT_TRUE(fs::is_empty(dir_));

  test_util::write_text(path("out.bin"), "old");
  {
    AtomicFileWriter w(path("out.bin"));
    w.write("new contents", 12);
    w.write_at(0, "N", 1);
    EXPECT_EQ(read_bytes(path("out.bin")).size(), 3u);  // the old file stays until commit
    w.commit();
  }
  const std::vector<uint8_t> got = read_bytes(path("out.bin"));
  EXPECT_EQ(std::string(got.begin(), got.end()), "New contents");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace strata::data
