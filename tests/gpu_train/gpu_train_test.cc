// Training on a GPU through the CLI (ctest label `gpu`; every test skips where no CUDA device is
// visible): 20 steps on CUDA against the same run on the CPU (fp32 within 1e-4, bf16 within 1e-2
// relative per step), ZeRO 0-3, tp 2 and pp 2 with 2 ranks sharing one GPU against one rank on
// it (fp32 within 1e-5), a checkpoint saved on the GPU resumed on the CPU and one saved on the
// CPU resumed on the GPU with the losses of the uninterrupted run, and two runs on one GPU with
// bit-identical losses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/device.h"
#include "strata/kernels/ops.h"
#include "tests/cli/fixture.h"

namespace strata {
namespace {

bool gpu_visible() {
  static const bool visible = ops::device_count(Device::CUDA) > 0;
  return visible;
}

class GpuTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_visible()) GTEST_SKIP() << "no CUDA device is visible";
    dir_ = make_cli_dir("strata_gpu_train");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // A config of the tiny GPT-2 (or Llama) with the given extra top-level JSON members.
  std::string config(const std::string& name, const std::string& extra,
                     const std::string& preset = "gpt2-tiny") {
    const std::string path = dir_ + "/" + name + ".json";
    std::ofstream(path) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "steps_per_print": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "model": {"preset": ")" +
                               preset + R"("}, "train": {"seed": 11})"
                        << (extra.empty() ? "" : ", " + extra) << "}";
    return path;
  }

  int run(const std::string& args, std::string* err = nullptr) {
    return run_binary(STRATA_BINARY, dir_, args, err);
  }

  // train with cfg on `device` for `steps` steps (ranks > 1 under `launch`) into run_dir.
  std::vector<double> train(const std::string& cfg, const std::string& device, int steps,
                            const std::string& run_dir, int ranks = 1,
                            const std::string& more = "") {
    std::string err;
    const std::string cmd = "train --config " + cfg + " --data " + dir_ + "/good.bin --device " +
                            device + " --steps " + std::to_string(steps) + " --run-dir " + run_dir +
                            " " + more;
    const int rc = run(ranks > 1 ? "launch -n " + std::to_string(ranks) + " -- " + cmd : cmd, &err);
    EXPECT_EQ(rc, 0) << cmd << "\n" << err;
    return losses(run_dir);
  }

  static std::vector<double> losses(const std::string& run_dir) {
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::vector<double> out;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    return out;
  }

  static void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                           double rel, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    ASSERT_FALSE(want.empty()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - want[i]), rel * std::max(1.0, std::abs(want[i])))
          << what << ": step " << i + 1 << " loss " << got[i] << " vs " << want[i];
    }
  }

  std::string dir_;
};

TEST_F(GpuTrainTest, Fp32TwentyStepsMatchTheCpu) {
  const std::string cfg = config("fp32", "");
  const auto cpu = train(cfg, "cpu", 20, dir_ + "/cpu");
  const auto gpu = train(cfg, "cuda", 20, dir_ + "/gpu");
  expect_close(gpu, cpu, 1e-4, "fp32 cuda vs cpu");
  EXPECT_LT(gpu.back(), gpu.front());
}

TEST_F(GpuTrainTest, Bf16TwentyStepsMatchTheCpu) {
  const std::string cfg = config("bf16", R"("bf16": {"enabled": true})");
  const auto cpu = train(cfg, "cpu", 20, dir_ + "/cpu");
  const auto gpu = train(cfg, "cuda", 20, dir_ + "/gpu");
  expect_close(gpu, cpu, 1e-2, "bf16 cuda vs cpu");
}

TEST_F(GpuTrainTest, LlamaFp32MatchesTheCpu) {
  const std::string cfg = config("llama", "", "llama-tiny");
  const auto cpu = train(cfg, "cpu", 10, dir_ + "/cpu");
  const auto gpu = train(cfg, "cuda", 10, dir_ + "/gpu");
  expect_close(gpu, cpu, 1e-4, "llama fp32 cuda vs cpu");
}

TEST_F(GpuTrainTest, SelectiveAndFullRecomputeMatchNone) {
  const auto none = train(config("none", ""), "cuda", 6, dir_ + "/none");
  const auto sel =
      train(config("sel", R"("activation_checkpointing": {"recompute_granularity": "selective"})"),
            "cuda", 6, dir_ + "/sel");
  const auto full =
      train(config("full", R"("activation_checkpointing": {"recompute_granularity": "full"})"),
            "cuda", 6, dir_ + "/full");
  expect_close(sel, none, 1e-6, "selective recompute");
  expect_close(full, none, 1e-6, "full recompute");
}

TEST_F(GpuTrainTest, SameRunTwiceIsBitIdentical) {
  const std::string cfg = config("twice", R"("bf16": {"enabled": true})");
  const auto a = train(cfg, "cuda", 8, dir_ + "/a");
  const auto b = train(cfg, "cuda", 8, dir_ + "/b");
  EXPECT_EQ(a, b);
}

// Two ranks on the one GPU (the MPI transport staged through host memory where NCCL refuses two
// ranks on a device) give the one-rank losses, for each ZeRO stage, tp 2 and pp 2.
TEST_F(GpuTrainTest, TwoRanksOnOneGpuMatchOneRank) {
  const auto one = train(config("one", ""), "cuda", 6, dir_ + "/one");
  for (const char* stage : {"0", "1", "2", "3"}) {
    const std::string name = std::string("z") + stage;
    const std::string zero =
        std::string(R"("zero_optimization": {"stage": )") + stage + R"(, "overlap_comm": true})";
    expect_close(train(config(name, zero), "cuda", 6, dir_ + "/" + name, 2), one, 1e-5,
                 std::string("ZeRO-") + stage + " dp 2");
  }
  expect_close(train(config("tp", R"("parallelism": {"tensor": 2})"), "cuda", 6, dir_ + "/tp", 2),
               one, 1e-5, "tp 2");
  expect_close(train(config("pp", R"("parallelism": {"pipeline": 2})"), "cuda", 6, dir_ + "/pp", 2),
               one, 1e-5, "pp 2");
}

// A checkpoint moves between devices: saved at step 4 on the GPU and resumed on the CPU to step
// 8, and saved on the CPU and resumed on the GPU, each with the uninterrupted run's losses.
TEST_F(GpuTrainTest, CheckpointsMoveBetweenGpuAndCpu) {
  const std::string ckpt_gpu = dir_ + "/ckpt_gpu", ckpt_cpu = dir_ + "/ckpt_cpu";
  const std::string cfg = config("ck", "");
  const auto whole_gpu = train(cfg, "cuda", 8, dir_ + "/whole_gpu");
  const auto whole_cpu = train(cfg, "cpu", 8, dir_ + "/whole_cpu");
  train(cfg, "cuda", 4, dir_ + "/first_gpu", 1,
        "--set checkpoint.interval=4 --set 'checkpoint.dir=\"" + ckpt_gpu + "\"'");
  const auto rest_cpu = train(cfg, "cpu", 8, dir_ + "/rest_cpu", 1, "--resume " + ckpt_gpu);
  ASSERT_EQ(rest_cpu.size(), 4u);
  expect_close(rest_cpu, {whole_gpu.begin() + 4, whole_gpu.end()}, 1e-4, "gpu -> cpu");
  train(cfg, "cpu", 4, dir_ + "/first_cpu", 1,
        "--set checkpoint.interval=4 --set 'checkpoint.dir=\"" + ckpt_cpu + "\"'");
  const auto rest_gpu = train(cfg, "cuda", 8, dir_ + "/rest_gpu", 1, "--resume " + ckpt_cpu);
  ASSERT_EQ(rest_gpu.size(), 4u);
  expect_close(rest_gpu, {whole_cpu.begin() + 4, whole_cpu.end()}, 1e-4, "cpu -> gpu");
}

// train.device=cuda where no GPU is visible is an input error naming the fix (runs everywhere).
TEST(GpuTrainInput, CudaWithoutAGpuIsAnInputError) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible";
  const std::string dir = make_cli_dir("strata_gpu_input");
  const std::string cfg = dir + "/c.json";
  std::ofstream(cfg) << R"({"train_batch_size": 2, "model": {"preset": "gpt2-tiny"}})";
  const std::string cmd = std::string("'") + STRATA_BINARY + "' train --config " + cfg +
                          " --data " + dir + "/good.bin --device cuda --steps 1 --run-dir " + dir +
                          "/r >/dev/null 2>" + dir + "/err.txt";
  const int status = std::system(cmd.c_str());
  std::ifstream in(dir + "/err.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2) << text.str();
  EXPECT_NE(text.str().find("train.device"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("no CUDA GPU is visible"), std::string::npos) << text.str();
}

// strata bench --device: on a GPU it trains there (the peak is the GPU's); without one it is the
// same input error as train's; a --set train.device that contradicts --device is refused.
TEST(GpuBench, DeviceFlag) {
  const std::string dir = make_cli_dir("strata_gpu_bench");
  const std::string common = "bench --model gpt2-tiny --dtype bf16 -b 2 -t 32 --steps 2 --warmup 1";
  std::string err;
  EXPECT_EQ(
      run_binary(STRATA_BINARY, dir, common + " --device cpu --set 'train.device=\"cuda\"'", &err),
      2);
  EXPECT_NE(err.find("differs from --device cpu"), std::string::npos) << err;
  const int rc = run_binary(STRATA_BINARY, dir, common + " --device cuda", &err);
  std::ifstream in(dir + "/stdout.txt");
  std::stringstream out;
  out << in.rdbuf();
  if (gpu_visible()) {
    EXPECT_EQ(rc, 0) << err;
    EXPECT_NE(out.str().find("on the GPU"), std::string::npos) << out.str();
    EXPECT_NE(out.str().find("bench model=gpt2-tiny dtype=bf16"), std::string::npos) << out.str();
  } else {
    EXPECT_EQ(rc, 2) << err;
    EXPECT_NE(err.find("no CUDA GPU is visible"), std::string::npos) << err;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
