// The training step: determinism, gradient accumulation, clipping and fp16 overflow skipping.
#include "strata/train/engine.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "tests/device_host.h"

namespace strata {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_engine_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    // A learnable stream: mostly a repeating pattern with some noise.
    const uint64_t key = rng_key(7, "engine_test");
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng_uniform(key, i) < 0.2f ? int32_t(rng_uniform(key, i + (1u << 20)) * 64) % 64
                                             : int32_t(i % 13);
    }
    const std::string path = (dir_ / "train.bin").string();
    data::write_llmc_shard(path, tokens, false);
    dataset_ = data::open_dataset(path, "auto");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<StepMetrics> run(nlohmann::json j, int steps) {
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine engine(cfg, dataset_.get());
    std::vector<StepMetrics> out;
    for (int i = 0; i < steps; ++i) out.push_back(engine.train_batch());
    return out;
  }

  static nlohmann::json base(const std::string& preset = "gpt2-tiny") {
    return {{"train_batch_size", 8},
            {"train_micro_batch_size_per_gpu", 8},
            {"steps_per_print", 0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
            {"model", {{"preset", preset}}}};
  }

  std::filesystem::path dir_;
  std::unique_ptr<data::TokenDataset> dataset_;
};

TEST_F(EngineTest, SameConfigTwiceIsBitIdentical) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    auto a = run(base(preset), 5);
    auto b = run(base(preset), 5);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << preset << " step " << i;
      EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << preset << " step " << i;
    }
  }
}

TEST_F(EngineTest, LossFalls) {
  auto s = run(base(), 30);
  EXPECT_LT(s.back().loss, 0.8 * s.front().loss);
}

TEST_F(EngineTest, GradientAccumulationMatchesOneBigBatch) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    auto one = run(base(preset), 6);
    for (int gas : {2, 4, 8}) {
      auto j = base(preset);
      j["train_micro_batch_size_per_gpu"] = 8 / gas;
      j["gradient_accumulation_steps"] = gas;
      auto acc = run(j, 6);
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_NEAR(acc[i].loss, one[i].loss, 1e-5 * one[i].loss)
            << preset << " gas " << gas << " step " << i;
      }
    }
  }
}

TEST_F(EngineTest, ClippingBoundsTheUpdate) {
  auto j = base();
  j["gradient_clipping"] = 1e-3;
  auto clipped = run(j, 3);
  j["gradient_clipping"] = 0.0;
  auto free = run(j, 3);
  EXPECT_EQ(clipped[0].loss, free[0].loss);  // same start
  EXPECT_GT(clipped[0].grad_norm, 1e-3);     // the norm is reported before clipping
  EXPECT_NE(clipped[2].loss, free[2].loss);  // clipping changed the trajectory
}

TEST_F(EngineTest, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  auto j = base();
  // 2^40 overflows fp16 gradients at once; hysteresis 1 halves the scale on each overflow.
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 40}, {"hysteresis", 1}};
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  cfg.grad_accum_dtype = DType::F16;
  Engine engine(cfg, dataset_.get());
  const std::vector<float> before =
      test::device_f32(engine.params(), DType::F16, engine.spec().numel);
  StepMetrics s = engine.train_batch();
  EXPECT_TRUE(s.skipped);
  const std::vector<float> after =
      test::device_f32(engine.params(), DType::F16, engine.spec().numel);
  EXPECT_EQ(before, after) << "a skipped step must not touch the parameters";
  int skipped = 1;
  while (engine.train_batch().skipped) ++skipped;
  EXPECT_GT(skipped, 5);  // halves from 2^40 until the gradients fit fp16
  EXPECT_LT(engine.train_batch().loss_scale, 1e10f);
}

TEST_F(EngineTest, Bf16TrainsCloseToFp32) {
  auto f = run(base(), 10);
  auto j = base();
  j["bf16"] = {{"enabled", true}};
  auto b = run(j, 10);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(b[i].loss, f[i].loss, 0.05 * f[i].loss);
}

TEST_F(EngineTest, MemoryIsAccountedPerCategory) {
  auto j = base();
  j["bf16"] = {{"enabled", true}};
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  Engine engine(cfg, dataset_.get());
  StepMetrics s = engine.train_batch();
  const size_t n = size_t(engine.spec().numel);
  // bf16 parameters, fp32 gradients (grad_accum_dtype default), fp32 master and two moments.
  EXPECT_EQ(s.peak_bytes[size_t(MemCategory::Params)], 2 * n);
  EXPECT_EQ(s.peak_bytes[size_t(MemCategory::Grads)], 4 * n);
  EXPECT_EQ(s.peak_bytes[size_t(MemCategory::MasterParams)], 4 * n);
  EXPECT_EQ(s.peak_bytes[size_t(MemCategory::OptimizerState)], 8 * n);
  EXPECT_GT(s.peak_bytes[size_t(MemCategory::Activations)], 0u);
}

}  // namespace
}  // namespace strata
