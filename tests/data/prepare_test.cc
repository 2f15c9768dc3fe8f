// `strata data prepare`: text in, a dataset out that open_dataset reads back token for token.
#include "strata/data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>

#include "data_test_util.h"
#include "strata/data/token_dataset.h"
#include "strata/data/tokenizer.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;
using test_util::expect_input_error;
using test_util::read_all;
using test_util::read_bytes;
using test_util::write_bytes;
using test_util::write_text;

class PrepareTest : public test_util::TempDirTest {
 protected:
  // corpus/ holds two text documents and three files prepare must skip.
  void make_corpus() {
    fs::create_directories(path("corpus/sub"));
    write_text(path("corpus/a.txt"), a_);
    write_text(path("corpus/sub/b.md"), b_);
    write_bytes(path("corpus/c.bin"), {'x', 0, 'y'});
    write_bytes(path("corpus/d.txt.gz"), {0x1f, 0x8b, 8, 0, 'z'});
    write_text(path("corpus/empty.txt"), "");
  }
  // The stream prepare must produce: EOT before each document, documents sorted by path.
  std::vector<int32_t> expected_stream() const {
    ByteTokenizer tok;
    std::vector<int32_t> s = {ByteTokenizer::kEot};
    tok.encode_append(a_, s);
    s.push_back(ByteTokenizer::kEot);
    tok.encode_append(b_, s);
    return s;
  }
  std::vector<int32_t> concat(const std::string& train, const std::string& val) {
    std::vector<int32_t> all = read_all(*open_dataset(train));
    const std::vector<int32_t> v = read_all(*open_dataset(val));
    all.insert(all.end(), v.begin(), v.end());
    return all;
  }

  std::string a_ = "First document.\nIt has two lines, and UTF-8: \xC3\xA9\xE2\x82\xAC.\n";
  std::string b_ = std::string(3000, 'b') + "\nthe end";
};

TEST_F(PrepareTest, LlmcCountsSkipsAndReadsBack) {
  make_corpus();
  const PrepareResult r = prepare_text_dataset({path("corpus")}, path("out/tiny"), "llmc", 0.1);
  const int64_t total = int64_t(a_.size() + b_.size()) + 2;  // file sizes + one EOT per document
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.train_tokens + r.val_tokens, total);
  EXPECT_EQ(r.val_tokens, std::llround(0.1 * double(total)));
  EXPECT_EQ(r.files_skipped_binary, 1);
  EXPECT_EQ(r.files_skipped_gzip, 1);
  EXPECT_EQ(r.files_skipped_empty, 1);
  EXPECT_EQ(r.files_skipped_unreadable, 0);
  EXPECT_EQ(r.files_skipped, 3);
  EXPECT_EQ(r.outputs,
            (std::vector<std::string>{path("out/tiny_train.bin"), path("out/tiny_val.bin")}));
  EXPECT_EQ(read_bytes(path("out/tiny_train.bin")).size(), size_t(1024 + 2 * r.train_tokens));
  EXPECT_EQ(concat(path("out/tiny_train.bin"), path("out/tiny_val.bin")), expected_stream());
  // Atomic writes leave nothing but the final files.
  EXPECT_EQ(std::distance(fs::directory_iterator(path("out")), fs::directory_iterator()), 2);
}

TEST_F(PrepareTest, MegatronMatchesLlmcAndSplitsTheStraddlingDocument) {
  make_corpus();
  const PrepareResult r = prepare_text_dataset({path("corpus")}, path("meg"), "megatron", 0.5);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.outputs, (std::vector<std::string>{path("meg_train.bin"), path("meg_train.idx"),
                                                 path("meg_val.bin"), path("meg_val.idx")}));
  EXPECT_EQ(concat(path("meg_train"), path("meg_val")), expected_stream());
  // Half the stream falls inside document b: train holds a and b's head, val b's tail.
  const std::vector<uint8_t> train_idx = read_bytes(path("meg_train.idx"));
  const std::vector<uint8_t> val_idx = read_bytes(path("meg_val.idx"));
  EXPECT_EQ(train_idx[17], 8);  // uint16
  EXPECT_EQ(train_idx[18], 2);  // sequences
  EXPECT_EQ(val_idx[18], 1);
  EXPECT_EQ(r.train_tokens, (int64_t(a_.size() + b_.size()) + 2) / 2);
}

TEST_F(PrepareTest, FilesAndDirectoriesInTheOrderGiven) {
  make_corpus();
  const PrepareResult r =
      prepare_text_dataset({path("corpus/sub/b.md"), path("corpus/a.txt")}, path("x"), "llmc", 0.0);
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_EQ(r.outputs, std::vector<std::string>{path("x_train.bin")});
  EXPECT_FALSE(fs::exists(path("x_val.bin")));
  ByteTokenizer tok;
  std::vector<int32_t> want = {ByteTokenizer::kEot};
  tok.encode_append(b_, want);
  want.push_back(ByteTokenizer::kEot);
  tok.encode_append(a_, want);
  EXPECT_EQ(read_all(*open_dataset(path("x_train.bin"))), want);
}

TEST_F(PrepareTest, OneSmallFileStillGetsBothSplits) {
  write_text(path("one.txt"), "abc");
  const PrepareResult r = prepare_text_dataset({path("one.txt")}, path("o"), "llmc", 0.01);
  EXPECT_EQ(r.train_tokens, 3);
  EXPECT_EQ(r.val_tokens, 1);
}

TEST_F(PrepareTest, OverwritesAPreviousOutput) {
  write_text(path("one.txt"), "first");
  prepare_text_dataset({path("one.txt")}, path("o"), "megatron", 0.0);
  write_text(path("one.txt"), "second!");
  prepare_text_dataset({path("one.txt")}, path("o"), "megatron", 0.0);
  EXPECT_EQ(open_dataset(path("o_train"))->num_tokens(), 8);
}

// An existing directory as the output (or a path ending in '/') gets the files inside it, named
// for the split alone; a prefix beside it would land outside the directory the user named.
TEST_F(PrepareTest, IntoADirectory) {
  make_corpus();
  fs::create_directories(path("out"));
  const PrepareResult r = prepare_text_dataset({path("corpus")}, path("out"), "llmc", 0.1);
  EXPECT_EQ(r.outputs, (std::vector<std::string>{path("out/train.bin"), path("out/val.bin")}));
  EXPECT_EQ(concat(path("out/train.bin"), path("out/val.bin")), expected_stream());
  EXPECT_FALSE(fs::exists(path("out_train.bin")));

  const PrepareResult m =
      prepare_text_dataset({path("corpus")}, path("out") + "/", "megatron", 0.0);
  EXPECT_EQ(m.outputs, (std::vector<std::string>{path("out/train.bin"), path("out/train.idx")}));
  EXPECT_EQ(read_all(*open_dataset(path("out/train"))), expected_stream());

  // A trailing '/' names a directory to create.
  const PrepareResult n =
      prepare_text_dataset({path("corpus")}, path("new/sub") + "/", "llmc", 0.0);
  EXPECT_EQ(n.outputs, std::vector<std::string>{path("new/sub/train.bin")});
  EXPECT_TRUE(fs::is_regular_file(path("new/sub/train.bin")));

  write_text(path("plain"), "");
  expect_input_error(
      [&] { prepare_text_dataset({path("corpus")}, path("plain") + "/", "llmc", 0.0); },
      {"cannot create output directory " + path("plain") + "/"});
}

TEST_F(PrepareTest, Errors) {
  fs::create_directories(path("empty_dir/sub"));
  expect_input_error([&] { prepare_text_dataset({path("empty_dir")}, path("o"), "llmc", 0.1); },
                     {"no input files"});
  expect_input_error([&] { prepare_text_dataset({path("missing")}, path("o"), "llmc", 0.1); },
                     {"input " + path("missing") + " does not exist"});
  expect_input_error([&] { prepare_text_dataset({}, path("o"), "llmc", 0.1); }, {"no inputs"});

  fs::create_directories(path("bin_only"));
  write_bytes(path("bin_only/blob"), {1, 2, 0, 3});
  write_bytes(path("bin_only/arch.gz"), {0x1f, 0x8b, 0});
  expect_input_error([&] { prepare_text_dataset({path("bin_only")}, path("o"), "llmc", 0.1); },
                     {"nothing readable", "all 2 files were skipped", "1 binary", "1 gzip"});

  write_text(path("t.txt"), "text");
  write_text(path("a_file"), "");
  expect_input_error(
      [&] { prepare_text_dataset({path("t.txt")}, path("a_file/out"), "llmc", 0.1); },
      {"cannot create output directory " + path("a_file")});
  expect_input_error([&] { prepare_text_dataset({path("t.txt")}, path("o"), "hdf5", 0.1); },
                     {"unknown output format \"hdf5\""});
  expect_input_error([&] { prepare_text_dataset({path("t.txt")}, path("o"), "llmc", 1.0); },
                     {"val fraction 1", "outside [0, 1)"});
  EXPECT_FALSE(fs::exists(path("o_train.bin")));
}

TEST_F(PrepareTest, ReadOnlyOutputDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  write_text(path("t.txt"), "text");
  fs::create_directory(path("ro"));
  fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  expect_input_error([&] { prepare_text_dataset({path("t.txt")}, path("ro/o"), "llmc", 0.0); },
                     {"cannot create " + path("ro/o_train.bin"), "Permission denied",
                      path("ro") + " exists and is writable"});
  fs::permissions(path("ro"), fs::perms::owner_all);
  EXPECT_TRUE(fs::is_empty(path("ro")));
}

}  // namespace
}  // namespace strata::data
