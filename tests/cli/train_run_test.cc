// `strata` end to end through the CLI: bad data files and command lines exit 2 naming the file or
// option; a good run writes metrics.jsonl, and the same config twice gives bit-identical losses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/data/llmc_shard.h"
#include "tests/cli/fixture.h"

namespace strata {
namespace {

class CliRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_cli_run");
    ASSERT_FALSE(dir_.empty());
    write(dir_ + "/tiny.json",
          R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
              "model": {"preset": "gpt2-tiny"}, "train": {"seed": 7}})");
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  // Runs strata with args; returns the exit status and fills stderr.
  int run(const std::string& args, std::string* err = nullptr) {
    return run_binary(STRATA_BINARY, dir_, args, err);
  }
  std::vector<double> losses(const std::string& run_dir) {
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::vector<double> out;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes"}) {
        EXPECT_TRUE(j.contains(key)) << key << " missing from " << line;
      }
      out.push_back(j["loss"].get<double>());
    }
    return out;
  }
  std::string dir_;
};

TEST_F(CliRunTest, SameConfigTwiceGivesBitIdenticalLosses) {
  const std::string base = "train --config " + dir_ + "/tiny.json --data " + dir_ + "/good.bin";
  ASSERT_EQ(run(base + " --steps 8 --run-dir " + dir_ + "/a"), 0);
  ASSERT_EQ(run(base + " --steps 8 --run-dir " + dir_ + "/b"), 0);
  auto a = losses(dir_ + "/a"), b = losses(dir_ + "/b");
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  EXPECT_LT(a.back(), a.front());
}

// Checkpoints through the CLI: a run on 2 ranks (tp 2, ZeRO-1) saves every 3 steps; `--resume
// auto` continues it on one process to step 6 with the losses of an uninterrupted run; `ckpt
// verify` passes it and, after one byte of a data file is flipped, exits 2 naming the checksum,
// while `--resume` of the previous checkpoint still works.
TEST_F(CliRunTest, CheckpointsSaveResumeAndVerify) {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string base = "train --config " + dir_ + "/tiny.json --data " + dir_ +
                           "/good.bin --set checkpoint.interval=3 --set 'checkpoint.dir=\"" + ckpt +
                           "\"'";
  std::string err;
  ASSERT_EQ(run(base + " --steps 6 --run-dir " + dir_ + "/whole", &err), 0) << err;
  const std::vector<double> whole = losses(dir_ + "/whole");
  ASSERT_EQ(run("launch -n 2 -- " + base +
                    " --steps 3 --set parallelism.tensor=2 --set "
                    "zero_optimization.stage=1 --run-dir " +
                    dir_ + "/split",
                &err),
            0)
      << err;
  ASSERT_EQ(run(base + " --steps 6 --resume auto --run-dir " + dir_ + "/split", &err), 0) << err;
  const std::vector<double> split = losses(dir_ + "/split");  // appended after the resume
  ASSERT_EQ(split.size(), 6u);
  for (size_t s = 0; s < 6; ++s) EXPECT_NEAR(split[s], whole[s], 1e-5 * whole[s]) << s;
  EXPECT_EQ(run("ckpt verify " + ckpt, &err), 0) << err;
  ASSERT_EQ(run("ckpt info " + ckpt + "/step_00000003", &err), 0) << err;
  std::ifstream info(dir_ + "/stdout.txt");
  std::stringstream text;
  text << info.rdbuf();
  EXPECT_NE(text.str().find("saved from: dp 1 x tp 2"), std::string::npos) << text.str();
  {  // One byte of step 6's data, flipped.
    std::fstream f(ckpt + "/step_00000006/rank_00000.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
  }
  EXPECT_EQ(run("ckpt verify " + ckpt, &err), 2);
  EXPECT_NE(err.find("fails its checksum"), std::string::npos) << err;
  EXPECT_EQ(run(base + " --steps 7 --resume auto --run-dir " + dir_ + "/bad", &err), 2);
  EXPECT_NE(err.find("fails its checksum"), std::string::npos) << err;
  EXPECT_EQ(
      run(base + " --steps 4 --resume " + ckpt + "/step_00000003 --run-dir " + dir_ + "/again",
          &err),
      0)
      << err;
}

// A rank killed (SIGKILL) mid-save or mid-reduction ends the job, and nothing half-written is
// ever named by `latest`: the previous checkpoint stays latest and a resume from it continues
// with the uninterrupted run's losses.
TEST_F(CliRunTest, AKilledRankLeavesThePreviousCheckpointLatest) {
  const std::string ckpt = dir_ + "/ckpt";
  const std::string base = "train --config " + dir_ + "/tiny.json --data " + dir_ +
                           "/good.bin --set checkpoint.interval=2 --set 'checkpoint.dir=\"" + ckpt +
                           "\"' --set zero_optimization.stage=1 --steps 6";
  std::string err;
  ASSERT_EQ(run("launch -n 2 -- " + base + " --run-dir " + dir_ + "/whole", &err), 0) << err;
  const std::vector<double> whole = losses(dir_ + "/whole");
  ASSERT_EQ(whole.size(), 6u);
  EXPECT_EQ(run(base + " --fault rank=0,step=1,phase=later --run-dir " + dir_ + "/bad", &err), 2);
  EXPECT_NE(err.find("forward, backward, reduce, optimizer, save"), std::string::npos) << err;
  EXPECT_EQ(
      run(base + " --fault rank=0,step=1,phase=save,action=2 --run-dir " + dir_ + "/bad", &err), 2)
      << "an action and a phase at once";
  for (const char* fault : {"rank=1,step=4,phase=save", "rank=0,step=3,phase=reduce"}) {
    std::filesystem::remove_all(ckpt);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_NE(
        run("launch -n 2 -- " + base + " --fault " + fault + " --run-dir " + dir_ + "/k", &err), 0)
        << fault;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << fault;
    std::ifstream latest(ckpt + "/latest");
    std::string name;
    latest >> name;
    EXPECT_EQ(name, "step_00000002") << fault;
    EXPECT_FALSE(std::filesystem::exists(ckpt + "/step_00000004")) << fault;
    std::filesystem::remove_all(dir_ + "/r");
    ASSERT_EQ(run("launch -n 2 -- " + base + " --resume auto --run-dir " + dir_ + "/r", &err), 0)
        << fault << ": " << err;
    const std::vector<double> resumed = losses(dir_ + "/r");
    ASSERT_EQ(resumed.size(), 4u) << fault;
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_NEAR(resumed[s], whole[s + 2], 1e-5 * whole[s + 2]) << fault << ", step " << s + 3;
    }
  }
}

TEST_F(CliRunTest, SetOverridesAKey) {
  const std::string base = "train --config " + dir_ + "/tiny.json --data " + dir_ + "/good.bin";
  ASSERT_EQ(run(base + " --steps 3 --run-dir " + dir_ + "/a"), 0);
  ASSERT_EQ(run(base + " --steps 3 --set train.seed=8 --run-dir " + dir_ + "/b"), 0);
  EXPECT_NE(losses(dir_ + "/a"), losses(dir_ + "/b"));
}

struct BadData {
  const char* name;
  std::string bytes;   // file content
  const char* expect;  // substring of the error besides the file name
};

TEST_F(CliRunTest, MalformedDataFilesExitTwoNamingTheFile) {
  std::string header(1024, '\0');
  auto with_header = [&](int32_t magic, int32_t version, int32_t ntok, size_t payload) {
    std::string h = header;
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &version, 4);
    std::memcpy(h.data() + 8, &ntok, 4);
    return h + std::string(payload, '\1');
  };
  const std::vector<BadData> cases = {
      {"empty.bin", "", "empty"},
      {"magic.bin", with_header(12345, 1, 10, 20), "magic"},
      {"version.bin", with_header(20240520, 9, 10, 20), "version"},
      {"truncated.bin", with_header(20240520, 1, 100, 20), "size"},
      {"text.bin", "this is not a token shard at all, just some text\n", "magic"},
  };
  for (const BadData& c : cases) {
    const std::string path = dir_ + "/" + c.name;
    write(path, c.bytes);
    std::string err;
    EXPECT_EQ(run("train --config " + dir_ + "/tiny.json --steps 1 --run-dir " + dir_ +
                      "/r --data " + path,
                  &err),
              2)
        << c.name << ": " << err;
    EXPECT_NE(err.find(c.name), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
  }
  std::string err;
  EXPECT_EQ(
      run("train --config " + dir_ + "/tiny.json --steps 1 --data " + dir_ + "/nope.bin", &err), 2);
  EXPECT_NE(err.find("nope.bin"), std::string::npos) << err;
}

TEST_F(CliRunTest, DataWithTokensOutsideTheVocabExitsTwo) {
  std::string err;
  // The demo corpus is byte-level (vocab 257); gpt2-tiny has 64 tokens.
  std::vector<int32_t> tokens(100, 200);
  data::write_llmc_shard(dir_ + "/wide.bin", tokens, false);
  EXPECT_EQ(
      run("train --config " + dir_ + "/tiny.json --steps 1 --data " + dir_ + "/wide.bin", &err), 2);
  EXPECT_NE(err.find("model.vocab"), std::string::npos) << err;
}

TEST_F(CliRunTest, UsageErrorsExitTwo) {
  std::string err;
  EXPECT_EQ(run("", &err), 2);
  EXPECT_EQ(run("train", &err), 2);  // --config is required
  EXPECT_NE(err.find("--config"), std::string::npos) << err;
  EXPECT_EQ(run("train --config " + dir_ + "/missing.json", &err), 2);
  EXPECT_NE(err.find("missing.json"), std::string::npos) << err;
  EXPECT_EQ(run("frobnicate", &err), 2);
  EXPECT_EQ(run("train --config " + dir_ + "/tiny.json --set nodots", &err), 2);
  EXPECT_NE(err.find("nodots"), std::string::npos) << err;
}

TEST_F(CliRunTest, LaunchOnTwoRanksMatchesOneProcess) {
  // train_batch_size 4 on 2 ranks: micro-batch 2 each, the same global batches as one process.
  const std::string args = "train --config " + dir_ + "/tiny.json --data " + dir_ +
                           "/good.bin --steps 5 --set train_micro_batch_size_per_gpu=2 "
                           "--set gradient_accumulation_steps=1 --run-dir ";
  ASSERT_EQ(run(args + dir_ + "/one --set train_micro_batch_size_per_gpu=4"), 0);
  std::string err;
  ASSERT_EQ(run("launch -n 2 -- " + args + dir_ + "/two", &err), 0) << err;
  auto one = losses(dir_ + "/one"), two = losses(dir_ + "/two");
  ASSERT_EQ(two.size(), 5u);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << i;
}

// Tensor and pipeline parallelism through the CLI: tp 2 × pp 2 on 4 ranks (sequence parallel,
// 1F1B over 2 micro-batches, ZeRO stage 1) gives one process's losses, and metrics.jsonl carries
// the tensor-parallel time and bytes.
TEST_F(CliRunTest, TensorAndPipelineParallelTrainingMatchesOneProcess) {
  const std::string args = "train --config " + dir_ + "/tiny.json --data " + dir_ +
                           "/good.bin --steps 5 --set model.layers=2 --run-dir ";
  ASSERT_EQ(run(args + dir_ + "/one"), 0);
  std::string err;
  ASSERT_EQ(run("launch -n 4 -- " + args + dir_ +
                    "/grid --set parallelism.tensor=2 --set parallelism.pipeline=2 "
                    "--set parallelism.sequence_parallel=true --set zero_optimization.stage=1 "
                    "--trace-steps 2:3",
                &err),
            0)
      << err;
  auto one = losses(dir_ + "/one"), grid = losses(dir_ + "/grid");
  ASSERT_EQ(grid.size(), 5u);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(grid[i], one[i], 1e-5 * one[i]) << i;
  std::ifstream in(dir_ + "/grid/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  ASSERT_TRUE(j.contains("tp_bytes") && j.contains("tp_comm_s")) << line;
  EXPECT_GT(j["tp_bytes"].get<uint64_t>(), 0u) << line;
  // --trace-steps 2:3: every rank's actions of both steps in one Chrome trace.
  std::ifstream trace_file(dir_ + "/grid/trace.json");
  ASSERT_TRUE(trace_file.good());
  const auto trace = nlohmann::json::parse(trace_file);
  std::set<int> threads;
  int forwards = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    threads.insert(e["tid"].get<int>());
    forwards += e["name"].get<std::string>().rfind("F", 0) == 0;
  }
  EXPECT_EQ(threads, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(forwards, 4 * 2 * 2) << "4 ranks x 2 micro-batches x 2 steps";
}

// A stage failing mid-schedule (an injected fault before one of its actions) ends the whole job
// within seconds, naming the rank, whichever stage fails: its peers, waiting for its messages,
// are taken down with it (MPI_Abort), never left hanging. Bounded by `timeout`.
TEST_F(CliRunTest, PipelineStageFailingMidScheduleAbortsTheJob) {
  for (int rank : {0, 1}) {
    const std::string cmd = "timeout 120 '" + std::string(STRATA_BINARY) +
                            "' launch -n 2 -- train --config " + dir_ + "/tiny.json --data " +
                            dir_ + "/good.bin --steps 4 --set model.layers=2 " +
                            "--set parallelism.pipeline=2 --set parallelism.timeout_s=30 " +
                            "--fault rank=" + std::to_string(rank) + ",step=2,action=3 " +
                            "--run-dir " + dir_ + "/fault >'" + dir_ + "/fault.txt' 2>&1";
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_NE(WEXITSTATUS(status), 0);
    EXPECT_NE(WEXITSTATUS(status), 124) << "the job hung until timeout killed it";
    EXPECT_LT(seconds, 60.0);
    std::ifstream in(dir_ + "/fault.txt");
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("strata: rank " + std::to_string(rank) + " on"), std::string::npos)
        << text.str();
    EXPECT_NE(text.str().find("injected fault at step 2"), std::string::npos) << text.str();
  }
}

// The seed config (ZeRO stage 3, overlap_comm, bf16 communication, 16 micro-batches) on 4
// ranks, as the README's demo runs it: the loss falls, and the start-up prediction of model-state
// memory equals what the first step measured.
TEST_F(CliRunTest, SeedConfigTrainsOnFourRanksWithZeroStage3) {
  std::string err;
  ASSERT_EQ(run("launch -n 4 -- train --config " + std::string(STRATA_SOURCE_DIR) +
                    "/configs/seed_ds_config.json --steps 12 --set steps_per_print=1 --run-dir " +
                    dir_ + "/seed",
                &err),
            0)
      << err;
  const std::vector<double> l = losses(dir_ + "/seed");
  ASSERT_EQ(l.size(), 12u);
  EXPECT_LT(l.back(), 0.8 * l.front());
  std::ifstream in(dir_ + "/stdout.txt");
  std::stringstream text;
  text << in.rdbuf();
  const std::string out = text.str();
  EXPECT_NE(out.find("dp 4"), std::string::npos) << out;
  EXPECT_EQ(out.find("zero_optimization.stage=3"), std::string::npos) << "stage 3 is in effect";
  // "memory (predicted): model states X per rank (params A, master_params B, grads C, ...)"
  // and "memory (measured, step 1): params A, master_params B, grads C, optimizer_state D, ..."
  const auto field = [&](const std::string& line_start, const std::string& name) {
    const size_t at = out.find(line_start);
    EXPECT_NE(at, std::string::npos) << out;
    const size_t k = out.find(name + " ", at);
    return out.substr(k, out.find_first_of(",)", k) - k);
  };
  for (const char* c : {"params", "master_params", "grads", "optimizer_state"}) {
    EXPECT_EQ(field("memory (predicted)", c), field("memory (measured, step 1)", c)) << c;
  }
  // Its activation_checkpointing block is in effect: every block fully recomputed, the
  // checkpoints in host memory; only partition_activations (tp 1) is noted.
  EXPECT_NE(out.find("host_checkpoints ", out.find("memory (measured, step 1)")), std::string::npos)
      << out;
  EXPECT_EQ(out.find("activation_checkpointing.cpu_checkpointing"), std::string::npos) << out;
  EXPECT_NE(out.find("activation_checkpointing.partition_activations has no effect"),
            std::string::npos)
      << out;
  std::ifstream metrics(dir_ + "/seed/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  EXPECT_GT(nlohmann::json::parse(line).at("recompute_s").get<double>(), 0.0) << line;
}

TEST_F(CliRunTest, PlainMpirunWorksToo) {
  const std::string cmd =
      "mpirun --oversubscribe --bind-to none --allow-run-as-root -np 2 -x "
      "OMP_NUM_THREADS=1 '" +
      std::string(STRATA_BINARY) + "' train --config " + dir_ + "/tiny.json --data " + dir_ +
      "/good.bin --steps 3 --run-dir " + dir_ +
      "/mpi --set train_micro_batch_size_per_gpu=2 --set "
      "gradient_accumulation_steps=1 >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  EXPECT_EQ(losses(dir_ + "/mpi").size(), 3u);  // rank 0 alone writes metrics
}

TEST_F(CliRunTest, LaunchWithAHostfile) {
  write(dir_ + "/hosts", "# one host\nlocalhost slots=2\n");
  std::string err;
  ASSERT_EQ(run("launch -n 2 --hostfile " + dir_ + "/hosts -- train --config " + dir_ +
                    "/tiny.json --data " + dir_ + "/good.bin --steps 2 --run-dir " + dir_ +
                    "/h --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=1",
                &err),
            0)
      << err;
  EXPECT_EQ(losses(dir_ + "/h").size(), 2u);
}

TEST_F(CliRunTest, TopologyRefusesTensorGroupsAcrossHosts) {
  write(dir_ + "/tp4.json",
        R"({"train_micro_batch_size_per_gpu": 1, "model": {"preset": "gpt2-tiny"},
            "parallelism": {"tensor": 4}})");
  write(dir_ + "/two_hosts", "a slots=2\nb slots=2\n");
  write(dir_ + "/four_slots", "a slots=4\nb slots=4\n");
  std::string err;
  EXPECT_EQ(
      run("topology --config " + dir_ + "/tp4.json -n 4 --hostfile " + dir_ + "/two_hosts", &err),
      2);
  EXPECT_NE(err.find("spans hosts"), std::string::npos) << err;
  EXPECT_EQ(
      run("topology --config " + dir_ + "/tp4.json -n 8 --hostfile " + dir_ + "/four_slots", &err),
      0)
      << err;
}

TEST_F(CliRunTest, AFailureOnOneRankAbortsTheWholeJob) {
  // Only rank 0 writes metrics: a run directory it cannot create fails rank 0 alone, while rank
  // 1 is already waiting in the first step's collectives. The job must end, not hang.
  write(dir_ + "/plainfile", "x");
  std::string err;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run("launch -n 2 -- train --config " + dir_ + "/tiny.json --data " + dir_ +
                    "/good.bin --steps 3 --set train_micro_batch_size_per_gpu=2 --set "
                    "gradient_accumulation_steps=1 --run-dir " +
                    dir_ + "/plainfile/run",
                &err),
            2)
      << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_NE(err.find("rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("plainfile"), std::string::npos) << err;
}

TEST_F(CliRunTest, LaunchReturnsTheJobsExitCode) {
  std::string err;
  EXPECT_EQ(run("launch -n 2 -- train --config " + dir_ + "/missing.json", &err), 2) << err;
  EXPECT_NE(err.find("missing.json"), std::string::npos) << err;
  EXPECT_NE(err.find("rank"), std::string::npos) << err;
  EXPECT_EQ(run("launch -n 2", &err), 2);  // nothing to launch
}

// More ranks than CPUs: launch pins them to the CPUs round robin, so that consecutive ranks (a
// tensor-, context- or data-parallel group, which run at the same time) sit on different CPUs;
// with no more ranks than CPUs it leaves placement to the scheduler. OpenMPI reports the bindings.
TEST_F(CliRunTest, LaunchPinsRanksRoundRobinWhenTheyOutnumberTheCpus) {
  const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  if (cpus + 1 > 8) GTEST_SKIP() << cpus << " CPUs: more ranks than this test should start";
  write(dir_ + "/any.json",
        R"({"train_micro_batch_size_per_gpu": 1, "model": {"preset": "gpt2-tiny"}})");
  auto bindings = [&](int n) {
    setenv("OMPI_MCA_hwloc_base_report_bindings", "1", 1);
    std::string err;
    const int rc = run("launch -n " + std::to_string(n) + " -- topology --config " + dir_ +
                           "/any.json -n " + std::to_string(n),
                       &err);
    unsetenv("OMPI_MCA_hwloc_base_report_bindings");
    EXPECT_EQ(rc, 0) << err;
    std::map<int, std::string> mask;  // rank: its CPU mask, "" where not bound
    const std::regex line(R"(MCW rank ([0-9]+) (bound to|is not bound)[^\n]*?(\[[^\n]*\])?\n)");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator();
         ++it) {
      mask[std::stoi((*it)[1])] = (*it)[2] == "bound to" ? std::string((*it)[3]) : "";
    }
    EXPECT_EQ(mask.size(), size_t(n)) << err;
    return mask;
  };
  std::map<int, std::string> mask = bindings(cpus + 1);
  for (const auto& [rank, m] : mask) EXPECT_FALSE(m.empty()) << "rank " << rank << " not bound";
  if (cpus >= 2) {
    EXPECT_NE(mask[0], mask[1]);
  }
  EXPECT_EQ(mask[0], mask[cpus]);  // round robin: rank `cpus` is back on rank 0's CPU
  if (cpus >= 2) {
    mask = bindings(2);
    for (const auto& [rank, m] : mask) EXPECT_TRUE(m.empty()) << "rank " << rank << " bound: " << m;
  }
}

TEST_F(CliRunTest, TopologyPrintsTheGrid) {
  write(dir_ + "/grid.json",
        R"({"train_micro_batch_size_per_gpu": 1, "model": {"preset": "gpt2-tiny"},
            "parallelism": {"tensor": 2, "pipeline": 2}})");
  ASSERT_EQ(run("topology --config " + dir_ + "/grid.json -n 8"), 0);
  std::ifstream in(dir_ + "/stdout.txt");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("dp"), std::string::npos) << text.str();
  std::string err;
  EXPECT_EQ(run("topology --config " + dir_ + "/grid.json -n 6", &err), 2);  // 6 % (2·2) != 0
}

// topology makes the checks train makes once the data-parallel size is known: here sequence
// parallelism over a micro batch that only train_batch_size gives (dp = 2/2 = 1).
TEST_F(CliRunTest, TopologyChecksTheResolvedBatch) {
  write(dir_ + "/sp.json",
        R"({"train_batch_size": 3, "model": {"preset": "gpt2-tiny", "seq_len": 5},
            "parallelism": {"tensor": 2, "sequence_parallel": true}})");
  std::string err;
  EXPECT_EQ(run("topology --config " + dir_ + "/sp.json -n 2", &err), 2);
  EXPECT_NE(err.find("train_micro_batch_size_per_gpu=3 x model.seq_len=5 = 15 token rows is not "
                     "divisible by parallelism.tensor=2"),
            std::string::npos)
      << err;
  EXPECT_EQ(run("topology --config " + dir_ + "/sp.json -n 2 --set train_batch_size=4", &err), 0)
      << err;
}

TEST_F(CliRunTest, DataPrepareThenTrain) {
  std::filesystem::create_directories(dir_ + "/texts");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  write(dir_ + "/texts/a.txt", text);
  write(dir_ + "/texts/b.txt", text + "again");
  ASSERT_EQ(run("data prepare --input " + dir_ + "/texts --output " + dir_ + "/corpus"), 0);
  ASSERT_EQ(run("data inspect " + dir_ + "/corpus_train.bin"), 0);
  write(dir_ + "/demo.json",
        R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 0,
            "model": {"preset": "demo", "layers": 1, "seq_len": 32}})");
  ASSERT_EQ(run("train --config " + dir_ + "/demo.json --steps 2 --run-dir " + dir_ + "/r --data " +
                dir_ + "/corpus_train.bin"),
            0);
  EXPECT_EQ(losses(dir_ + "/r").size(), 2u);
}

}  // namespace
}  // namespace strata
