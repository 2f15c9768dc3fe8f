// The layout never changes the math of instruction fine-tuning (DESIGN.md §1): packed documents
// with a loss mask and document masking (data.document_mask) give, after each step, the
// single-process loss (the mean over the global batch's trained targets, not a mean of
// micro-batch means) within 1e-5, and the same validation loss after training, under data
// parallelism with accumulation, ZeRO-3, tensor parallelism with sequence parallelism, pipeline
// stages, and context parallelism by Ulysses and by ring attention. Runs under mpirun with 2 and 4
// ranks (tests/CMakeLists.txt); each rank computes the single-process reference itself.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/rng.h"
#include "strata/data/loss_mask.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 3, kEvalIters = 2, kGlobalBatch = 8, kVocab = 64;

// Conversations as a fine-tune sees them: documents of 2..24 tokens (some longer than a window of
// 16, cut into pieces), each a prompt (not trained) and an answer (trained).
void write_conversations(const std::string& prefix, int documents, uint64_t seed) {
  const uint64_t key = rng_key(seed, "sft_layouts");
  data::MegatronWriter tokens(prefix, data::TokenType::U16);
  data::LossMaskWriter mask(prefix);
  size_t draw = 0;
  for (int d = 0; d < documents; ++d) {
    const int n = 2 + int(rng_uniform(key, draw++) * 23);
    const int prompt = int(rng_uniform(key, draw++) * float(n));
    std::vector<int32_t> ids(size_t(n), 0);
    std::vector<uint8_t> trained(size_t(n), 0);
    for (int t = 0; t < n; ++t) {
      ids[size_t(t)] = int32_t(rng_uniform(key, draw++) * kVocab) % kVocab;
      trained[size_t(t)] = t >= prompt ? 1 : 0;
    }
    tokens.add_document(ids.data(), n);
    mask.append(trained.data(), n);
  }
  tokens.commit();
  mask.commit();
}

struct Losses {
  std::vector<double> losses;
  std::vector<int64_t> trained;
  double val_loss = 0;
};

class SftLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    train_prefix_ = test::shared_temp_path("strata_sft_train_");
    val_prefix_ = test::shared_temp_path("strata_sft_val_");
    if (world_rank() == 0) {
      write_conversations(train_prefix_, 160, 3);
      write_conversations(val_prefix_, 40, 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    train_ = data::open_dataset(train_prefix_, "megatron");
    val_ = data::open_dataset(val_prefix_, "megatron");
  }
  static void TearDownTestSuite() {
    train_.reset();
    val_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      for (const std::string& p : {train_prefix_, val_prefix_}) {
        for (const char* ext : {".bin", ".idx", ".lossmask"}) std::filesystem::remove(p + ext);
      }
    }
  }

  static nlohmann::json config(const std::string& preset, bool document_mask) {
    return {{"train_batch_size", kGlobalBatch},
            {"steps_per_print", 0},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
            {"data", {{"document_mask", document_mask}}},
            {"model", {{"preset", preset}}}};
  }

  // parallelism null: one process, one micro-batch.
  static Losses run(nlohmann::json j, const nlohmann::json& parallelism, int micro) {
    std::unique_ptr<comm::ProcessGroups> groups;
    int dp = 1;
    if (!parallelism.is_null()) {
      const int tp = parallelism.value("tensor", 1), pp = parallelism.value("pipeline", 1),
                cp = parallelism.value("context", 1);
      j["parallelism"] = parallelism;
      const comm::RankGrid grid(world_size(), tp, pp, "tp-dp-pp", cp);
      groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
      dp = grid.dp();
    }
    j["train_micro_batch_size_per_gpu"] = kGlobalBatch / (dp * micro);
    j["gradient_accumulation_steps"] = micro;
    Config cfg = parse_config(j);
    resolve_batch(cfg, dp);
    Engine engine(cfg, train_.get(), groups ? &groups->dp_cp() : nullptr,
                  groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                  groups ? &groups->cp() : nullptr);
    engine.set_validation(*val_);
    Losses r;
    for (int i = 0; i < kSteps; ++i) {
      const StepMetrics s = engine.train_batch();
      r.losses.push_back(s.loss);
      r.trained.push_back(s.trained_tokens);
    }
    r.val_loss = engine.evaluate(kEvalIters);
    return r;
  }

  static std::string train_prefix_, val_prefix_;
  static std::unique_ptr<data::TokenDataset> train_, val_;
};

std::string SftLayouts::train_prefix_, SftLayouts::val_prefix_;
std::unique_ptr<data::TokenDataset> SftLayouts::train_, SftLayouts::val_;

TEST_F(SftLayouts, EveryLayoutGivesTheSingleProcessLosses) {
  const int world = world_size();
  struct Layout {
    nlohmann::json parallelism, zero;
    int micro;
    bool learned_positions = false;  // also for GPT-2's position table (a covering subset)
  };
  const nlohmann::json zero3 = {{"stage", 3}, {"stage3_param_persistence_threshold", 0}};
  std::vector<Layout> layouts = {
      {{{"tensor", 1}}, {{"stage", 0}}, 2, true},  // dp = world, with accumulation
      {{{"tensor", 1}}, zero3, 2},
      {{{"tensor", 2}, {"sequence_parallel", true}}, {{"stage", 1}}, 2, true},
      {{{"pipeline", 2}, {"schedule", "1f1b"}}, {{"stage", 0}}, 4},
      {{{"context", 2}, {"context_impl", "ulysses"}}, {{"stage", 0}}, 2},
      {{{"context", 2}, {"context_impl", "ring"}}, {{"stage", 1}}, 1, true},
  };
  if (world == 4) {
    layouts.push_back({{{"tensor", 2}, {"sequence_parallel", true}}, zero3, 2});  // tp 2 x dp 2
    layouts.push_back(
        {{{"pipeline", 2}, {"context", 2}, {"context_impl", "ring"}}, {{"stage", 0}}, 2});
  }
  for (const char* preset : {"llama-tiny", "gpt2-tiny"}) {
    const Losses ref = run(config(preset, true), nullptr, 1);
    // The loss counts trained targets only: prompts, padding and document boundaries are out.
    for (int64_t t : ref.trained) {
      EXPECT_GT(t, 0);
      EXPECT_LT(t, int64_t(kGlobalBatch) * 16);
    }
    // Document masking changes the math (documents would otherwise see each other).
    const Losses unmasked = run(config(preset, false), nullptr, 1);
    EXPECT_GT(std::abs(unmasked.losses[0] - ref.losses[0]), 1e-4) << preset;
    for (const Layout& l : layouts) {
      if (std::string(preset) == "gpt2-tiny" && !l.learned_positions) continue;
      auto j = config(preset, true);
      j["zero_optimization"] = l.zero;
      const Losses got = run(j, l.parallelism, l.micro);
      const std::string what = std::string(preset) + " world " + std::to_string(world) + " " +
                               l.parallelism.dump() + " " + l.zero.dump() + " micro " +
                               std::to_string(l.micro);
      for (int i = 0; i < kSteps; ++i) {
        EXPECT_NEAR(got.losses[size_t(i)], ref.losses[size_t(i)], 1e-5 * ref.losses[size_t(i)])
            << what << " step " << i + 1;
        EXPECT_EQ(got.trained[size_t(i)], ref.trained[size_t(i)]) << what;
      }
      EXPECT_NEAR(got.val_loss, ref.val_loss, 1e-5 * ref.val_loss) << what;
    }
  }
}

}  // namespace
}  // namespace strata
