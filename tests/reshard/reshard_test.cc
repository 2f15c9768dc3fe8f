// Layout-independent checkpoints (DESIGN.md §7): a run saved in one layout and loaded into
// another — dp, tp (± sequence parallelism), pp with any schedule and virtual stages, context
// parallelism (Ulysses or ring), expert parallelism (a mixture of experts' experts by global id,
// split over tp or whole), ZeRO stage and MiCS groups, micro-batch and accumulation split, and so
// the world size — continues with the losses of the uninterrupted run. Runs under mpirun with 2, 4
// and 8 ranks (tests/CMakeLists.txt); a layout of fewer ranks than the world runs on the first
// ones.
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
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 4;  // before the save, and again after the load
constexpr int kBatch = 16;

struct Layout {
  int ranks = 1, tp = 1, pp = 1, zero = 0, gas = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  bool sp = false;
  int mics = 0;         // zero_optimization.mics_shard_size (0: none)
  bool reshard = true;  // zero_optimization.stage3_reshard_after_forward
  int cp = 1;
  std::string context_impl = "ulysses";
  int ep = 1;          // parallelism.expert (the "moe-tiny" model)
  bool whole = false;  // parallelism.expert_tensor 1 (whole experts beside tp, with SP)
  std::string name() const {
    std::string s = std::to_string(ranks / (tp * pp * cp)) + "dp";
    if (cp > 1) s += " cp" + std::to_string(cp) + " " + context_impl;
    if (tp > 1) s += " tp" + std::to_string(tp) + (sp ? "+sp" : "");
    if (pp > 1) s += " pp" + std::to_string(pp) + " " + schedule;
    if (virtual_stages > 1) s += " v" + std::to_string(virtual_stages);
    s += " zero" + std::to_string(zero) + " gas" + std::to_string(gas);
    if (mics > 0) s += " mics" + std::to_string(mics);
    if (!reshard) s += " kept";
    if (ep > 1) s += " ep" + std::to_string(ep);
    if (whole) s += " etp1";
    return s;
  }
};

class Reshard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::shared_temp_path("strata_reshard_");
    if (world_rank() == 0) {
      std::filesystem::create_directories(dir_);
      std::vector<int32_t> tokens(30000);
      const uint64_t key = rng_key(5, "reshard_test");
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = rng_uniform(key, i) < 0.4f ? int32_t(rng_uniform(key, i + (1u << 24)) * 64) % 64
                                               : int32_t((i * 5) % 59);
      }
      data::write_llmc_shard(dir_ + "/data.bin", tokens, false);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dataset_ = data::open_dataset(dir_ + "/data.bin", "llmc");
  }
  static void TearDownTestSuite() {
    dataset_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(dir_);
  }

  // A preset, or "moe-tiny": a mixture of 8 experts (top 2, Megatron's balancing loss), or
  // "moe-sigmoid-tiny": the same with DeepSeek-V3's router and its bias (which a checkpoint keeps).
  static nlohmann::json config(const std::string& preset) {
    nlohmann::json model = preset.rfind("moe-", 0) != 0
                               ? nlohmann::json{{"preset", preset}, {"layers", 4}}
                               : nlohmann::json{{"family", "mixtral"},
                                                {"layers", 4},
                                                {"hidden", 32},
                                                {"heads", 4},
                                                {"kv_heads", 2},
                                                {"ffn_hidden", 48},
                                                {"vocab", 64},
                                                {"seq_len", 16},
                                                {"moe",
                                                 {{"experts", 8},
                                                  {"top_k", 2},
                                                  {"ffn_hidden", 16},
                                                  {"aux_loss", "per_layer"},
                                                  {"router_aux_loss_coef", 0.01}}}};
    if (preset == "moe-sigmoid-tiny") {
      model["moe"].update({{"router", "sigmoid"},
                           {"n_group", 4},
                           {"topk_group", 2},
                           {"routed_scaling_factor", 2.0},
                           {"expert_bias_update_rate", 0.02},
                           {"router_aux_loss_coef", 0.0}});
    }
    return {
        {"train_batch_size", kBatch},
        {"steps_per_print", 0},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
        {"scheduler",
         {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}, {"warmup_type", "linear"}}}}},
        {"model", model}};
  }

  // Runs `steps` steps of layout l on the first l.ranks ranks (the others return {}): loading
  // `load` first when given, saving into `save` after when given.
  static std::vector<double> run(const std::string& preset, const Layout& l, int steps,
                                 const std::string& load, const std::string& save) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < l.ranks ? 0 : MPI_UNDEFINED, world_rank(), &comm);
    std::vector<double> losses;
    if (comm == MPI_COMM_NULL) return losses;
    {
      auto j = config(preset);
      j["parallelism"] = {{"tensor", l.tp},
                          {"pipeline", l.pp},
                          {"schedule", l.schedule},
                          {"virtual_stages", l.virtual_stages},
                          {"sequence_parallel", l.sp},
                          {"context", l.cp},
                          {"context_impl", l.context_impl}};
      if (l.ep > 1) j["parallelism"]["expert"] = l.ep;
      if (l.whole) j["parallelism"]["expert_tensor"] = 1;
      j["zero_optimization"] = {{"stage", l.zero}};
      if (l.mics > 0) j["zero_optimization"]["mics_shard_size"] = l.mics;
      if (l.zero == 3) {
        j["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
        j["zero_optimization"]["stage3_reshard_after_forward"] = l.reshard;
      }
      const comm::RankGrid grid(l.ranks, l.tp, l.pp, "tp-dp-pp", l.cp);
      j["gradient_accumulation_steps"] = l.gas;
      j["train_micro_batch_size_per_gpu"] = kBatch / (grid.dp() * l.gas);
      Config cfg = parse_config(j);
      resolve_batch(cfg, grid.dp());
      std::unique_ptr<comm::ProcessGroups> groups;
      if (l.ranks > 1) groups = std::make_unique<comm::ProcessGroups>(grid, comm);
      Engine engine(cfg, dataset_.get(), groups ? &groups->dp_cp() : nullptr,
                    groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                    groups ? &groups->cp() : nullptr);
      // An error is a failure of this pair, on every rank alike (saves and loads fail on all of
      // them together), and the next pair goes on.
      try {
        if (!load.empty()) engine.load_checkpoint(load);
        for (int i = 0; i < steps; ++i) losses.push_back(engine.train_batch().loss);
        if (!save.empty()) engine.save_checkpoint(save);
      } catch (const Error& e) {
        ADD_FAILURE() << l.name() << ": " << e.what();
      }
    }
    MPI_Comm_free(&comm);
    return losses;
  }

  // The uninterrupted run: one process, every rank computing it for itself.
  static std::vector<double> serial(const std::string& preset, int steps) {
    auto j = config(preset);
    j["train_micro_batch_size_per_gpu"] = kBatch;
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine engine(cfg, dataset_.get());
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) losses.push_back(engine.train_batch().loss);
    return losses;
  }

  static std::string dir_;
  static std::unique_ptr<data::TokenDataset> dataset_;
};

std::string Reshard::dir_;
std::unique_ptr<data::TokenDataset> Reshard::dataset_;

struct Pair {
  const char* preset;
  Layout save, load;
};

std::vector<Pair> pairs() {
  Layout one;
  auto L = [](int ranks, int tp, int pp, int zero, int gas) {
    Layout l;
    l.ranks = ranks, l.tp = tp, l.pp = pp, l.zero = zero, l.gas = gas;
    return l;
  };
  Layout d2t2p2 = L(8, 2, 2, 1, 2);
  Layout interleaved = L(8, 2, 2, 1, 4);
  interleaved.schedule = "interleaved", interleaved.virtual_stages = 2;
  Layout zb = L(4, 2, 2, 2, 2);
  zb.schedule = "zero_bubble";
  Layout sp = L(4, 2, 1, 3, 1);
  sp.sp = true;
  Layout gpipe = L(4, 1, 2, 1, 2);
  gpipe.schedule = "gpipe";
  Layout mics = L(4, 1, 1, 3, 2);
  mics.mics = 2;
  // ZeRO-3 under pipelines: every schedule, units released or kept for the step.
  Layout z3p2 = L(2, 1, 2, 3, 2);  // pp2 1F1B
  Layout z3gpipe = L(2, 1, 2, 3, 4);
  z3gpipe.schedule = "gpipe", z3gpipe.reshard = false;
  Layout z3dp2 = L(4, 1, 2, 3, 2);  // dp2 pp2 1F1B
  Layout z3zb = L(4, 2, 2, 3, 2);   // tp2 pp2 zero-bubble
  z3zb.schedule = "zero_bubble", z3zb.reshard = false;
  Layout z3il = L(8, 2, 2, 3, 4);  // dp2 tp2 pp2 interleaved
  z3il.schedule = "interleaved", z3il.virtual_stages = 2;
  auto context = [&](Layout l, int cp, const char* impl) {
    l.cp = cp, l.context_impl = impl;
    return l;
  };
  auto expert = [&](Layout l, int ep) {
    l.ep = ep;
    return l;
  };
  auto whole = [&](Layout l, int ep) {  // whole experts beside tp (with SP)
    l.ep = ep, l.whole = true, l.sp = true;
    return l;
  };
  return {
      {"gpt2-tiny", d2t2p2, one},                          // (dp2, tp2, pp2, ZeRO-1) -> 1 process
      {"gpt2-tiny", L(8, 1, 1, 3, 1), L(4, 2, 1, 2, 1)},   // (dp8, ZeRO-3) -> (dp2, tp2, ZeRO-2)
      {"gpt2-tiny", L(4, 4, 1, 0, 1), L(4, 2, 2, 1, 2)},   // (tp4) -> (tp2, pp2)
      {"llama-tiny", L(4, 4, 1, 1, 2), L(4, 2, 1, 2, 1)},  // GQA: kv heads replicated -> split
      {"gpt2-tiny", one, interleaved},                     // 1 process -> dp2 tp2 pp2, interleaved
      {"llama-tiny", L(4, 1, 1, 2, 1), L(2, 1, 1, 3, 4)},  // ZeRO-2 dp4 -> ZeRO-3 dp2, gas 4
      {"gpt2-tiny", zb, L(4, 1, 1, 1, 1)},                 // zero-bubble tp2 pp2 -> dp4 ZeRO-1
      {"llama-tiny", L(2, 1, 1, 0, 2), sp},                // dp2 -> tp2 + SP, dp2, ZeRO-3
      {"gpt2-tiny", L(4, 1, 4, 0, 4), gpipe},              // pp4 1F1B -> dp2 pp2 GPipe
      {"llama-tiny", mics, L(4, 4, 1, 0, 1)},              // MiCS groups of 2, ZeRO-3 -> tp4
      {"gpt2-tiny", L(8, 2, 1, 1, 1), L(8, 1, 1, 2, 2)},   // tp2 dp4 -> dp8 ZeRO-2
      {"llama-tiny", L(2, 2, 1, 1, 1), L(2, 1, 2, 1, 2)},  // tp2 -> pp2
      {"gpt2-tiny", z3p2, one},                            // pp2 ZeRO-3 -> 1 process
      {"llama-tiny", L(2, 1, 1, 3, 1), z3gpipe},           // dp2 ZeRO-3 -> pp2 GPipe ZeRO-3
      {"gpt2-tiny", z3dp2, L(4, 2, 1, 2, 1)},              // dp2 pp2 ZeRO-3 -> dp2 tp2 ZeRO-2
      {"llama-tiny", L(4, 4, 1, 0, 1), z3zb},              // tp4 -> tp2 pp2 zero-bubble ZeRO-3
      {"gpt2-tiny", z3il, L(4, 1, 4, 3, 4)},  // interleaved dp2 tp2 pp2 ZeRO-3 -> pp4 ZeRO-3
      // Context parallelism: the parameters are whole on every cp rank (ZeRO shards over dp × cp).
      {"gpt2-tiny", context(L(2, 1, 1, 0, 1), 2, "ulysses"), one},             // cp2 -> 1 process
      {"llama-tiny", context(L(4, 1, 1, 3, 2), 2, "ring"), L(4, 2, 1, 1, 1)},  // dp2 cp2 ZeRO-3
      {"gpt2-tiny", L(4, 1, 2, 2, 2), context(L(4, 1, 1, 2, 1), 4, "ring")},   // pp2 -> cp4
      {"gpt2-tiny", context(L(8, 2, 1, 1, 1), 2, "ring"), context(L(4, 1, 1, 3, 1), 2, "ulysses")},
      // Expert parallelism: the experts' weights and moments by global expert id.
      {"moe-tiny", expert(L(2, 1, 1, 0, 2), 2), one},                          // ep2 -> 1 process
      {"moe-tiny", expert(L(4, 1, 1, 1, 1), 4), expert(L(2, 1, 1, 2, 2), 2)},  // ep4 -> ep2
      {"moe-tiny", expert(L(4, 1, 1, 0, 1), 4), expert(L(8, 1, 1, 3, 1), 8)},  // ep4 -> ep8 ZeRO-3
      {"moe-tiny", expert(L(4, 2, 1, 3, 1), 2), expert(L(4, 1, 2, 1, 2), 2)},  // ep2 tp2 -> ep2 pp2
      {"moe-sigmoid-tiny", expert(L(2, 1, 1, 1, 1), 2), L(4, 1, 1, 2, 1)},     // the bias kept
      // Whole experts beside tp: unsplit on each rank, sharded over tp × dp / ep.
      {"moe-tiny", expert(L(2, 1, 1, 1, 1), 2), whole(L(2, 2, 1, 2, 1), 2)},  // ep2 -> tp2 etp1
      {"moe-tiny", whole(L(4, 2, 1, 3, 1), 4), expert(L(4, 2, 1, 1, 1), 2)},  // etp1 ep4 -> etp2
      {"moe-tiny", whole(L(8, 2, 1, 1, 1), 8), whole(L(4, 2, 2, 3, 2), 2)},   // ep8 -> ep2 pp2
  };
}

// Every pair that fits the world: the losses after the load equal the uninterrupted run's
// (one process, 2·kSteps steps) within 1e-5, as every layout's do.
TEST_F(Reshard, EveryLayoutLoadsWhatAnyOtherSaved) {
  int index = 0, ran = 0;
  for (const Pair& p : pairs()) {
    ++index;
    if (p.save.ranks > world_size() || p.load.ranks > world_size()) continue;
    ++ran;
    const std::string what = std::string(p.preset) + " " + p.save.name() + " -> " + p.load.name();
    const std::string ckpt = dir_ + "/ckpt_" + std::to_string(index);
    const std::vector<double> ref = serial(p.preset, 2 * kSteps);
    const std::vector<double> before = run(p.preset, p.save, kSteps, "", ckpt);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::vector<double> after = run(p.preset, p.load, kSteps, ckpt, "");
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() >= p.load.ranks) continue;
    EXPECT_EQ(after.size(), size_t(kSteps)) << what;
    for (int s = 0; s < int(after.size()); ++s) {
      const double want = ref[size_t(kSteps + s)];
      EXPECT_NEAR(after[size_t(s)], want, 1e-5 * want) << what << ", step " << kSteps + s + 1;
    }
    if (world_rank() < p.save.ranks) {
      for (int s = 0; s < int(before.size()); ++s) {
        EXPECT_NEAR(before[size_t(s)], ref[size_t(s)], 1e-5 * ref[size_t(s)]) << what;
      }
    }
  }
  EXPECT_GE(ran, world_size() == 8 ? 20 : 1);
}

}  // namespace
}  // namespace strata
