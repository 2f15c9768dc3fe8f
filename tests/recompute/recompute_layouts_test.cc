// Activation checkpointing from the config under every layout (DESIGN.md §1): full recompute
// (every block, or some), selective recompute, partitioned and host checkpoints change what a rank
// keeps, never what it computes. With dp × tp (± sequence parallelism) × pp (each schedule) × ZeRO
// 0-3, each policy's losses and gradient norms equal those of the same layout without
// recompute, bit for bit; the checkpoint pool holds exactly the formula's bytes. Runs under mpirun
// with 2, 4 and 8 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/core/rng.h"
#include "strata/cost/predict.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 6;
constexpr int kLayers = 4;

struct Result {
  std::vector<double> loss, norm;
  size_t activations = 0, device_checkpoints = 0, host_checkpoints = 0;
  double recompute_s = 0;
  std::vector<double> recompute_block_s;
};

class RecomputeLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = test::shared_token_file("strata_rc_", 20000, 11, "recompute_layouts", 64);
    dataset_ = data::open_dataset(path_, "llmc");
  }
  static void TearDownTestSuite() {
    dataset_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove(path_);
  }

  static nlohmann::json config(const std::string& preset, int gbs) {
    return {{"train_batch_size", gbs},
            {"steps_per_print", 0},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
            {"model", {{"preset", preset}, {"layers", kLayers}}}};
  }

  // ac: the activation_checkpointing block (null: none).
  static Result run(nlohmann::json j, const nlohmann::json& parallelism, int micro,
                    const nlohmann::json& ac) {
    j["parallelism"] = parallelism;
    if (!ac.is_null()) j["activation_checkpointing"] = ac;
    const int tp = parallelism.value("tensor", 1), pp = parallelism.value("pipeline", 1);
    const comm::RankGrid grid(world_size(), tp, pp);
    comm::ProcessGroups groups(grid, MPI_COMM_WORLD);
    const int gbs = j["train_batch_size"].get<int>();
    j["train_micro_batch_size_per_gpu"] = gbs / (grid.dp() * micro);
    j["gradient_accumulation_steps"] = micro;
    Config cfg = parse_config(j);
    resolve_batch(cfg, grid.dp());
    Result r;
    const MemoryTracker& mt = MemoryTracker::instance();
    const size_t a0 = mt.current(MemCategory::Activations);
    const size_t d0 = mt.current(MemCategory::CheckpointedActivations);
    const size_t h0 = mt.current(MemCategory::HostCheckpoints);
    Engine engine(cfg, dataset_.get(), &groups.dp(), &groups.tp(), &groups.pp());
    r.activations = mt.current(MemCategory::Activations) - a0;
    r.device_checkpoints = mt.current(MemCategory::CheckpointedActivations) - d0;
    r.host_checkpoints = mt.current(MemCategory::HostCheckpoints) - h0;
    for (int i = 0; i < kSteps; ++i) {
      const StepMetrics m = engine.train_batch();
      r.loss.push_back(m.loss), r.norm.push_back(m.grad_norm);
      r.recompute_s += m.recompute_s;
      if (i == 0)
        r.recompute_block_s.assign(m.recompute_block_s.begin(), m.recompute_block_s.end());
      // The tensor-parallel traffic is the formula's, recompute included.
      if (pp == 1) {
        EXPECT_EQ(m.tp_bytes, cost::predict_tp_bytes(cost::layout_of(cfg), engine.spec()))
            << j.dump();
      }
    }
    return r;
  }

  static std::string path_;
  static std::unique_ptr<data::TokenDataset> dataset_;
};

std::string RecomputeLayouts::path_;
std::unique_ptr<data::TokenDataset> RecomputeLayouts::dataset_;

struct Policy {
  std::string name;
  nlohmann::json block;
  int full_blocks;  // blocks fully recomputed
};

std::vector<Policy> policies() {
  return {{"full", nlohmann::json::object(), kLayers},
          {"full, 2 of 4 (block)",
           {{"number_checkpoints", 2}, {"recompute_method", "block"}, {"profile", true}},
           2},
          {"selective", {{"recompute_granularity", "selective"}}, 0},
          {"full, cpu, partitioned, synchronised",
           {{"partition_activations", true},
            {"cpu_checkpointing", true},
            {"contiguous_memory_optimization", true},
            {"synchronize_checkpoint_boundary", true}},
           kLayers}};
}

void expect_identical(const Result& got, const Result& ref, const std::string& what) {
  EXPECT_EQ(got.loss, ref.loss) << what;
  EXPECT_EQ(got.norm, ref.norm) << what;
}

// pp = 1: dp × tp (± SP) × ZeRO 0-3. The checkpoint pool holds one (B·T, C) input per fully
// recomputed block, this rank's rows under SP, a 1/tp shard when partitioned without SP.
TEST_F(RecomputeLayouts, DataAndTensorParallelLayoutsAreBitIdentical) {
  const int world = world_size();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (int tp : {1, 2}) {
      if (world % tp != 0) continue;
      for (bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (int zero : {0, 3}) {
          const nlohmann::json par = {{"tensor", tp}, {"sequence_parallel", sp}};
          auto j = config(preset, 8 * world / tp);
          j["zero_optimization"] = {{"stage", zero}, {"stage3_param_persistence_threshold", 0}};
          const Result ref = run(j, par, 2, nullptr);
          EXPECT_EQ(ref.device_checkpoints + ref.host_checkpoints, 0u);
          EXPECT_EQ(ref.recompute_s, 0.0);
          const int64_t B = 8 / 2, T = 16, C = 32, N = B * T, Ns = sp ? N / tp : N;
          for (const Policy& p : policies()) {
            const std::string what = std::string(preset) + " tp=" + std::to_string(tp) +
                                     " sp=" + std::to_string(sp) + " zero=" + std::to_string(zero) +
                                     " " + p.name;
            const Result got = run(j, par, 2, p.block);
            expect_identical(got, ref, what);
            const bool cpu = p.block.value("cpu_checkpointing", false);
            const bool part = p.block.value("partition_activations", false) && tp > 1 && !sp;
            const size_t per = size_t(part ? (Ns * C + tp - 1) / tp : Ns * C) * 4;
            EXPECT_EQ(cpu ? got.host_checkpoints : got.device_checkpoints,
                      size_t(p.full_blocks) * per)
                << what;
            EXPECT_EQ(cpu ? got.device_checkpoints : got.host_checkpoints, 0u) << what;
            EXPECT_LT(got.activations, ref.activations) << what;
            EXPECT_GT(got.recompute_s, 0.0) << what;
            if (p.block.value("profile", false)) {
              // Per block: the fully recomputed ones (the first 2) only.
              ASSERT_EQ(got.recompute_block_s.size(), size_t(kLayers)) << what;
              for (int l = 0; l < kLayers; ++l) {
                EXPECT_EQ(got.recompute_block_s[size_t(l)] > 0, l < 2) << what << " block " << l;
              }
            } else {
              EXPECT_TRUE(got.recompute_block_s.empty()) << what;
            }
          }
        }
      }
    }
  }
}

// pp = 2 with every schedule (recompute per micro-batch inside the schedule; zero-bubble
// recomputes again for the deferred weight gradients), ZeRO 1-3, tp 2 beside it on 8 ranks. At
// stage 3 each recompute gathers its block's units again, in the step's gather order (units
// released after each use, or kept for the step without resharding).
TEST_F(RecomputeLayouts, PipelineSchedulesAreBitIdentical) {
  const int world = world_size();
  if (world % 2 != 0) GTEST_SKIP();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zero_bubble"}) {
      const bool interleaved = std::string(schedule) == "interleaved";
      const int tp = world == 8 ? 2 : 1;
      for (int zero : {1, 2, 3}) {
        const nlohmann::json par = {{"pipeline", 2},
                                    {"tensor", tp},
                                    {"sequence_parallel", tp > 1 && zero >= 2},
                                    {"schedule", schedule},
                                    {"virtual_stages", interleaved ? 2 : 1}};
        auto j = config(preset, 4 * world / tp);
        j["zero_optimization"] = {{"stage", zero}};
        if (zero == 3) {
          const bool reshard = std::string(preset) == "gpt2-tiny";
          j["zero_optimization"].update({{"stage3_param_persistence_threshold", 0},
                                         {"stage3_prefetch_bucket_size", 10000},
                                         {"stage3_max_reuse_distance", 0},
                                         {"stage3_reshard_after_forward", reshard}});
        }
        const Result ref = run(j, par, 4, nullptr);
        for (const Policy& p : policies()) {
          const Result got = run(j, par, 4, p.block);
          expect_identical(got, ref,
                           std::string(preset) + " pp=2 tp=" + std::to_string(tp) + " " + schedule +
                               " zero=" + std::to_string(zero) + " " + p.name);
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
