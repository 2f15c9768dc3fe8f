// The planner against the engine, under mpirun: for a spread of the layouts `strata plan` calls
// valid at this world size (data, tensor, context (Ulysses and ring) and pipeline parallelism with
// every schedule, ZeRO 0-3 and MiCS, sequence parallelism, recompute, expert parallelism,
// micro-batch × accumulation), the engine is built and steps once, and every memory category each
// rank allocates equals the planner's prediction for that rank's stage, byte for byte: the model
// states, activations and checkpoints exactly; the communication buffers and workspace at least
// (see below). The layouts the planner refuses are refused by the engine's own checks with the same
// message.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/data/token_dataset.h"
#include "strata/planner/search.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"
#include "tests/tiny_moe.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

class PlannerMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = test::shared_token_file("strata_planner_", 20000, 11, "planner_test", 64);
    dataset_ = data::open_dataset(path_, "llmc");
  }
  static void TearDownTestSuite() {
    dataset_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove(path_);
  }

  static nlohmann::json preset(const std::string& name) {
    return {{"preset", name}, {"layers", 4}};
  }
  static planner::PlanInput input(const nlohmann::json& model, int global_batch) {
    planner::PlanInput in;
    in.base = {{"train_batch_size", global_batch},
               {"steps_per_print", 0},
               {"bf16", {{"enabled", true}}},
               {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
               {"model", model}};
    in.cluster = planner::uniform_cluster(world_size(), world_size());
    in.device.name = "test", in.device.memory_bytes = in.device.host_memory_bytes = 1ull << 40;
    in.device.fp32_flops = 1e11, in.device.memory_bytes_per_s = 1e10;
    in.device.intra_node = in.device.inter_node = {1e-6, 1e9};
    return in;
  }

  // One step of the layout; each category this rank allocated, peak over the step.
  static std::array<size_t, kNumMemCategories> measure(const planner::PlanInput& in,
                                                       const planner::Candidate& c, int* stage) {
    Config cfg = parse_config(planner::candidate_config(in.base, c));
    resolve_batch(cfg, c.dp);
    const comm::RankGrid grid(world_size(), c.tp, c.pp, "tp-dp-pp", c.cp);
    std::unique_ptr<comm::ProcessGroups> groups;
    if (world_size() > 1) groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
    MemoryTracker& mem = MemoryTracker::instance();
    std::array<size_t, kNumMemCategories> before{}, got{};
    for (int k = 0; k < kNumMemCategories; ++k) before[size_t(k)] = mem.current(MemCategory(k));
    Engine engine(cfg, dataset_.get(), groups ? &groups->dp_cp() : nullptr,
                  groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                  groups ? &groups->cp() : nullptr);
    const StepMetrics s = engine.train_batch();
    for (int k = 0; k < kNumMemCategories; ++k) {
      got[size_t(k)] = s.peak_bytes[size_t(k)] - before[size_t(k)];
    }
    *stage = engine.stage();
    return got;
  }

  static std::string path_;
  static std::unique_ptr<data::TokenDataset> dataset_;
};

std::string PlannerMemory::path_;
std::unique_ptr<data::TokenDataset> PlannerMemory::dataset_;

struct PlannerMemoryAccess : PlannerMemory {
  using PlannerMemory::measure;
};

// Every 7th valid layout of the plan (each rank computes the same plan) and the first of each
// parallel degree and schedule not yet seen: 12 or more layouts per preset at 4 ranks.
std::vector<planner::Row> sample(const std::vector<planner::Row>& rows) {
  std::vector<planner::Row> out;
  std::vector<std::string> seen;
  int i = 0;
  for (const planner::Row& r : rows) {
    if (!r.valid()) continue;
    const std::string kind = std::to_string(r.c.tp) + "/" + std::to_string(r.c.pp) + "/" +
                             r.c.schedule + "/" + std::to_string(r.c.zero) + "/" +
                             std::to_string(r.c.sequence_parallel) + "/" + r.c.recompute + "/" +
                             std::to_string(r.c.cp) + r.c.context_impl + "/" +
                             std::to_string(r.c.ep) + (r.c.whole_experts ? "w" : "");
    const bool fresh = std::find(seen.begin(), seen.end(), kind) == seen.end();
    if (fresh) seen.push_back(kind);
    if ((fresh && out.size() < 40) || i++ % 7 == 0) out.push_back(r);
  }
  return out;
}

// The engine's step of row r against the planner's prediction for this rank's stage.
void expect_matches(const planner::PlanInput& in, const planner::Row& r, const std::string& what0) {
  int stage = 0;
  const auto got = PlannerMemoryAccess::measure(in, r.c, &stage);
  const auto& want = r.p.stage_bytes[size_t(stage)];
  for (int k = 0; k < kNumMemCategories; ++k) {
    const std::string what = what0 + " " + planner::describe(r.c) + " stage " +
                             std::to_string(stage) + " " + mem_category_name(MemCategory(k));
    // The communicators' scratch and the CPU kernels' packing buffers grow on demand
    // beyond what the planner counts (the pipeline's buffers, the model's workspace).
    const MemCategory cat = MemCategory(k);
    if (cat == MemCategory::CommBuffers || cat == MemCategory::Workspace) {
      EXPECT_GE(got[size_t(k)], want[size_t(k)]) << what;
    } else {
      EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << what;
    }
  }
}

// A mixture of experts: a gated shared expert, a dense layer.
nlohmann::json moe_model() {
  return test::tiny_qwen2_moe(4, 2);
}

TEST_F(PlannerMemory, EveryCategoryMatchesTheEngine) {
  int checked = 0;
  // GPT-2, Llama, a Gemma 3 block (sandwich norms, q/k norms, a head_dim of its own) and a
  // Qwen2-MoE one.
  const nlohmann::json models[] = {{{"preset", "gpt2-tiny"}, {"layers", 4}},
                                   {{"preset", "llama-tiny"}, {"layers", 4}},
                                   {{"family", "gemma3"},
                                    {"layers", 4},
                                    {"hidden", 32},
                                    {"heads", 4},
                                    {"kv_heads", 2},
                                    {"head_dim", 12},
                                    {"ffn_hidden", 64},
                                    {"vocab", 64},
                                    {"seq_len", 16},
                                    {"sliding_window", 4}},
                                   moe_model()};
  int expert_parallel = 0;  // rows with the experts over ranks (the MoE model's, 2 ranks or more)
  for (const nlohmann::json& model : models) {
    const planner::PlanInput in = input(model, 8);
    const std::vector<planner::Row> rows = sample(planner::plan(in));
    for (const planner::Row& r : rows) {
      expect_matches(in, r, model.value("preset", model.value("family", std::string())));
      ++checked;
      expert_parallel += r.c.ep > 1 ? 1 : 0;
    }
  }
  EXPECT_GE(checked, 12);
  EXPECT_GE(expert_parallel, world_size() > 1 ? 1 : 0);
}

// The all-gather dispatch's buffers (every rank's tokens, plans and gates) in the planner's figures
// as the engine allocates them: the first layout of each expert-parallel size, pipeline and
// recompute policy.
TEST_F(PlannerMemory, AllGatherDispatchMatchesTheEngine) {
  if (world_size() < 2) GTEST_SKIP() << "expert parallelism needs 2 ranks";
  planner::PlanInput in = input(moe_model(), 8);
  in.base["parallelism"] = {{"expert_dispatch", "all_gather"}};
  std::vector<std::string> seen;
  for (const planner::Row& r : planner::plan(in)) {
    if (!r.valid() || r.c.ep < 2) continue;
    const std::string kind =
        std::to_string(r.c.ep) + "/" + std::to_string(r.c.pp) + "/" + r.c.recompute;
    if (std::find(seen.begin(), seen.end(), kind) != seen.end()) continue;
    seen.push_back(kind);
    expect_matches(in, r, "all_gather");
  }
  EXPECT_GE(seen.size(), 2u);
}

// Whole experts beside tensor parallelism (expert_tensor 1): unsplit experts, sharded by ZeRO over
// tp × dp / ep ranks, dispatching each rank's own rows; the first layout of each expert-parallel
// size, ZeRO stage and pipeline.
TEST_F(PlannerMemory, WholeExpertsMatchTheEngine) {
  if (world_size() < 2) GTEST_SKIP() << "tensor parallelism needs 2 ranks";
  const planner::PlanInput in = input(moe_model(), 8);
  std::vector<std::string> seen;
  for (const planner::Row& r : planner::plan(in)) {
    if (!r.valid() || !r.c.whole_experts) continue;
    const std::string kind =
        std::to_string(r.c.ep) + "/" + std::to_string(r.c.zero) + "/" + std::to_string(r.c.pp);
    if (std::find(seen.begin(), seen.end(), kind) != seen.end()) continue;
    seen.push_back(kind);
    expect_matches(in, r, "whole experts");
  }
  EXPECT_GE(seen.size(), world_size() == 2 ? 8u : 16u);
}

// ZeRO-3 under a pipeline, as the planner now enumerates it: every unit gathered (persistence 0),
// released after each use (the gather buffers of the prefetch bucket) or kept for the step (a
// buffer per unit of the stage); the first layout of each schedule and recompute policy.
TEST_F(PlannerMemory, ZeroStage3UnderPipelinesMatchesTheEngine) {
  if (world_size() < 2) GTEST_SKIP() << "a pipeline needs 2 ranks";
  int checked = 0;
  for (bool reshard : {true, false}) {
    planner::PlanInput in = input(preset(reshard ? "gpt2-tiny" : "llama-tiny"), 8);
    in.base["zero_optimization"] = {{"stage3_param_persistence_threshold", 0},
                                    {"stage3_prefetch_bucket_size", 10000},
                                    {"stage3_reshard_after_forward", reshard}};
    std::vector<std::string> seen;
    for (const planner::Row& r : planner::plan(in)) {
      if (!r.valid() || r.c.zero != 3 || r.c.pp < 2) continue;
      const std::string kind = r.c.schedule + "/" + r.c.recompute + "/" + std::to_string(r.c.tp);
      if (std::find(seen.begin(), seen.end(), kind) != seen.end()) continue;
      seen.push_back(kind);
      expect_matches(in, r, reshard ? "reshard" : "kept");
      ++checked;
    }
  }
  EXPECT_GE(checked, world_size() == 2 ? 6 : 12);
}

// The refused layouts: the engine (or the config parser) says the same.
TEST_F(PlannerMemory, RefusalsAreTheEnginesOwn) {
  const planner::PlanInput in = input(preset("gpt2-tiny"), 8);
  int checked = 0;
  for (const planner::Row& r : planner::plan(in)) {
    if (r.valid() || checked >= 6) continue;
    std::string engine_says;
    try {
      int stage = 0;
      measure(in, r.c, &stage);
    } catch (const InputError& e) {
      engine_says = e.what();
    }
    EXPECT_EQ(engine_says, r.reason) << planner::describe(r.c);
    ++checked;
  }
  if (world_size() > 1) {
    EXPECT_GT(checked, 0);
  }
}

}  // namespace
}  // namespace strata
