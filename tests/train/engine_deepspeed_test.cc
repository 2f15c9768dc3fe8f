// DeepSpeed's semantics in the engine: the LR schedule steps as DeepSpeed's engine steps it (the
// lr of applied optimizer step k is the schedule's value at iteration k - 2, and a step skipped
// for an fp16 overflow does not advance it), with the scheduler defaults DeepSpeed's constructors
// have; fp16 dynamic scaling stops with an Error at its minimum scale; a static fp16.loss_scale
// given at resume wins over the checkpoint's dynamic one.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"

namespace strata {
namespace {

class EngineDeepSpeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_engine_ds_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    const uint64_t key = rng_key(3, "engine_deepspeed_test");
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng_uniform(key, i) * 64) % 64;
    const std::string path = (dir_ / "train.bin").string();
    data::write_llmc_shard(path, tokens, false);
    dataset_ = data::open_dataset(path, "auto");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static nlohmann::json base() {
    return {{"train_batch_size", 4},
            {"train_micro_batch_size_per_gpu", 4},
            {"steps_per_print", 0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}}}}},
            {"scheduler",
             {{"type", "WarmupLR"},
              {"params",
               {{"warmup_min_lr", 1e-4},
                {"warmup_max_lr", 1e-3},
                {"warmup_num_steps", 4},
                {"warmup_type", "linear"}}}}},
            {"model", {{"preset", "gpt2-tiny"}}}};
  }

  std::filesystem::path dir_;
  std::unique_ptr<data::TokenDataset> dataset_;
};

// WarmupLR, linear, W = 4, 1e-4 -> 1e-3, by hand: iteration -1 and 0 give warmup_min_lr, then
// 1e-4 + 9e-4 * it / 4.
const double kWarmupLinear[] = {1e-4, 1e-4, 3.25e-4, 5.5e-4, 7.75e-4, 1e-3, 1e-3};

TEST_F(EngineDeepSpeedTest, AppliedStepKRunsAtIterationKMinus2) {
  Config cfg = parse_config(base());
  resolve_batch(cfg, 1);
  Engine engine(cfg, dataset_.get());
  for (double want : kWarmupLinear) {
    const StepMetrics s = engine.train_batch();
    EXPECT_NEAR(s.lr, want, 1e-9) << "step " << s.step;
  }
}

TEST_F(EngineDeepSpeedTest, SkippedStepsDoNotAdvanceTheSchedule) {
  nlohmann::json j = base();
  // 2^30 overflows fp16 gradients at first; hysteresis 1 halves the scale on each overflow.
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 30}, {"hysteresis", 1}};
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  Engine engine(cfg, dataset_.get());
  int skipped = 0;
  std::vector<double> applied;
  while (applied.size() < std::size(kWarmupLinear)) {
    const StepMetrics s = engine.train_batch();
    ASSERT_LT(s.step, 60) << "the scale never came down";
    if (s.skipped) {
      ++skipped;
      EXPECT_NEAR(s.lr, applied.empty() ? 1e-4 : kWarmupLinear[applied.size()], 1e-9);
      continue;
    }
    applied.push_back(s.lr);
  }
  EXPECT_GT(skipped, 0);
  for (size_t k = 0; k < applied.size(); ++k) {
    EXPECT_NEAR(applied[k], kWarmupLinear[k], 1e-9) << "applied step " << k + 1;
  }
}

TEST_F(EngineDeepSpeedTest, AnOverflowAtTheMinimumLossScaleStopsTheRun) {
  nlohmann::json j = base();
  // 2^40 overflows the fp16 gradients; the first step halves it to the minimum 2^39, where the
  // second overflows again.
  j["fp16"] = {{"enabled", true},
               {"initial_scale_power", 40},
               {"hysteresis", 1},
               {"min_loss_scale", int64_t(1) << 39}};
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  Engine engine(cfg, dataset_.get());
  const StepMetrics first = engine.train_batch();
  EXPECT_TRUE(first.skipped);
  EXPECT_FLOAT_EQ(first.loss_scale, 0x1p40f);
  std::string error;
  try {
    engine.train_batch();
  } catch (const InputError& e) {
    error = std::string("(an InputError) ") + e.what();
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("already at its minimum"), std::string::npos) << error;
  EXPECT_EQ(error.find("InputError"), std::string::npos) << error;
}

TEST_F(EngineDeepSpeedTest, AStaticLossScaleAtResumeWinsOverTheSavedDynamicOne) {
  nlohmann::json j = base();
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 2}};
  const std::string root = (dir_ / "ckpt").string();
  float saved = 0;
  {
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine first(cfg, dataset_.get());
    for (int i = 0; i < 3; ++i) first.train_batch();
    first.save_checkpoint(root);
    saved = first.train_batch().loss_scale;
  }
  ASSERT_NE(saved, 128.0f);
  j["fp16"]["loss_scale"] = 128;
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  Engine second(cfg, dataset_.get());
  const Engine::Resumed r = second.load_checkpoint(root);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("fp16.loss_scale=128 is static"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[0].find("(dynamic)"), std::string::npos) << r.notes[0];
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(second.train_batch().loss_scale, 128.0f);
}

TEST_F(EngineDeepSpeedTest, ADynamicLossScaleAtResumeContinuesTheSavedOne) {
  nlohmann::json j = base();
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 2}};
  const std::string root = (dir_ / "ckpt").string();
  float next = 0;
  {
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine first(cfg, dataset_.get());
    for (int i = 0; i < 3; ++i) first.train_batch();
    first.save_checkpoint(root);
    next = first.train_batch().loss_scale;
  }
  Config cfg = parse_config(j);
  resolve_batch(cfg, 1);
  Engine second(cfg, dataset_.get());
  EXPECT_TRUE(second.load_checkpoint(root).notes.empty());
  EXPECT_FLOAT_EQ(second.train_batch().loss_scale, next);
  EXPECT_NE(next, 4096.0f);
}

TEST(SchedulerDefaults, WarmupDecayLrMaxLrIsDeepSpeeds0_001NotTheOptimizersLr) {
  // WarmupDecayLR's constructor has warmup_max_lr = 0.001; only WarmupLR's None means the
  // optimizer's lr.
  const nlohmann::json opt = {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}};
  Config d = parse_config(
      {{"train_micro_batch_size_per_gpu", 1},
       {"optimizer", opt},
       {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 5000}}}}}});
  EXPECT_FLOAT_EQ(d.scheduler.warmup_max_lr, 1e-3f);
  Config w = parse_config({{"train_micro_batch_size_per_gpu", 1},
                           {"optimizer", opt},
                           {"scheduler", {{"type", "WarmupLR"}}}});
  EXPECT_FLOAT_EQ(w.scheduler.warmup_max_lr, 3e-4f);
}

}  // namespace
}  // namespace strata
