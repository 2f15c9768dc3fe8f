// The core invariant for context parallelism (DESIGN.md §1; transformer.h ContextOptions): every
// sequence split over 2 or 4 ranks, by Ulysses' all-to-alls or by ring attention, alone or with
// data, tensor (± sequence) and pipeline parallelism, ZeRO 1-3 (stage 3 under a pipeline too) and
// activation recompute, gives
// the single-process losses and gradient norms at every step, and the same validation loss.
// Runs under mpirun with 2, 4 and 8 ranks (tests/CMakeLists.txt); the single-process references
// are shared out over the ranks, each computed once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 10;

struct Case {
  const char* preset;
  int cp = 2;
  const char* impl = "ulysses";
  int tp = 1, pp = 1, zero = 0, micro = 1;
  bool sp = false;
  const char* recompute = "none";             // activation_checkpointing.recompute_granularity
  int seq_len = 0;                            // 0: the preset's
  int ranks() const { return cp * tp * pp; }  // times dp: the rest of the world
  std::string name(int dp) const {
    std::string s =
        std::string(preset) + " cp" + std::to_string(cp) + " " + impl + " dp" + std::to_string(dp);
    if (tp > 1) s += " tp" + std::to_string(tp) + (sp ? "+sp" : "");
    if (pp > 1) s += " pp" + std::to_string(pp) + " micro" + std::to_string(micro);
    s += " zero" + std::to_string(zero);
    if (std::string(recompute) != "none") s += " recompute " + std::string(recompute);
    if (seq_len > 0) s += " T" + std::to_string(seq_len);
    return s;
  }
};

class Context : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = test::shared_token_file("strata_cp_", 40000, 13, "cp_test", 64);
    dataset_ = data::open_dataset(path_, "llmc");
  }
  static void TearDownTestSuite() {
    dataset_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove(path_);
  }

  static nlohmann::json config(const Case& c, int global_batch) {
    nlohmann::json j = {
        {"train_batch_size", global_batch},
        {"steps_per_print", 0},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
        {"model", {{"preset", c.preset}, {"layers", 4}}},
        {"activation_checkpointing", {{"recompute_granularity", c.recompute}}}};
    if (c.seq_len > 0) j["model"]["seq_len"] = c.seq_len;
    return j;
  }

  struct Run {
    std::vector<double> loss, norm;
    double val = 0;
  };

  // kSteps steps, then the validation loss over 2 batches.
  static Run steps(Engine& engine) {
    engine.set_validation(*dataset_);
    Run r;
    for (int i = 0; i < kSteps; ++i) {
      const StepMetrics m = engine.train_batch();
      r.loss.push_back(m.loss), r.norm.push_back(m.grad_norm);
    }
    r.val = engine.evaluate(2);
    return r;
  }

  // The single-process run a case is held to: its model on the same global batch, at once.
  static nlohmann::json serial_config(const Case& c, int gbs) {
    auto j = config(c, gbs);
    j["activation_checkpointing"] = {{"recompute_granularity", "none"}};
    j["train_micro_batch_size_per_gpu"] = gbs;
    return j;
  }

  // Collective: the single-process runs of these configs, each computed once, shared out over
  // the ranks (test::shared_out) rather than each rank running every one.
  static std::map<std::string, Run> serial_runs(const std::vector<nlohmann::json>& configs) {
    std::vector<nlohmann::json> missing;
    for (const nlohmann::json& j : configs) {
      if (std::find(missing.begin(), missing.end(), j) == missing.end()) missing.push_back(j);
    }
    const auto packed = test::shared_out(missing.size(), 2 * kSteps + 1, [&](size_t i) {
      const Run r = serial(missing[i]);
      std::vector<double> v = r.loss;
      v.insert(v.end(), r.norm.begin(), r.norm.end());
      v.push_back(r.val);
      return v;
    });
    std::map<std::string, Run> out;
    for (size_t i = 0; i < missing.size(); ++i) {
      const std::vector<double>& v = packed[i];
      out[missing[i].dump()] = {{v.begin(), v.begin() + kSteps},
                                {v.begin() + kSteps, v.begin() + 2 * kSteps},
                                v[2 * kSteps]};
    }
    return out;
  }

  static Run serial(const nlohmann::json& j) {
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine engine(cfg, dataset_.get());
    return steps(engine);
  }

  static Run parallel(const Case& c, int gbs) {
    auto j = config(c, gbs);
    j["parallelism"] = {{"tensor", c.tp},
                        {"pipeline", c.pp},
                        {"sequence_parallel", c.sp},
                        {"context", c.cp},
                        {"context_impl", c.impl}};
    j["zero_optimization"] = {
        {"stage", c.zero}, {"overlap_comm", true}, {"reduce_bucket_size", 1000}};
    const comm::RankGrid grid(world_size(), c.tp, c.pp, "tp-dp-pp", c.cp);
    comm::ProcessGroups groups(grid, MPI_COMM_WORLD);
    j["train_micro_batch_size_per_gpu"] = gbs / (grid.dp() * c.micro);
    j["gradient_accumulation_steps"] = c.micro;
    Config cfg = parse_config(j);
    resolve_batch(cfg, grid.dp());
    Engine engine(cfg, dataset_.get(), &groups.dp_cp(), &groups.tp(), &groups.pp(), &groups.cp());
    return steps(engine);
  }

  static void expect_same(const Run& got, const Run& ref, const std::string& what) {
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got.loss[size_t(s)], ref.loss[size_t(s)], 1e-5 * ref.loss[size_t(s)])
          << what << " loss, step " << s + 1;
      EXPECT_NEAR(got.norm[size_t(s)], ref.norm[size_t(s)], 1e-5 * ref.norm[size_t(s)])
          << what << " grad norm, step " << s + 1;
    }
    EXPECT_NEAR(got.val, ref.val, 1e-5 * ref.val) << what << " validation loss";
  }

  static std::string path_;
  static std::unique_ptr<data::TokenDataset> dataset_;
};

std::string Context::path_;
std::unique_ptr<data::TokenDataset> Context::dataset_;

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* impl : {"ulysses", "ring"}) {
    for (int cp : {2, 4}) {
      for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
        // llama-tiny's 2 key/value groups do not divide over 4 Ulysses ranks.
        if (cp == 4 && std::string(impl) == "ulysses" && std::string(preset) == "llama-tiny") {
          continue;
        }
        v.push_back({.preset = preset, .cp = cp, .impl = impl});
      }
    }
    // Longer sequences: the tiled attention kernels and many 64-row tiles.
    v.push_back({.preset = "llama-tiny", .impl = impl, .seq_len = 256});
    v.push_back({.preset = "gpt2-tiny", .impl = impl, .zero = 3});
    v.push_back({.preset = "llama-tiny", .impl = impl, .zero = 1, .recompute = "full"});
    v.push_back({.preset = "gpt2-tiny", .impl = impl, .zero = 2, .recompute = "selective"});
    v.push_back({.preset = "gpt2-tiny", .impl = impl, .tp = 2, .zero = 1});
    v.push_back({.preset = "gpt2-tiny", .impl = impl, .tp = 2, .sp = true});
    v.push_back({.preset = "llama-tiny", .impl = "ring", .tp = 2, .zero = 3, .recompute = "full"});
    v.push_back({.preset = "llama-tiny", .impl = impl, .pp = 2, .micro = 4});
    v.push_back({.preset = "gpt2-tiny", .impl = impl, .tp = 2, .pp = 2, .zero = 1, .micro = 2});
    v.push_back({.preset = "llama-tiny", .impl = impl, .pp = 2, .zero = 3, .micro = 2});
  }
  return v;
}

// Every case whose cp × tp × pp divides the world (the rest is data parallelism), against one
// process on the same global batch.
TEST_F(Context, EveryLayoutGivesTheSingleProcessLosses) {
  const int world = world_size();
  std::vector<nlohmann::json> refs;
  for (const Case& c : cases()) {
    if (world % c.ranks() == 0) refs.push_back(serial_config(c, 8 * (world / c.ranks())));
  }
  const std::map<std::string, Run> serial = serial_runs(refs);
  int ran = 0;
  for (const Case& c : cases()) {
    if (world % c.ranks() != 0) continue;
    const int dp = world / c.ranks();
    const int gbs = 8 * dp;
    ++ran;
    expect_same(parallel(c, gbs), serial.at(serial_config(c, gbs).dump()), c.name(dp));
  }
  EXPECT_GE(ran, world == 2 ? 10 : 20);
}

// A layout the split cannot serve is refused before anything is built, naming the keys and a fix.
TEST_F(Context, UnsplittableLayoutsAreRefusedWithTheReason) {
  auto refusal = [](nlohmann::json parallelism, int seq_len) -> std::string {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1},
                        {"model", {{"preset", "llama-tiny"}, {"seq_len", seq_len}}},
                        {"parallelism", parallelism}};
    try {
      parse_config(j);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // Ulysses hands each rank whole key/value groups: llama-tiny has 2.
  EXPECT_NE(refusal({{"context", 4}}, 16).find("context_impl \"ring\""), std::string::npos);
  // Ring attention's zig-zag needs 2·cp chunks of every sequence.
  EXPECT_NE(refusal({{"context", 4}, {"context_impl", "ring"}}, 12).find("multiple of 8"),
            std::string::npos);
  EXPECT_NE(refusal({{"context", 2}, {"context_impl", "spiral"}}, 16).find("context_impl"),
            std::string::npos);
  // The CUDA backend has no context-parallel attention.
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 1},
                      {"model", {{"preset", "gpt2-tiny"}}},
                      {"parallelism", {{"context", 2}}},
                      {"train", {{"device", "cuda"}}}};
  EXPECT_THROW(parse_config(j), InputError);
}

}  // namespace
}  // namespace strata
