// Every way a user's data file can be wrong: each throws InputError naming the file and the
// problem, so `strata train` exits with code 2 and a sentence the user can act on.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;
using test_util::expect_input_error;
using test_util::llmc_bytes;
using test_util::patch_le;
using test_util::read_bytes;
using test_util::write_bytes;

class MalformedTest : public test_util::TempDirTest {
 protected:
  // A valid Megatron dataset "m" whose .idx bytes a test then damages.
  std::vector<uint8_t> megatron_idx() {
    write_megatron_dataset(path("m"), {{1, 2, 3}, {4, 5}});
    return read_bytes(path("m.idx"));
  }
  void open(const std::string& p) { open_dataset(p); }
};

TEST_F(MalformedTest, TruncatedLlmcShard) {
  write_bytes(path("t.bin"), llmc_bytes(20240520, 1, 4, 6));
  expect_input_error([&] { open(path("t.bin")); },
                     {path("t.bin"), "file size 1030 does not match header",
                      "1024 + 4 tokens × 2 bytes = 1032", "truncated"});
}

TEST_F(MalformedTest, HeaderTokenCountMismatch) {
  write_bytes(path("h.bin"), llmc_bytes(20240801, 7, 10, 4 * 4));  // holds 4 uint32 tokens
  expect_input_error([&] { open(path("h.bin")); },
                     {path("h.bin"), "1024 + 10 tokens × 4 bytes = 1064"});
}

TEST_F(MalformedTest, ShorterThanHeader) {
  std::vector<uint8_t> bytes = llmc_bytes(20240520, 1, 0, 0);
  bytes.resize(500);
  write_bytes(path("s.bin"), bytes);
  expect_input_error([&] { open(path("s.bin")); },
                     {path("s.bin"), "file size 500", "smaller than the 1024-byte llm.c header"});
}

TEST_F(MalformedTest, BadLlmcMagic) {
  write_bytes(path("m.bin"), llmc_bytes(12345, 1, 0, 0));
  expect_input_error([&] { open(path("m.bin")); },
                     {path("m.bin"), "bad magic 12345",
                      "expected 20240520 (llm.c uint16) or 20240801 (llm.c uint32)"});
  expect_input_error([&] { open_dataset(path("m.bin"), "llmc"); }, {"bad magic 12345"});
}

TEST_F(MalformedTest, WrongLlmcVersion) {
  write_bytes(path("v.bin"), llmc_bytes(20240520, 3, 0, 0));
  expect_input_error([&] { open(path("v.bin")); },
                     {path("v.bin"), "unsupported version 3", "expected version 1"});
  write_bytes(path("w.bin"), llmc_bytes(20240801, 1, 0, 0));
  expect_input_error([&] { open(path("w.bin")); },
                     {path("w.bin"), "unsupported version 1", "expected version 7"});
}

TEST_F(MalformedTest, NegativeHeaderCount) {
  write_bytes(path("n.bin"), llmc_bytes(20240520, 1, -2, 0));
  expect_input_error([&] { open(path("n.bin")); }, {path("n.bin"), "-2", "negative"});
}

TEST_F(MalformedTest, EmptyFile) {
  write_bytes(path("e.bin"), {});
  expect_input_error([&] { open(path("e.bin")); }, {path("e.bin"), "empty (0 bytes)"});
}

TEST_F(MalformedTest, ZeroTokenDataset) {
  write_llmc_shard(path("z0.bin"), {}, false);
  write_llmc_shard(path("z1.bin"), {}, true);
  expect_input_error([&] { open(path("z*.bin")); },
                     {path("z*.bin"), "has no tokens", path("z0.bin"), path("z1.bin")});
  write_megatron_dataset(path("zm"), {{}, {}});
  expect_input_error([&] { open(path("zm")); }, {path("zm"), "has no tokens"});
}

TEST_F(MalformedTest, MissingPath) {
  const std::string p = path("nope");
  expect_input_error([&] { open(p); }, {"no dataset at " + p, p + ".bin", p + ".idx"});
  expect_input_error([&] { open(path("nope_*.bin")); }, {"no files match", path("nope_*.bin")});
}

TEST_F(MalformedTest, EmptyDirectory) {
  fs::create_directory(path("d"));
  expect_input_error([&] { open(path("d")); }, {path("d"), "contains no .bin files"});
}

TEST_F(MalformedTest, MissingIdx) {
  megatron_idx();
  fs::remove(path("m.idx"));
  expect_input_error([&] { open_dataset(path("m"), "megatron"); },
                     {path("m.idx") + " missing", "found " + path("m.bin")});
  expect_input_error([&] { open_dataset(path("m.bin"), "megatron"); }, {path("m.idx")});
  expect_input_error([&] { open(path("m")); },
                     {path("m.bin"), "bad magic", "its index " + path("m.idx") + " is missing"});
}

TEST_F(MalformedTest, MissingBin) {
  megatron_idx();
  fs::remove(path("m.bin"));
  expect_input_error([&] { open(path("m.idx")); }, {path("m.bin") + " missing"});
  expect_input_error([&] { open(path("m")); }, {path("m.bin") + " missing"});
}

TEST_F(MalformedTest, IdxBadMagic) {
  std::vector<uint8_t> idx = megatron_idx();
  idx[0] = 'X';
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "bad magic", "MMIDIDX"});
}

TEST_F(MalformedTest, IdxVersion) {
  std::vector<uint8_t> idx = megatron_idx();
  patch_le<uint64_t>(idx, 9, 2);
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); },
                     {path("m.idx"), "unsupported Megatron index version 2"});
}

TEST_F(MalformedTest, IdxFloatDtype) {
  std::vector<uint8_t> idx = megatron_idx();
  idx[17] = 6;
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); },
                     {path("m.idx"), "unsupported dtype code 6 (float64)", "must be integers"});
  idx[17] = 7;
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {"dtype code 7 (float32)"});
  idx[17] = 9;
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "unknown dtype code 9"});
}

TEST_F(MalformedTest, IdxPointersPastBinEnd) {
  megatron_idx();
  std::vector<uint8_t> bin = read_bytes(path("m.bin"));
  bin.resize(bin.size() - 2);  // the last sequence loses a token
  write_bytes(path("m.bin"), bin);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "sequence 1 spans bytes [6, 10)",
                                                path("m.bin"), "has 8 bytes"});
}

TEST_F(MalformedTest, IdxPointerNegativeOrMisaligned) {
  std::vector<uint8_t> idx = megatron_idx();
  patch_le<int64_t>(idx, 34 + 2 * 4 + 8, 3);  // sequence 1 starts mid-token
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "sequence 1", "byte pointer 3"});
  patch_le<int64_t>(idx, 34 + 2 * 4 + 8, -4);
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {"byte pointer -4"});
}

TEST_F(MalformedTest, IdxSizeMismatch) {
  std::vector<uint8_t> idx = megatron_idx();
  idx.pop_back();
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); },
                     {path("m.idx"), "does not match header", "2 sequences", "3 documents"});
  patch_le<uint64_t>(idx, 18, uint64_t(1) << 62);  // a count that would overflow the arithmetic
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "more than a file of"});
  idx.resize(20);
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "smaller than the 34-byte"});
}

TEST_F(MalformedTest, IdxDocumentIndexOutOfRange) {
  std::vector<uint8_t> idx = megatron_idx();
  patch_le<int64_t>(idx, 34 + 2 * 12 + 8, 5);  // doc_idx[1] = 5 > 2 sequences
  write_bytes(path("m.idx"), idx);
  expect_input_error([&] { open(path("m")); }, {path("m.idx"), "document index 1 is 5"});
}

TEST_F(MalformedTest, NegativeTokenId) {
  // A hand-made int32 Megatron dataset with -3 as its second token.
  std::vector<uint8_t> bin;
  test_util::append_le<int32_t>(bin, 1);
  test_util::append_le<int32_t>(bin, -3);
  write_bytes(path("neg.bin"), bin);
  std::vector<uint8_t> idx(std::begin(kMegatronMagic), std::end(kMegatronMagic));
  test_util::append_le<uint64_t>(idx, 1);
  idx.push_back(4);
  test_util::append_le<uint64_t>(idx, 1);
  test_util::append_le<uint64_t>(idx, 2);
  test_util::append_le<int32_t>(idx, 2);
  test_util::append_le<int64_t>(idx, 0);
  test_util::append_le<int64_t>(idx, 0);
  test_util::append_le<int64_t>(idx, 1);
  write_bytes(path("neg.idx"), idx);
  expect_input_error([&] { open(path("neg")); },
                     {path("neg.bin"), "byte offset 4 has id -3", "must be in [0, 2^31)"});
}

TEST_F(MalformedTest, DatasetShorterThanWindow) {
  write_llmc_shard(path("short.bin"), {1, 2, 3, 4, 5}, false);
  auto ds = open_dataset(path("short.bin"));
  expect_input_error([&] { Sampler s(*ds, 8, 1); },
                     {path("short.bin"), "has 5 tokens", "seq_len 8 needs at least 9"});
  Sampler ok(*ds, 4, 1);  // exactly seq_len + 1 tokens is enough
  EXPECT_EQ(ok.num_windows(), 1);
}

TEST_F(MalformedTest, TokenIdBeyondModelVocab) {
  write_llmc_shard(path("gpt2.bin"), {50256, 11, 12}, false);
  auto ds = open_dataset(path("gpt2.bin"));
  Sampler s(*ds, 2, 1);
  expect_input_error([&] { s.check_vocab(8192); },
                     {"dataset " + path("gpt2.bin") + " has token id 50256 but model.vocab is 8192",
                      "larger vocab or re-tokenize"});
  s.check_vocab(50257);
}

TEST_F(MalformedTest, UnknownFormat) {
  write_llmc_shard(path("a.bin"), {1}, false);
  expect_input_error([&] { open_dataset(path("a.bin"), "parquet"); },
                     {"unknown dataset format \"parquet\"", "auto, llmc or megatron"});
  expect_input_error([&] { open_dataset(path("a.bin"), "megatron"); }, {path("a.idx")});
}

}  // namespace
}  // namespace strata::data
