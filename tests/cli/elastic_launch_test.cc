// `strata launch --elastic` end to end on one host: for every injection point (a rank killed by
// SIGKILL in the forward, backward, reduction, optimizer step or checkpoint save of a step), the
// supervisor detects the lost worker, restarts on one rank fewer with the global batch kept, from
// the latest complete checkpoint, and the losses from there equal an uninterrupted run from the
// same checkpoint. Each run is bounded in time. Bad use exits 2 with a message.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/fixture.h"

namespace strata {
namespace {

class CliElasticLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_cli_elastic_launch");
    ASSERT_FALSE(dir_.empty());
    // 12 samples per step: dp 4 x accumulation 3 on 4 ranks, dp 3 x accumulation 4 on 3.
    std::ofstream(dir_ + "/tiny.json")
        << R"({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1,
               "steps_per_print": 1, "model": {"preset": "gpt2-tiny"}, "train": {"seed": 7},
               "parallelism": {"timeout_s": 60}})";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  int run(const std::string& args, std::string* out = nullptr) {
    const std::string outf = dir_ + "/out.txt";
    const std::string cmd =
        "timeout 240 '" + std::string(STRATA_BINARY) + "' " + args + " >'" + outf + "' 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(outf);
    std::stringstream text;
    text << in.rdbuf();
    if (out) *out = text.str();
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  // The loss of each step; a step run twice (before a failure and after the restart) keeps its
  // last value.
  static std::map<int64_t, double> losses(const std::string& run_dir) {
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::map<int64_t, double> out;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return out;
  }
  static std::vector<nlohmann::json> events(const std::string& run_dir) {
    std::ifstream in(run_dir + "/elastic.jsonl");
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  std::string train(const std::string& ckpt) const {
    return "train --config " + dir_ + "/tiny.json --data " + dir_ +
           "/good.bin --steps 6 --set checkpoint.interval=2 --set 'checkpoint.dir=\"" + ckpt +
           "\"'";
  }
  std::string dir_;
};

TEST_F(CliElasticLaunchTest, EveryInjectionPointResumesOnFewerRanksWithTheSameLosses) {
  for (const char* phase : {"forward", "backward", "reduce", "optimizer", "save"}) {
    SCOPED_TRACE(phase);
    const std::string tag = std::string("/") + phase, ckpt = dir_ + tag + "_ckpt",
                      run_dir = dir_ + tag + "_run";
    // Rank 1 is killed at step 4: after the checkpoint of step 2, and in `save` while step 4's
    // checkpoint is being written, which must leave step 2's the latest.
    const auto t0 = std::chrono::steady_clock::now();
    std::string out;
    ASSERT_EQ(run("launch --elastic -n 4 --max-restarts 1 --heartbeat-timeout 10 --fault "
                  "rank=1,step=4,phase=" +
                      std::string(phase) + " -- " + train(ckpt) + " --run-dir " + run_dir,
                  &out),
              0)
        << out;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(120));
    const std::vector<nlohmann::json> ev = events(run_dir);
    ASSERT_EQ(ev.size(), 5u) << out;  // start, failure, start, running, done
    EXPECT_EQ(ev[0]["world"], 4);
    EXPECT_EQ(ev[1]["event"], "failure");
    EXPECT_EQ(ev[1]["lost_ranks"], nlohmann::json::array({1})) << ev[1].dump();
    EXPECT_LT(ev[1]["detect_s"].get<double>(), 5.0) << "a dead process is seen at once";
    EXPECT_EQ(ev[2]["world"], 3);
    EXPECT_NE(ev[2]["layout"].get<std::string>().find("micro 1 x accumulation 4 x dp 3"),
              std::string::npos)
        << ev[2].dump();
    EXPECT_EQ(ev[2]["resume_step"], 2) << "the save of step 4 never completed";
    EXPECT_EQ(ev[3]["event"], "running");
    EXPECT_EQ(ev[4]["event"], "done");
    // The uninterrupted run from the same checkpoint, on 3 ranks by a plain launch.
    const std::string ref = dir_ + tag + "_ref";
    ASSERT_EQ(run("launch -n 3 -- " + train(dir_ + tag + "_refckpt") + " --resume " + ckpt +
                      "/step_00000002 --run-dir " + ref,
                  &out),
              0)
        << out;
    const std::map<int64_t, double> got = losses(run_dir), want = losses(ref);
    ASSERT_EQ(want.size(), 4u);
    for (const auto& [step, loss] : want) {
      ASSERT_TRUE(got.count(step)) << "step " << step;
      EXPECT_NEAR(got.at(step), loss, 1e-6 * loss) << "step " << step;
    }
  }
}

// A rank that hangs (alive, its heartbeat going) is found by the others' watchdog, which reports
// to the supervisor: nobody is lost, so the job restarts on the same 2 ranks from the checkpoint.
TEST_F(CliElasticLaunchTest, AWatchdogReportRestartsOnTheSameRanks) {
  const std::string run_dir = dir_ + "/run";
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run("launch --elastic -n 2 --fault rank=1,step=3,phase=hang -- " + train(dir_ + "/c") +
                    " --set parallelism.timeout_s=3 --run-dir " + run_dir,
                &out),
            0)
      << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  const std::vector<nlohmann::json> ev = events(run_dir);
  ASSERT_EQ(ev.size(), 5u) << out;
  EXPECT_NE(ev[1]["cause"].get<std::string>().find("waited more than 3 s"), std::string::npos)
      << ev[1].dump();
  EXPECT_TRUE(ev[1]["lost_ranks"].empty()) << ev[1].dump();
  EXPECT_EQ(ev[2]["world"], 2);
  EXPECT_EQ(ev[2]["resume_step"], 2);
  EXPECT_EQ(losses(run_dir).size(), 6u);
}

TEST_F(CliElasticLaunchTest, GivesUpAfterMaxRestartsAndOnBadInput) {
  std::string out;
  // Every start loses a rank (the fault goes to each via train's own --fault, refused) ...
  EXPECT_EQ(
      run("launch --elastic -n 2 -- " + train(dir_ + "/c") + " --fault rank=0,step=1,phase=forward",
          &out),
      2);
  EXPECT_NE(out.find("passes it to the first start only"), std::string::npos) << out;
  // ... no checkpoint.dir: nothing to restart from.
  EXPECT_EQ(run("launch --elastic -n 2 -- train --config " + dir_ + "/tiny.json", &out), 2);
  EXPECT_NE(out.find("set checkpoint.dir"), std::string::npos) << out;
  // A bad config is not retried.
  std::ofstream(dir_ + "/bad.json") << R"({"train_batch_size": 12, "model": {"preset": "nope"}})";
  EXPECT_EQ(run("launch --elastic -n 2 -- train --config " + dir_ +
                    "/bad.json --set 'checkpoint.dir=\"x\"'",
                &out),
            2);
  EXPECT_NE(out.find("nope"), std::string::npos) << out;
  // With --max-restarts 0 the first lost rank ends the job, non-zero, saying why.
  EXPECT_NE(run("launch --elastic -n 4 --max-restarts 0 --fault rank=2,step=2,phase=backward -- " +
                    train(dir_ + "/c0") + " --run-dir " + dir_ + "/r0",
                &out),
            0);
  EXPECT_NE(out.find("giving up after 0 restart(s)"), std::string::npos) << out;
  // --min-ranks 4: one rank lost leaves no valid layout.
  EXPECT_NE(run("launch --elastic -n 4 --min-ranks 4 --fault rank=2,step=2,phase=backward -- " +
                    train(dir_ + "/c1") + " --run-dir " + dir_ + "/r1",
                &out),
            0);
  EXPECT_NE(out.find("no valid layout for 4..4 ranks on 3 available worker(s)"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace strata
