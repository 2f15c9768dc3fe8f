// A mixture of experts never changes the math of a layout (DESIGN.md §1): a MoE model (routed
// experts with a gated shared expert, a dense layer among the MoE ones, Megatron's per-layer
// balancing loss and the z-loss; transformers' pooled loss where no pipeline splits the layers)
// gives, after each of 50 steps (40 with a capacity), the single-process loss and gradient norm
// within 1e-5, the same routing (tokens per expert, and those dropped by a capacity per sequence)
// and validation loss, under data parallelism with accumulation, ZeRO-1/2/3, tensor parallelism
// with and without sequence parallelism, pipelines (1F1B, zero-bubble, interleaved), context
// parallelism (Ulysses, ring) and activation recomputation (full, selective). Runs under mpirun
// with 2 and 4 ranks, and 8 for ep 8 (tests/CMakeLists.txt); each rank computes the single-process
// reference itself. The model's match with transformers' Mixtral, Qwen2-MoE and Qwen3-MoE is
// tests/ckpt/hf_families_test.sh's.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/memory.h"
#include "strata/core/rng.h"
#include "strata/cost/layout.h"
#include "strata/cost/predict.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

// Dropless routing keeps to the one-process run past 120 steps on this model (measured); with a
// capacity, a choice at an expert's capacity boundary can fall the other way after about 70
// (layouts are equal within rounding, not bit for bit), so that variant runs 40.
constexpr int kSteps = 50, kCapacitySteps = 40, kEvalIters = 2, kGlobalBatch = 8, kVocab = 64;

struct Trace {
  std::vector<double> losses, grad_norms, aux, dropped;
  std::vector<double> imbalance;      // per step: the most any expert took over its layer's mean
  std::vector<double> expert_tokens;  // the last step's, per MoE layer and expert
  double val_loss = 0;
};

struct Layout;

class MoeLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefix_ = test::shared_temp_path("strata_moe_");
    if (world_rank() == 0) {
      const uint64_t key = rng_key(5, "moe_layouts");
      data::MegatronWriter w(prefix_, data::TokenType::U16);
      std::vector<int32_t> ids(4096);
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = int32_t(rng_uniform(key, i) * kVocab) % kVocab;
      }
      w.add_document(ids.data(), int64_t(ids.size()));
      w.commit();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    data_ = data::open_dataset(prefix_, "megatron");
  }
  static void TearDownTestSuite() {
    data_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      for (const char* ext : {".bin", ".idx"}) std::filesystem::remove(prefix_ + ext);
    }
  }

  // aux_loss "pooled" or "per_layer"; "capacity": per_layer with a capacity per sequence;
  // "sigmoid": DeepSeek-V3's router (2 groups of 2 experts, a token's one expert from the better
  // group, its gate the scaled score) balanced by its expert bias and its sequence-wise loss.
  // "routed": per_layer without the shared expert.
  static nlohmann::json config(const std::string& variant) {
    const bool capacity = variant == "capacity", sigmoid = variant == "sigmoid";
    const bool routed = variant == "routed";
    const std::string aux_loss = capacity || sigmoid || routed ? "per_layer" : variant;
    const nlohmann::json moe = {{"experts", 4},         {"top_k", 2},
                                {"ffn_hidden", 32},     {"shared_ffn_hidden", 32},
                                {"shared_gate", true},  {"mlp_only_layers", {1}},
                                {"aux_loss", aux_loss}, {"router_aux_loss_coef", 0.05},
                                {"z_loss_coef", 0.01}};
    nlohmann::json m = moe;
    if (capacity) m["capacity_factor"] = 1.5, m["capacity_scope"] = "sequence";
    if (routed) m.erase("shared_ffn_hidden"), m.erase("shared_gate");
    if (sigmoid) {
      m["router"] = "sigmoid", m["n_group"] = 2, m["topk_group"] = 1;
      m["top_k"] = 1, m["norm_topk_prob"] = false;
      m["routed_scaling_factor"] = 2.5, m["expert_bias_update_rate"] = 0.01;
      m["router_aux_loss_coef"] = 0.02, m["z_loss_coef"] = 0.0;  // the sequence-wise loss
    }
    return {{"train_batch_size", kGlobalBatch},
            {"steps_per_print", 0},
            {"gradient_clipping", 1.0},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}},
            {"model",
             {{"family", "mixtral"},
              {"layers", 4},
              {"hidden", 32},
              {"heads", 4},
              {"kv_heads", 2},
              {"ffn_hidden", 48},
              {"vocab", kVocab},
              {"seq_len", 16},
              {"moe", m}}}};
  }

  // parallelism null: one process, one micro-batch.
  static Trace run(nlohmann::json j, const nlohmann::json& parallelism, int micro) {
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
    MemoryTracker& mem = MemoryTracker::instance();
    const MemCategory states[] = {MemCategory::Params, MemCategory::MasterParams,
                                  MemCategory::Grads, MemCategory::OptimizerState};
    std::array<size_t, kNumMemCategories> before{};
    for (MemCategory c : states) before[size_t(c)] = mem.current(c);
    Engine engine(cfg, data_.get(), groups ? &groups->dp_cp() : nullptr,
                  groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                  groups ? &groups->cp() : nullptr);
    // The model states are the start-up prediction's, byte for byte (under expert parallelism:
    // this rank's experts, sharded over their expert-data-parallel group).
    const bool zero = groups && cfg.zero.stage >= 1;
    const cost::MemoryPrediction want = cost::predict_memory(cost::layout_of(cfg), engine.spec(),
                                                             zero ? int(engine.spec().align) : 0);
    for (MemCategory c : states) {
      EXPECT_EQ(mem.current(c) - before[size_t(c)], want.bytes[size_t(c)])
          << parallelism.dump() << " " << mem_category_name(c);
    }
    engine.set_validation(*data_);
    Trace r;
    const int steps = j["model"]["moe"].contains("capacity_factor") ? kCapacitySteps : kSteps;
    for (int i = 0; i < steps; ++i) {
      const StepMetrics s = engine.train_batch();
      r.losses.push_back(s.loss);
      r.grad_norms.push_back(s.grad_norm);
      r.aux.push_back(s.moe_aux_loss);
      r.dropped.push_back(s.moe_dropped);
      r.expert_tokens.assign(s.expert_tokens.begin(), s.expert_tokens.end());
      double worst = 0;
      for (size_t l = 0; l < s.expert_layers.size(); ++l) {
        const auto row = s.expert_tokens.subspan(l * size_t(s.experts), size_t(s.experts));
        double sum = 0, most = 0;
        for (double t : row) sum += t, most = std::max(most, t);
        worst = std::max(worst, most * double(row.size()) / sum);
      }
      r.imbalance.push_back(worst);
      EXPECT_EQ(s.expert_layers.size(), 3u);  // every layer but the dense one
    }
    r.val_loss = engine.evaluate(kEvalIters);
    return r;
  }

  // Each variant's single-process run against every layout (but those with context parallelism
  // for a capacity per sequence, which refuses them).
  static void expect_layouts(const std::vector<std::string>& variants,
                             const std::vector<Layout>& layouts);

  static void expect_same(const Trace& got, const Trace& ref, const std::string& what) {
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
    for (size_t k = 0; k < ref.losses.size(); ++k) {
      const size_t i = k;
      EXPECT_NEAR(got.losses[k], ref.losses[k], 1e-5 * ref.losses[k]) << what << " step " << i + 1;
      EXPECT_NEAR(got.grad_norms[k], ref.grad_norms[k], 1e-5 * ref.grad_norms[k])
          << what << " step " << i + 1;
      EXPECT_NEAR(got.aux[k], ref.aux[k], 1e-5 * ref.aux[k]) << what << " step " << i + 1;
    }
    EXPECT_NEAR(got.val_loss, ref.val_loss, 1e-5 * ref.val_loss) << what;
    // The routing itself: every token's choices, counted over the global batch, and those dropped.
    EXPECT_EQ(got.expert_tokens, ref.expert_tokens) << what;
    EXPECT_EQ(got.dropped, ref.dropped) << what;
  }

  static std::string prefix_;
  static std::unique_ptr<data::TokenDataset> data_;
};

std::string MoeLayouts::prefix_;
std::unique_ptr<data::TokenDataset> MoeLayouts::data_;

struct Layout {
  nlohmann::json parallelism, zero, recompute;
  int micro;
};

std::string describe(const Layout& l) {
  return "world " + std::to_string(world_size()) + " " + l.parallelism.dump() + " " +
         l.zero.dump() + " " + l.recompute.dump() + " micro " + std::to_string(l.micro);
}

// The ZeRO stages and recompute policies the layouts combine.
const nlohmann::json kZero3 = {{"stage", 3}, {"stage3_param_persistence_threshold", 0}};
const nlohmann::json kFull = {{"partition_activations", false}, {"number_checkpoints", 2}};
const nlohmann::json kSelective = {{"recompute_granularity", "selective"}};
const nlohmann::json kZ0 = {{"stage", 0}}, kZ1 = {{"stage", 1}}, kZ2 = {{"stage", 2}};

nlohmann::json with_layout(nlohmann::json j, const Layout& l) {
  j["zero_optimization"] = l.zero;
  if (!l.recompute.is_null()) j["activation_checkpointing"] = l.recompute;
  return j;
}

void MoeLayouts::expect_layouts(const std::vector<std::string>& variants,
                                const std::vector<Layout>& layouts) {
  for (const std::string& aux : variants) {
    const Trace ref = run(config(aux), nullptr, 1);
    for (const Layout& l : layouts) {
      if (aux == "capacity" && l.parallelism.value("context", 1) > 1) continue;  // refused
      expect_same(run(with_layout(config(aux), l), l.parallelism, l.micro), ref,
                  aux + " " + describe(l));
    }
  }
}

TEST_F(MoeLayouts, EveryLayoutGivesTheSingleProcessRun) {
  // Every layout over the per-layer loss; those without a pipeline over the pooled one too.
  std::vector<Layout> layouts = {
      {{{"tensor", 1}}, kZ0, nullptr, 2},  // dp = world, with accumulation
      {{{"tensor", 1}}, kZero3, kFull, 1},
      {{{"tensor", 2}}, kZ1, nullptr, 2},
      {{{"tensor", 2}, {"sequence_parallel", true}}, kZ2, kSelective, 1},
      {{{"pipeline", 2}, {"schedule", "1f1b"}}, kZ0, kFull, 4},
      {{{"pipeline", 2}, {"schedule", "zero_bubble"}}, kZ1, nullptr, 4},
      {{{"context", 2}, {"context_impl", "ulysses"}}, kZ0, nullptr, 2},
      {{{"context", 2}, {"context_impl", "ring"}}, kZ2, nullptr, 1},
  };
  if (world_size() == 4) {
    layouts.push_back({{{"tensor", 2}, {"sequence_parallel", true}}, kZero3, nullptr, 2});
    layouts.push_back(
        {{{"pipeline", 2}, {"virtual_stages", 2}, {"schedule", "interleaved"}}, kZ1, nullptr, 4});
    layouts.push_back({{{"pipeline", 2}, {"tensor", 2}}, kZ0, nullptr, 2});
    layouts.push_back({{{"pipeline", 2}, {"context", 2}, {"context_impl", "ring"}}, kZ0, kFull, 2});
  }
  for (const char* aux : {"per_layer", "pooled", "capacity"}) {
    const Trace ref = run(config(aux), nullptr, 1);
    const bool capacity = std::string(aux) == "capacity";
    // With a capacity some choices are dropped (an expert takes at most 12 of a sequence's 32).
    EXPECT_EQ(ref.dropped.back() > 0, capacity);
    // The balancing and z-losses are in the loss, and training moves them.
    EXPECT_GT(ref.aux.front(), 0.0);
    EXPECT_NE(ref.aux.front(), ref.aux.back());
    // Each layer routes the global batch's tokens top_k times.
    ASSERT_EQ(ref.expert_tokens.size(), 3u * 4u);
    for (int l = 0; l < 3 && !capacity; ++l) {
      double sum = 0;
      for (int e = 0; e < 4; ++e) sum += ref.expert_tokens[size_t(l * 4 + e)];
      EXPECT_EQ(sum, double(kGlobalBatch) * 16 * 2);
    }
    for (const Layout& l : layouts) {
      if (std::string(aux) == "pooled" && l.parallelism.value("pipeline", 1) > 1) continue;
      if (capacity && l.parallelism.value("context", 1) > 1) continue;  // refused: per sequence
      expect_same(run(with_layout(config(aux), l), l.parallelism, l.micro), ref,
                  std::string(aux) + " " + describe(l));
    }
  }
}

// Expert parallelism folded into the data and context-parallel ranks (ep 2 and 4 over 4 experts,
// so one or two experts a rank), beside accumulation, ZeRO-0..3, tensor parallelism with sequence
// parallelism, pipelines (1F1B, GPipe, zero-bubble's deferred weight gradients, interleaved) and
// context parallelism: the tokens go to their experts' ranks and back, by all-to-all or by
// all-gather and reduce-scatter (either in flight while the shared expert runs, expert_overlap),
// and the step is the single-process one.
TEST_F(MoeLayouts, ExpertParallelismGivesTheSingleProcessRun) {
  const nlohmann::json ag = "all_gather";
  std::vector<Layout> layouts = {
      {{{"expert", 2}, {"expert_overlap", true}}, kZ0, nullptr, 2},
      {{{"expert", 2}}, kZero3, kFull, 1},
      {{{"expert", 2}, {"expert_dispatch", ag}}, kZ1, kFull, 2},
  };
  if (world_size() == 4) {
    layouts = {
        {{{"expert", 4}}, kZ1, nullptr, 1},
        {{{"expert", 2}}, kZ2, kSelective, 2},  // two groups of two hold the experts alike
        {{{"expert", 4}}, kZero3, nullptr, 1},
        {{{"expert", 2}, {"tensor", 2}, {"sequence_parallel", true}}, kZ1, nullptr, 1},
        {{{"expert", 2}, {"pipeline", 2}, {"schedule", "1f1b"}}, kZ2, kFull, 4},
        {{{"expert", 2}, {"pipeline", 2}, {"schedule", "gpipe"}}, kZ0, nullptr, 2},
        {{{"expert", 2}, {"pipeline", 2}, {"schedule", "zero_bubble"}}, kZ1, nullptr, 4},
        {{{"expert", 2}, {"pipeline", 2}, {"virtual_stages", 2}, {"schedule", "interleaved"}},
         kZero3,
         nullptr,
         4},
        {{{"expert", 4}, {"context", 2}, {"context_impl", "ulysses"}}, kZ0, nullptr, 2},
        // The all-gather dispatch: one expert a rank, tensor parallelism, deferred weights.
        {{{"expert", 4}, {"expert_dispatch", ag}, {"expert_overlap", true}}, kZero3, nullptr, 1},
        {{{"expert", 2}, {"tensor", 2}, {"sequence_parallel", true}, {"expert_dispatch", ag}},
         kZ2,
         nullptr,
         1},
        {{{"expert", 2}, {"pipeline", 2}, {"schedule", "zero_bubble"}, {"expert_dispatch", ag}},
         kZ0,
         nullptr,
         4},
    };
  }
  expect_layouts({"per_layer", "capacity", "sigmoid"}, layouts);
}

// Whole experts beside tensor parallelism (expert_tensor 1, under sequence parallelism): each
// tensor-parallel rank routes its own rows through unsplit experts, placed over groups of the
// stage's tp × dp × cp ranks (ep 1, 2 and 4: the group inside the tensor-parallel pair, across it,
// beside a pipeline and context parallelism), with and without the shared expert (whose partial
// sums the routed rows then join), by all-to-all and all-gather, under ZeRO-0..3: the
// single-process run.
TEST_F(MoeLayouts, WholeExpertsBesideTensorParallelism) {
  const nlohmann::json whole = {{"tensor", 2}, {"sequence_parallel", true}, {"expert_tensor", 1}};
  auto with = [&](const nlohmann::json& more) {
    nlohmann::json p = whole;
    if (more.is_object()) p.update(more);
    return p;
  };
  std::vector<Layout> layouts = {
      {with({{"expert", 2}}), kZ0, nullptr, 2},  // the experts over the tensor-parallel pair
      {with(nullptr), kZ1, kFull, 1},            // every expert on both, summed over them
  };
  if (world_size() == 4) {
    layouts = {
        {with({{"expert", 4}}), kZero3, nullptr, 1},
        {with({{"expert", 2}, {"expert_dispatch", "all_gather"}}), kZ2, kSelective, 1},
        {with({{"expert", 2}, {"pipeline", 2}, {"schedule", "zero_bubble"}}), kZ1, nullptr, 4},
        {with({{"expert", 4}, {"context", 2}, {"context_impl", "ring"}}), kZ0, nullptr, 2},
    };
  }
  // (The sigmoid router's routing is the softmax one's as far as the dispatch goes: at 2 ranks.)
  std::vector<std::string> variants = {"per_layer", "routed", "capacity"};
  if (world_size() == 2) variants.push_back("sigmoid");
  expect_layouts(variants, layouts);
}

// ep 8 (moe_equivalence_np8 runs this test alone): eight experts, one a rank, by all-to-all under
// ZeRO-1 and by all-gather under ZeRO-3, ep 4 beside tensor parallelism with sequence
// parallelism (two experts a rank), and ep 8 of whole experts over tp 2 × dp 4, against the
// single-process run over 50 steps.
TEST_F(MoeLayouts, EightExpertsOverEightRanks) {
  if (world_size() != 8) GTEST_SKIP() << "runs on 8 ranks (moe_equivalence_np8)";
  nlohmann::json j = config("per_layer");
  j["model"]["moe"]["experts"] = 8;
  const Trace ref = run(j, nullptr, 1);
  const Layout layouts[] = {
      {{{"expert", 8}}, kZ1, nullptr, 1},
      {{{"expert", 8}, {"expert_dispatch", "all_gather"}}, kZero3, nullptr, 1},
      {{{"expert", 4}, {"tensor", 2}, {"sequence_parallel", true}}, kZ2, nullptr, 1},
      // Whole experts: one a rank over the tensor-parallel pairs of four data-parallel ranks.
      {{{"expert", 8}, {"tensor", 2}, {"sequence_parallel", true}, {"expert_tensor", 1}},
       kZ1,
       nullptr,
       1},
  };
  for (const Layout& l : layouts) {
    expect_same(run(with_layout(j, l), l.parallelism, l.micro), ref,
                "eight experts " + describe(l));
  }
}

// Megatron's capacity over the rows a rank routes changes with the micro-batch split (documented);
// the capacity per sequence does not (EveryLayoutGivesTheSingleProcessRun).
TEST_F(MoeLayouts, CapacityPerMicroBatchDependsOnTheSplit) {
  nlohmann::json j = config("capacity");
  j["model"]["moe"]["capacity_scope"] = "micro_batch";
  j["model"]["moe"]["capacity_factor"] = 1.0;
  const Trace whole = run(j, nullptr, 1);
  const Trace split = run(j, nullptr, 4);
  EXPECT_GT(whole.dropped.front(), 0.0);
  EXPECT_NE(whole.dropped.front(), split.dropped.front());
}

// The sigmoid router's bias moves once per step towards balance: without it (a rate of 0) the
// experts take other tokens, and with it the most loaded expert of a layer takes fewer over the
// second half of the run (the mean over its steps of the worst layer's max over mean).
TEST_F(MoeLayouts, TheExpertBiasBalances) {
  nlohmann::json j = config("sigmoid");
  j["model"]["moe"]["router_aux_loss_coef"] = 0.0;  // the bias alone
  const Trace with = run(j, nullptr, 1);
  j["model"]["moe"]["expert_bias_update_rate"] = 0.0;
  const Trace without = run(j, nullptr, 1);
  EXPECT_NE(with.expert_tokens, without.expert_tokens);
  auto late = [](const std::vector<double>& v) {
    double sum = 0;
    for (size_t i = v.size() / 2; i < v.size(); ++i) sum += v[i];
    return sum / double(v.size() - v.size() / 2);
  };
  EXPECT_LT(late(with.imbalance), late(without.imbalance));
}

// The balancing loss is part of the gradient: without it training takes another path (Megatron's
// per-layer loss with the z-loss, and the sigmoid router's sequence-wise loss).
TEST_F(MoeLayouts, TheBalancingLossTrains) {
  for (const char* variant : {"per_layer", "sigmoid"}) {
    nlohmann::json j = config(variant);
    const Trace with = run(j, nullptr, 1);
    j["model"]["moe"]["router_aux_loss_coef"] = 0.0;
    j["model"]["moe"]["z_loss_coef"] = 0.0;
    const Trace without = run(j, nullptr, 1);
    EXPECT_GT(with.aux.front(), 0.0) << variant;
    EXPECT_EQ(without.aux.front(), 0.0) << variant;
    EXPECT_GT(std::abs((with.losses.back() - with.aux.back()) - without.losses.back()), 1e-4)
        << variant;
  }
}

}  // namespace
}  // namespace strata
