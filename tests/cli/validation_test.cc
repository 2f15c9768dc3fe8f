// Validation and the training workflow through the CLI: a directory of train and val files trains
// on the train files only and reports val_loss every train.eval_interval steps and at the last;
// a resume continues that schedule and leaves one metrics row per step; the step count must be
// positive; a run saves its last step (or says that nothing will be saved); a resume at or past
// train.steps says so; a resume without a model block takes the checkpoint's model, and one at a
// shorter seq_len loads it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/data/llmc_shard.h"
#include "tests/cli/fixture.h"

namespace strata {
namespace {

class CliValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_cli_val");
    ASSERT_FALSE(dir_.empty());
    std::filesystem::create_directory(dir_ + "/data");
    std::filesystem::rename(dir_ + "/good.bin", dir_ + "/data/train.bin");
    std::vector<int32_t> val(1200);
    for (size_t i = 0; i < val.size(); ++i) val[i] = int32_t((i * 5 + i / 11) % 64);
    data::write_llmc_shard(dir_ + "/data/val.bin", val, false);
    write(dir_ + "/tiny.json", config(R"("model": {"preset": "gpt2-tiny"}, )"));
    write(dir_ + "/nomodel.json", config(""));
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::string config(const std::string& model) {
    return R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
              )" +
           model + R"("train": {"seed": 7, "eval_interval": 2, "eval_iters": 3}})";
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Runs strata with args; returns the exit status; out and err: its stdout and stderr.
  int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
    const std::string cmd = std::string("'") + STRATA_BINARY + "' " + args + " >'" + dir_ +
                            "/stdout.txt' 2>'" + dir_ + "/stderr.txt'";
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status)) << cmd;
    if (out) *out = read(dir_ + "/stdout.txt");
    if (err) *err = read(dir_ + "/stderr.txt");
    return WEXITSTATUS(status);
  }
  std::string train(const std::string& config = "tiny.json") const {
    return "train --config " + dir_ + "/" + config + " ";
  }
  std::string ckpt_flags(int interval) const {
    return " --set checkpoint.interval=" + std::to_string(interval) + " --set 'checkpoint.dir=\"" +
           dir_ + "/ckpt\"' ";
  }
  std::vector<nlohmann::json> rows(const std::string& run_dir) {
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // step -> val_loss of the rows that have one.
  std::map<int64_t, double> val_losses(const std::string& run_dir) {
    std::map<int64_t, double> out;
    for (const nlohmann::json& r : rows(run_dir)) {
      if (r.contains("val_loss")) {
        EXPECT_NEAR(r["val_ppl"].get<double>(), std::exp(r["val_loss"].get<double>()), 1e-9);
        out[r["step"].get<int64_t>()] = r["val_loss"].get<double>();
      }
    }
    return out;
  }
  std::vector<double> losses(const std::string& run_dir) {
    std::vector<double> out;
    for (const nlohmann::json& r : rows(run_dir)) out.push_back(r["loss"].get<double>());
    return out;
  }
  std::string dir_;
};

// The directory's val.bin is never trained on: the losses are those of training on train.bin
// alone without validation (bit-identical), and val_loss comes at steps 2, 4 and the last, 5.
TEST_F(CliValidationTest, DirectoryTrainsOnTrainFilesAndValidatesOnVal) {
  std::string out, err;
  ASSERT_EQ(
      run(train() + "--data " + dir_ + "/data --steps 5 --run-dir " + dir_ + "/a", &out, &err), 0)
      << err;
  EXPECT_NE(out.find("data: train on " + dir_ + "/data/train.bin\n"), std::string::npos) << out;
  EXPECT_NE(out.find("data: validate on " + dir_ + "/data/val.bin (the val files of data.path)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step     4 | val loss "), std::string::npos) << out;
  const std::map<int64_t, double> val = val_losses(dir_ + "/a");
  ASSERT_EQ(val.size(), 3u);
  EXPECT_TRUE(val.count(2) && val.count(4) && val.count(5));
  for (const auto& [step, loss] : val) EXPECT_TRUE(std::isfinite(loss) && loss > 0) << step;

  ASSERT_EQ(run(train() + "--data " + dir_ + "/data/train.bin --set train.eval_iters=0 --steps 5 " +
                    "--run-dir " + dir_ + "/b",
                &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("found beside data.path"), std::string::npos) << out;
  EXPECT_NE(out.find("train.eval_iters=0: no validation"), std::string::npos) << out;
  EXPECT_TRUE(val_losses(dir_ + "/b").empty());
  EXPECT_EQ(losses(dir_ + "/a"), losses(dir_ + "/b"));
}

// data.val_path names the validation data; one of another vocabulary is exit 2 naming it.
TEST_F(CliValidationTest, ValidationDataOfAnotherVocabularyExitsTwo) {
  std::vector<int32_t> wide(1200);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = int32_t(i % 500);  // model.vocab is 64
  data::write_llmc_shard(dir_ + "/wide_val.bin", wide, false);
  std::string out, err;
  EXPECT_EQ(run(train() + "--data " + dir_ + "/data --set 'data.val_path=\"" + dir_ +
                    "/wide_val.bin\"' --steps 2 --run-dir " + dir_ + "/a",
                &out, &err),
            2);
  EXPECT_NE(err.find("validation data " + dir_ + "/wide_val.bin has token id 499"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("model.vocab is 64"), std::string::npos) << err;
  EXPECT_EQ(err.find(".cc:"), std::string::npos) << "no source location: " << err;
}

TEST_F(CliValidationTest, StepCountsMustBePositive) {
  std::string out, err;
  const std::string base = train() + "--data " + dir_ + "/data --run-dir " + dir_ + "/a ";
  for (const char* steps : {"0", "-3"}) {
    EXPECT_EQ(run(base + "--steps " + steps, &out, &err), 2) << steps;
    EXPECT_NE(err.find(std::string("--steps ") + steps + ": give the number of optimizer steps"),
              std::string::npos)
        << err;
  }
  EXPECT_EQ(run(base + "--set train.steps=0", &out, &err), 2);
  EXPECT_NE(err.find("train.steps must be an integer >= 1, got 0"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/a/metrics.jsonl"));
}

// The last step is saved when train.steps is no multiple of the interval; without checkpoint.dir
// the run says at its start that nothing will be saved.
TEST_F(CliValidationTest, TheLastStepIsSavedOrTheRunSaysNothingWillBe) {
  std::string out, err;
  const std::string base = train() + "--data " + dir_ + "/data --steps 5 --run-dir " + dir_ + "/a";
  ASSERT_EQ(run(base, &out, &err), 0) << err;
  const size_t note = out.find("note: no checkpoint.dir: nothing will be saved");
  EXPECT_NE(note, std::string::npos) << out;
  EXPECT_LT(note, out.find("step     1/5")) << "said at the start";
  ASSERT_EQ(run(base + ckpt_flags(2), &out, &err), 0) << err;
  EXPECT_EQ(out.find("nothing will be saved"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/ckpt/step_00000004"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/ckpt/step_00000005"));
  EXPECT_EQ(read(dir_ + "/ckpt/latest").substr(0, 13), "step_00000005");
}

// Stopped after step 4 (checkpoints at 3 and 4) and resumed from step 3: metrics.jsonl holds
// steps 1-6 once each, with the uninterrupted run's losses and its val_loss at steps 2, 4, 6.
TEST_F(CliValidationTest, ResumeContinuesTheEvalScheduleWithOneRowPerStep) {
  std::string out, err;
  const std::string base = train() + "--data " + dir_ + "/data";
  ASSERT_EQ(run(base + " --steps 6 --run-dir " + dir_ + "/whole", &out, &err), 0) << err;
  ASSERT_EQ(run(base + ckpt_flags(3) + "--steps 4 --run-dir " + dir_ + "/r", &out, &err), 0) << err;
  ASSERT_EQ(rows(dir_ + "/r").size(), 4u);
  ASSERT_EQ(run(base + ckpt_flags(3) + "--steps 6 --resume " + dir_ + "/ckpt/step_00000003 " +
                    "--run-dir " + dir_ + "/r",
                &out, &err),
            0)
      << err;
  const std::vector<nlohmann::json> r = rows(dir_ + "/r");
  ASSERT_EQ(r.size(), 6u);
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i]["step"].get<int64_t>(), int64_t(i + 1));
  const std::vector<double> whole = losses(dir_ + "/whole"), resumed = losses(dir_ + "/r");
  for (size_t s = 0; s < 6; ++s) EXPECT_NEAR(resumed[s], whole[s], 1e-6 * whole[s]) << s;
  const std::map<int64_t, double> a = val_losses(dir_ + "/whole"), b = val_losses(dir_ + "/r");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << step;
    EXPECT_NEAR(b.at(step), loss, 1e-6 * loss) << step;
  }
}

// A checkpoint at or past train.steps: nothing to train, said so, exit 0, metrics untouched.
TEST_F(CliValidationTest, ResumingAtOrPastTheLastStepSaysSo) {
  std::string out, err;
  const std::string base = train() + "--data " + dir_ + "/data" + ckpt_flags(2);
  ASSERT_EQ(run(base + "--steps 4 --run-dir " + dir_ + "/a", &out, &err), 0) << err;
  for (const char* steps : {"4", "3"}) {
    ASSERT_EQ(
        run(base + "--steps " + steps + " --resume auto --run-dir " + dir_ + "/a", &out, &err), 0)
        << err;
    EXPECT_NE(out.find(std::string("checkpoint is at step 4 >= train.steps=") + steps +
                       ": nothing to train; raise train.steps (or --steps)"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("done:"), std::string::npos) << out;
    EXPECT_EQ(rows(dir_ + "/a").size(), 4u);
  }
}

// A resume without a model block takes the checkpoint's model; a model block that differs only
// by a shorter seq_len loads it (GPT-2: the position table's first rows; Llama: nothing to cut);
// any other difference is exit 2 naming the field.
TEST_F(CliValidationTest, ResumeTakesOrShortensTheCheckpointModel) {
  std::string out, err;
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    std::filesystem::remove_all(dir_ + "/ckpt");
    const std::string model = std::string("--set 'model={\"preset\": \"") + preset + "\"}' ";
    ASSERT_EQ(run(train() + model + "--data " + dir_ + "/data" + ckpt_flags(2) +
                      "--steps 2 --run-dir " + dir_ + "/a",
                  &out, &err),
              0)
        << err;
    const std::string resume = "--data " + dir_ + "/data --resume " + dir_ + "/ckpt --steps 3 ";
    ASSERT_EQ(run(train("nomodel.json") + resume + "--run-dir " + dir_ + "/b", &out, &err), 0)
        << err;
    EXPECT_NE(out.find("note: no model block: the model of " + dir_ + "/ckpt/step_00000002"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("step     3/3"), std::string::npos) << out;

    ASSERT_EQ(run(train() + model + "--set model.seq_len=8 " + resume + "--run-dir " + dir_ + "/c",
                  &out, &err),
              0)
        << err;
    const bool gpt2 = std::string(preset) == "gpt2-tiny";
    EXPECT_NE(out.find(std::string("model.seq_len 8 is shorter than the checkpoint's 16: ") +
                       (gpt2 ? "the position table's first rows are loaded"
                             : "RoPE has no position table, nothing is cut")),
              std::string::npos)
        << out;

    EXPECT_EQ(run(train() + model + "--set model.seq_len=32 " + resume + "--run-dir " + dir_ + "/d",
                  &out, &err),
              2);
    EXPECT_NE(err.find("seq_len 16 in the checkpoint, 32 here"), std::string::npos) << err;
    EXPECT_EQ(run(train() + model + "--set model.hidden=64 " + resume + "--run-dir " + dir_ + "/d",
                  &out, &err),
              2);
    EXPECT_NE(err.find("hidden 32 in the checkpoint, 64 here"), std::string::npos) << err;

    // Without a model block, one field of the checkpoint's model changed from the command line.
    ASSERT_EQ(
        run(train("nomodel.json") + "--set model.seq_len=8 " + resume + "--run-dir " + dir_ + "/e",
            &out, &err),
        0)
        << err;
    EXPECT_NE(out.find("note: no model block: the model of " + dir_ + "/ckpt/step_00000002"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("seq_len 8)"), std::string::npos) << out;
    EXPECT_NE(out.find("model.seq_len 8 is shorter than the checkpoint's 16"), std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace strata
