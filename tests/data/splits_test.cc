// Train and validation splits of a data path (open_splits): a directory of llm.c or `data
// prepare` files trains on its train files only and validates on its val files; a train path
// finds its val split beside; data.val_path overrides.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/data/llmc_shard.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace strata::data {
namespace {

using test_util::read_all;
using test_util::TempDirTest;

class SplitsTest : public TempDirTest {
 protected:
  // A shard of n tokens, all equal to id (so that a dataset's contents say which files it read).
  void shard(const std::string& name, int32_t id, size_t n = 50) {
    write_llmc_shard(path(name), std::vector<int32_t>(n, id), false);
  }
  static std::vector<int32_t> ids(const TokenDataset& ds) {
    std::vector<int32_t> all = read_all(ds), out;
    for (int32_t t : all) {
      if (out.empty() || out.back() != t) out.push_back(t);
    }
    return out;
  }
};

TEST(SplitOf, NamesTheSplitByWord) {
  EXPECT_EQ(split_of("/d/fineweb_train_000001.bin"), Split::Train);
  EXPECT_EQ(split_of("/d/fineweb_val_000000.bin"), Split::Val);
  EXPECT_EQ(split_of("train.bin"), Split::Train);
  EXPECT_EQ(split_of("/x/val.idx"), Split::Val);
  EXPECT_EQ(split_of("corpus_text_document_valid.bin"), Split::Val);
  EXPECT_EQ(split_of("/train/shard.bin"), Split::None);   // the directory does not count
  EXPECT_EQ(split_of("trainer_notes.bin"), Split::None);  // a word, not a substring
  EXPECT_EQ(split_of("interval.bin"), Split::None);
}

// llm.c's naming: the val shard is never trained on.
TEST_F(SplitsTest, DirectoryOfLlmcShardsTrainsOnTrainFilesOnly) {
  shard("fineweb_train_000001.bin", 1);
  shard("fineweb_train_000002.bin", 2);
  shard("fineweb_val_000000.bin", 9);
  shard("notes.bin", 5);
  DataSplits d = open_splits(dir_.string(), "");
  EXPECT_EQ(ids(*d.train), (std::vector<int32_t>{1, 2}));
  ASSERT_NE(d.val, nullptr);
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{9});
  EXPECT_EQ(d.train_files, (std::vector<std::string>{path("fineweb_train_000001.bin"),
                                                     path("fineweb_train_000002.bin")}));
  EXPECT_EQ(d.val_files, std::vector<std::string>{path("fineweb_val_000000.bin")});
  EXPECT_EQ(d.ignored_files, std::vector<std::string>{path("notes.bin")});
  EXPECT_EQ(d.val_origin, "the val files of data.path");
}

// `data prepare --output DIR/` writes DIR/train.bin + DIR/val.bin (Megatron: .bin/.idx pairs).
TEST_F(SplitsTest, DirectoryOfPreparedMegatronPairs) {
  write_megatron_dataset(path("train"), {{1, 1, 1}, {2, 2}});
  write_megatron_dataset(path("val"), {{7, 7, 7}});
  DataSplits d = open_splits(dir_.string(), "");
  EXPECT_EQ(ids(*d.train), (std::vector<int32_t>{1, 2}));
  ASSERT_NE(d.val, nullptr);
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{7});
}

// Without split names a directory is all training data, as before; no validation.
TEST_F(SplitsTest, DirectoryWithoutSplitNamesIsAllTraining) {
  shard("a.bin", 1);
  shard("b.bin", 2);
  DataSplits d = open_splits(dir_.string(), "");
  EXPECT_EQ(ids(*d.train), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d.val, nullptr);
  EXPECT_TRUE(d.ignored_files.empty());
}

// Only val files and unnamed ones: the unnamed ones train. Only val files: an error naming them.
TEST_F(SplitsTest, DirectoryWithOnlyValFiles) {
  shard("val.bin", 9);
  test_util::expect_input_error([&] { open_splits(dir_.string(), ""); },
                                {"holds only validation files", "data.val_path"});
  shard("other.bin", 3);
  DataSplits d = open_splits(dir_.string(), "");
  EXPECT_EQ(ids(*d.train), std::vector<int32_t>{3});
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{9});
}

TEST_F(SplitsTest, TrainPathFindsItsValSplitBeside) {
  shard("corpus_train.bin", 1);
  shard("corpus_val.bin", 9);
  DataSplits d = open_splits(path("corpus_train.bin"), "");
  EXPECT_EQ(ids(*d.train), std::vector<int32_t>{1});
  ASSERT_NE(d.val, nullptr);
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{9});
  EXPECT_EQ(d.val_origin, "found beside data.path");
  // A glob pattern: fineweb_train_*.bin -> fineweb_val_*.bin.
  shard("fineweb_train_000001.bin", 2);
  shard("fineweb_val_000000.bin", 8);
  d = open_splits(path("fineweb_train_*.bin"), "");
  EXPECT_EQ(ids(*d.train), std::vector<int32_t>{2});
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{8});
  // A Megatron prefix DIR/train -> DIR/val.
  write_megatron_dataset(path("train"), {{3, 3}});
  write_megatron_dataset(path("val"), {{4, 4}});
  d = open_splits(path("train"), "");
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{4});
  // Nothing beside: no validation.
  shard("solo_train.bin", 5);
  EXPECT_EQ(open_splits(path("solo_train.bin"), "").val, nullptr);
}

TEST_F(SplitsTest, ValPathOverridesTheSplitBeside) {
  shard("corpus_train.bin", 1);
  shard("corpus_val.bin", 9);
  shard("held_out.bin", 6);
  DataSplits d = open_splits(path("corpus_train.bin"), path("held_out.bin"));
  EXPECT_EQ(ids(*d.val), std::vector<int32_t>{6});
  EXPECT_EQ(d.val_origin, "data.val_path");
  test_util::expect_input_error([&] { open_splits(path("corpus_train.bin"), path("missing")); },
                                {"missing"});
}

}  // namespace
}  // namespace strata::data
