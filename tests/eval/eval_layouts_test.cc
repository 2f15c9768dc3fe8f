// The layout never changes the validation loss (DESIGN.md §1): after the same training steps,
// Engine::evaluate gives the single-process val_loss (within 1e-5) under data parallelism, ZeRO
// stage 3's gathers (under pipelines too), tensor (and sequence) parallelism and pipeline stages
// (plain and interleaved), alone and composed. Runs under mpirun with 2 and 4 ranks
// (tests/CMakeLists.txt); each rank computes the single-process reference itself, without
// communication.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 3, kEvalIters = 3, kGlobalBatch = 16;

class EvalLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    train_path_ = test::shared_temp_path("strata_eval_train_", ".bin");
    val_path_ = test::shared_temp_path("strata_eval_val_", ".bin");
    if (world_rank() == 0) {
      const uint64_t key = rng_key(11, "eval_test");
      for (const auto& [path, n, a] :
           {std::tuple{train_path_, 30000, 7}, std::tuple{val_path_, 3000, 5}}) {
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = rng_uniform(key, i + size_t(a) * (1u << 24)) < 0.3f
                          ? int32_t(rng_uniform(key, i + (1u << 30)) * 64) % 64
                          : int32_t((i * size_t(a)) % 61);
        }
        data::write_llmc_shard(path, tokens, false);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    train_ = data::open_dataset(train_path_, "llmc");
    val_ = data::open_dataset(val_path_, "llmc");
  }
  static void TearDownTestSuite() {
    train_.reset();
    val_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::filesystem::remove(train_path_);
      std::filesystem::remove(val_path_);
    }
  }

  static nlohmann::json config(const std::string& preset) {
    return {{"train_batch_size", kGlobalBatch},
            {"steps_per_print", 0},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
            {"model", {{"preset", preset}, {"layers", 4}}}};
  }

  // val_loss after kSteps steps; parallelism null: one process.
  static double val_loss(nlohmann::json j, const nlohmann::json& parallelism, int micro) {
    std::unique_ptr<comm::ProcessGroups> groups;
    int dp = 1;
    if (!parallelism.is_null()) {
      const int tp = parallelism.value("tensor", 1), pp = parallelism.value("pipeline", 1);
      j["parallelism"] = parallelism;
      const comm::RankGrid grid(world_size(), tp, pp);
      groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
      dp = grid.dp();
    }
    j["train_micro_batch_size_per_gpu"] = kGlobalBatch / (dp * micro);
    j["gradient_accumulation_steps"] = micro;
    Config cfg = parse_config(j);
    resolve_batch(cfg, dp);
    Engine engine(cfg, train_.get(), groups ? &groups->dp() : nullptr,
                  groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr);
    engine.set_validation(*val_);
    const double before = engine.evaluate(kEvalIters);
    for (int i = 0; i < kSteps; ++i) engine.train_batch();
    const double after = engine.evaluate(kEvalIters);
    EXPECT_NE(after, before);  // evaluated with the trained parameters
    return after;
  }

  static std::string train_path_, val_path_;
  static std::unique_ptr<data::TokenDataset> train_, val_;
};

std::string EvalLayouts::train_path_, EvalLayouts::val_path_;
std::unique_ptr<data::TokenDataset> EvalLayouts::train_, EvalLayouts::val_;

TEST_F(EvalLayouts, EveryLayoutGivesTheSingleProcessValLoss) {
  const int world = world_size();
  std::vector<std::pair<nlohmann::json, nlohmann::json>> layouts = {
      // parallelism, zero_optimization
      {{{"tensor", 1}}, {{"stage", 0}}},  // dp = world
      {{{"tensor", 1}},
       {{"stage", 3},
        {"stage3_param_persistence_threshold", 0},
        {"stage3_prefetch_bucket_size", 4000}}},
      {{{"tensor", 2}}, {{"stage", 1}}},
      {{{"tensor", 2}, {"sequence_parallel", true}}, {{"stage", 0}}},
      {{{"pipeline", 2}, {"schedule", "1f1b"}}, {{"stage", 0}}},
      {{{"pipeline", 2}, {"schedule", "interleaved"}, {"virtual_stages", 2}}, {{"stage", 2}}},
      // ZeRO-3 under a pipeline: evaluations (each chunk's forward) between the steps' orders.
      {{{"pipeline", 2}, {"schedule", "interleaved"}, {"virtual_stages", 2}},
       {{"stage", 3},
        {"stage3_param_persistence_threshold", 0},
        {"stage3_prefetch_bucket_size", 4000}}},
  };
  if (world == 4) {
    layouts.push_back({{{"tensor", 2}, {"pipeline", 2}}, {{"stage", 1}}});
    layouts.push_back({{{"pipeline", 4}, {"schedule", "gpipe"}}, {{"stage", 0}}});
    layouts.push_back({{{"tensor", 2}},
                       {{"stage", 3}, {"stage3_param_persistence_threshold", 0}}});  // tp 2 x dp 2
    layouts.push_back({{{"pipeline", 2}, {"schedule", "zero_bubble"}},               // dp 2 x pp 2
                       {{"stage", 3},
                        {"stage3_param_persistence_threshold", 0},
                        {"stage3_reshard_after_forward", false}}});
  }
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const double ref = val_loss(config(preset), nullptr, 1);
    for (const auto& [par, zero] : layouts) {
      for (int micro : {2, 4}) {
        auto j = config(preset);
        j["zero_optimization"] = zero;
        const double got = val_loss(j, par, micro);
        EXPECT_NEAR(got, ref, 1e-5 * ref) << preset << " world " << world << " " << par.dump()
                                          << " " << zero.dump() << " micro " << micro;
      }
    }
  }
}

}  // namespace
}  // namespace strata
