// Real DeepSpeed configs train through the CLI: a few files of tests/config/ds_configs, with the
// Hugging Face Trainer's "auto" values filled and only a model block, the data and a step count
// added, run 2 steps of a tiny model on 1 and 2 ranks. Bucket sizes of 0 train with the losses of
// the defaults (the layout never changes the math). Under `strata launch`, a bad config is
// reported once, exits 2, and shows none of mpirun's abort banners.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/fixture.h"
#include "tests/config/ds_corpus.h"

namespace strata {
namespace {

using nlohmann::json;

class DsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_ds_cli");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Runs strata with args; returns the exit status (-1 for a signal) and fills stderr.
  int run(const std::string& args, std::string* err = nullptr) {
    return run_binary(STRATA_BINARY, dir_, args, err);
  }
  std::string write_config(const std::string& name, const json& j) {
    const std::string path = dir_ + "/" + name + ".json";
    std::ofstream(path) << j.dump(2);
    return path;
  }
  // `train` on `ranks` processes, 2 steps; returns the losses (empty on failure, with a test
  // failure naming the run).
  std::vector<double> train(const std::string& config, int ranks, const std::string& tag,
                            const std::string& extra = "") {
    const std::string run_dir = dir_ + "/run_" + tag + "_" + std::to_string(ranks);
    const std::string args = "train --config '" + config + "' --data '" + dir_ +
                             "/good.bin' --steps 2 --run-dir '" + run_dir + "'" + extra;
    std::string err;
    const int code =
        run(ranks == 1 ? args : "launch -n " + std::to_string(ranks) + " -- " + args, &err);
    EXPECT_EQ(code, 0) << tag << " at " << ranks << " rank(s)\nstderr: " << err;
    std::vector<double> losses;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      losses.push_back(json::parse(line)["loss"].get<double>());
    }
    EXPECT_EQ(losses.size(), 2u) << tag << " at " << ranks << " rank(s)\nstderr: " << err;
    return losses;
  }
  std::string dir_;
};

// ZeRO-2 with offload and fp16 "auto"; ZeRO-3 bf16 with sub_group_size, max_live and reuse
// distance 0; ZeRO-1 with offload and disabled DeepSpeed blocks (data_efficiency, ...), also on
// two ranks.
TEST_F(DsCliTest, RealConfigsTrainTwoStepsAtOneAndTwoRanks) {
  for (const char* name : {"hf_zero2", "axolotl_zero3_bf16", "megatron_ds_examples"}) {
    for (int ranks : {1, 2}) {
      const json j = testing::ds_config_for_run({name, {}, {}}, ranks, false);
      train(write_config(std::string(name) + "_" + std::to_string(ranks), j), ranks, name);
    }
  }
}

// SOURCES.md's bar: every file DeepSpeed trains trains here (the refused ones with the keys they
// are refused for taken out), 2 steps of a tiny model on one process.
TEST_F(DsCliTest, EveryCorpusFileTrainsTwoSteps) {
  for (const testing::DsConfig& d : testing::ds_configs()) {
    const json j = testing::ds_config_for_run(d, 1, !d.remove.empty());
    train(write_config(d.name + "_every", j), 1, d.name);
  }
}

TEST_F(DsCliTest, ARefusedConfigTrainsWithoutTheKeySourcesNames) {
  const testing::DsConfig d = {
      "llamafactory_z3_partial_offload", {}, {"/comms_config", "/monitor_config"}};
  std::string err;
  EXPECT_EQ(
      run("train --config '" + write_config("as_is", testing::ds_config_for_run(d, 1, false)) +
              "' --data '" + dir_ + "/good.bin' --steps 2 --run-dir '" + dir_ + "/r'",
          &err),
      2);
  EXPECT_NE(err.find("the config has 2 errors"), std::string::npos) << err;
  EXPECT_NE(err.find("'comms_config'"), std::string::npos) << err;
  EXPECT_NE(err.find("'monitor_config'"), std::string::npos) << err;
  train(write_config("without", testing::ds_config_for_run(d, 1, true)), 1, d.name);
}

// DeepSpeed's 0s: reduce_bucket_size 0 at stage 0 reduces each unit alone; at stage 3 no
// prefetch, nothing kept live, nothing reused. The losses are those of the default settings.
TEST_F(DsCliTest, BucketSizesOfZeroTrainWithTheDefaultsLosses) {
  const json base = {{"train_micro_batch_size_per_gpu", 2},
                     {"gradient_accumulation_steps", 2},
                     {"model", {{"preset", "gpt2-tiny"}}}};
  json stage0 = base;
  stage0["zero_optimization"] = {{"stage", 0}};
  json stage0_zero = stage0;
  stage0_zero["zero_optimization"]["reduce_bucket_size"] = 0;
  EXPECT_EQ(train(write_config("s0", stage0), 2, "s0"),
            train(write_config("s0_zero", stage0_zero), 2, "s0_zero"));

  json stage3 = base;
  stage3["zero_optimization"] = {{"stage", 3}, {"stage3_param_persistence_threshold", 0}};
  json stage3_zero = stage3;
  for (const char* key : {"stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                          "stage3_max_reuse_distance", "sub_group_size", "allgather_bucket_size"}) {
    stage3_zero["zero_optimization"][key] = 0;
  }
  EXPECT_EQ(train(write_config("s3", stage3), 2, "s3"),
            train(write_config("s3_zero", stage3_zero), 2, "s3_zero"));
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// Every rank hits the same error: one message (rank 0's), exit 2, no MPI_Abort and none of
// mpirun's epilogue.
TEST_F(DsCliTest, LaunchPrintsAnInputErrorOnceWithoutMpirunsBanner) {
  const std::string bad =
      write_config("bad", {{"train_micro_batch_size_per_gpu", 1},
                           {"zero_optimization", {{"stage", 7}}},
                           {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "fast"}}}}}});
  std::string err;
  EXPECT_EQ(run("launch -n 2 -- train --config '" + bad + "' --data '" + dir_ +
                    "/good.bin' --steps 1 --run-dir '" + dir_ + "/r'",
                &err),
            2);
  EXPECT_EQ(count(err, "zero_optimization.stage must be one of 0, 1, 2, 3, got 7"), 1u) << err;
  EXPECT_EQ(count(err, "optimizer.params.lr must be"), 1u) << err;
  EXPECT_EQ(count(err, "strata: all 2 ranks: error: the config has 2 errors:"), 1u) << err;
  for (const char* banner : {"MPI_ABORT", "mpirun has exited", "Primary job", "----------",
                             "non-zero", "help-mpi-api"}) {
    EXPECT_EQ(err.find(banner), std::string::npos) << banner << " in:\n" << err;
  }
}

}  // namespace
}  // namespace strata
