// activation_checkpointing in effect from the config alone: the block turns it on,
// recompute_granularity and recompute_method choose what each block recomputes,
// recompute_options() hands that to the model, and config_notices names every key that has no
// effect where it is set.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"

namespace strata {
namespace {

using nlohmann::json;

const json kMinimal = {{"train_micro_batch_size_per_gpu", 1}};

// kMinimal with an activation_checkpointing block `ac` and the other blocks of `patch`.
json config_with(const json& ac, const json& patch = json::object()) {
  json j = kMinimal;
  j["activation_checkpointing"] = ac;
  j.update(patch, true);
  return j;
}

// A model of `layers` blocks (the demo preset's other sizes).
json layers(int n) {
  return {{"model", {{"preset", "demo"}, {"layers", n}}}};
}

std::string error_of(const json& j) {
  try {
    parse_config(j);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The blocks recompute_options marks for full recompute; `full` must have one entry per block.
std::vector<int> full_blocks(const Config& c) {
  const RecomputeOptions r = recompute_options(c);
  EXPECT_EQ(r.full.size(), size_t(c.model.layers));
  std::vector<int> out;
  for (int b = 0; b < int(r.full.size()); ++b) {
    if (r.full[size_t(b)]) out.push_back(b);
  }
  return out;
}

std::vector<int> full_blocks(const json& ac, int L) {
  return full_blocks(parse_config(config_with(ac, layers(L))));
}

std::vector<int> all_blocks(int L) {
  std::vector<int> v;
  for (int b = 0; b < L; ++b) v.push_back(b);
  return v;
}

// The notes that mention activation_checkpointing.
std::vector<std::string> ac_notes(const json& j, int world = 1) {
  std::vector<std::string> out;
  for (const std::string& n : config_notices(parse_config(j), world)) {
    if (n.find("activation_checkpointing") != std::string::npos) out.push_back(n);
  }
  return out;
}

TEST(ConfigRecompute, WithoutTheBlockNothingIsRecomputed) {
  const Config c = parse_config(kMinimal);
  EXPECT_FALSE(c.activation_checkpointing.enabled);
  const RecomputeOptions r = recompute_options(c);
  EXPECT_TRUE(r.full.empty());
  EXPECT_FALSE(r.any_full());
  EXPECT_FALSE(r.selective || r.partition || r.host || r.synchronize);
}

TEST(ConfigRecompute, AnEmptyBlockFullyRecomputesEveryBlock) {
  const Config c = parse_config(config_with(json::object()));
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.activation_checkpointing.recompute_granularity, "full");
  EXPECT_EQ(c.activation_checkpointing.recompute_method, "uniform");
  EXPECT_EQ(full_blocks(c), all_blocks(c.model.layers));
  const RecomputeOptions r = recompute_options(c);
  EXPECT_FALSE(r.selective || r.partition || r.host || r.synchronize);
  EXPECT_TRUE(config_notices(c, 1).empty());
  EXPECT_TRUE(config_notices(c, 4).empty());
}

TEST(ConfigRecompute, UniformSpreadsTheCheckpointsEvenly) {
  EXPECT_EQ(full_blocks({{"number_checkpoints", 4}}, 12), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(full_blocks({{"number_checkpoints", 5}}, 12), (std::vector<int>{0, 2, 4, 7, 9}));
  EXPECT_EQ(full_blocks({{"number_checkpoints", 1}}, 12), (std::vector<int>{0}));
  EXPECT_EQ(full_blocks({{"number_checkpoints", 6}, {"recompute_method", "uniform"}}, 12),
            (std::vector<int>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(full_blocks({{"number_checkpoints", 12}}, 12), all_blocks(12));
  EXPECT_EQ(full_blocks(json::object(), 12), all_blocks(12));
}

TEST(ConfigRecompute, BlockTakesTheFirstBlocks) {
  EXPECT_EQ(full_blocks({{"recompute_method", "block"}, {"number_checkpoints", 3}}, 12),
            (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(full_blocks({{"recompute_method", "block"}, {"number_checkpoints", 12}}, 12),
            all_blocks(12));
  EXPECT_EQ(full_blocks({{"recompute_method", "block"}}, 12), all_blocks(12));
}

// Over every n of every L up to 16: n distinct blocks, uniform's k-th at floor(k·L/n), block's
// the first n.
TEST(ConfigRecompute, EitherMethodRecomputesExactlyNBlocks) {
  for (int L = 1; L <= 16; ++L) {
    for (int n = 1; n <= L; ++n) {
      const std::vector<int> uniform = full_blocks({{"number_checkpoints", n}}, L);
      ASSERT_EQ(uniform.size(), size_t(n)) << "L=" << L << " n=" << n;
      for (int k = 0; k < n; ++k) EXPECT_EQ(uniform[size_t(k)], k * L / n) << L << " " << n;
      EXPECT_EQ(full_blocks({{"number_checkpoints", n}, {"recompute_method", "block"}}, L),
                all_blocks(n))
          << "L=" << L << " n=" << n;
    }
  }
}

TEST(ConfigRecompute, HostPartitionAndSynchronizeFollowTheirKeys) {
  const json ac = {{"partition_activations", true},
                   {"cpu_checkpointing", true},
                   {"synchronize_checkpoint_boundary", true},
                   {"profile", true}};
  const json tp2 = {{"parallelism", {{"tensor", 2}}}};
  const Config c = parse_config(config_with(ac, tp2));
  EXPECT_TRUE(c.activation_checkpointing.profile);
  const RecomputeOptions r = recompute_options(c);
  EXPECT_TRUE(r.partition);
  EXPECT_TRUE(r.host);
  EXPECT_TRUE(r.synchronize);
  EXPECT_FALSE(r.selective);
  EXPECT_TRUE(r.any_full());
  EXPECT_TRUE(ac_notes(config_with(ac, tp2), 4).empty()) << "every key takes effect";

  const RecomputeOptions plain = recompute_options(parse_config(config_with(json::object(), tp2)));
  EXPECT_FALSE(plain.partition || plain.host || plain.synchronize);
}

TEST(ConfigRecompute, PartitionActivationsNeedsTensorParallelismWithoutSequenceParallelism) {
  const json ac = {{"partition_activations", true}};
  EXPECT_FALSE(recompute_options(parse_config(config_with(ac))).partition);
  EXPECT_EQ(ac_notes(config_with(ac)),
            (std::vector<std::string>{
                "activation_checkpointing.partition_activations has no effect at "
                "parallelism.tensor=1: nothing to shard a checkpoint across (tensor-parallel size "
                "1)"}));

  const json sp = {{"parallelism", {{"tensor", 2}, {"sequence_parallel", true}}}};
  EXPECT_FALSE(recompute_options(parse_config(config_with(ac, sp))).partition);
  EXPECT_EQ(ac_notes(config_with(ac, sp), 4),
            (std::vector<std::string>{
                "activation_checkpointing.partition_activations has no effect with "
                "parallelism.sequence_parallel: each rank's checkpoints are already its own block "
                "of rows"}));

  const json tp2 = {{"parallelism", {{"tensor", 2}}}};
  EXPECT_TRUE(recompute_options(parse_config(config_with(ac, tp2))).partition);
  EXPECT_TRUE(ac_notes(config_with(ac, tp2), 4).empty());
}

TEST(ConfigRecompute, ContiguousMemoryOptimizationIsAlwaysOn) {
  const std::string off_note =
      "activation_checkpointing.contiguous_memory_optimization=false has no effect: strata always "
      "keeps all checkpoints in one preallocated buffer";
  EXPECT_EQ(ac_notes(config_with({{"contiguous_memory_optimization", false}})),
            (std::vector<std::string>{off_note}));
  EXPECT_TRUE(ac_notes(config_with({{"contiguous_memory_optimization", true}})).empty());
  EXPECT_TRUE(ac_notes(config_with(json::object())).empty());
}

TEST(ConfigRecompute, SelectiveRecomputesEveryBlocksAttentionCoreAndKeepsNoCheckpoints) {
  const Config c = parse_config(config_with({{"recompute_granularity", "selective"},
                                             {"synchronize_checkpoint_boundary", true},
                                             {"profile", true}}));
  const RecomputeOptions r = recompute_options(c);
  EXPECT_TRUE(r.selective);
  EXPECT_TRUE(r.full.empty());
  EXPECT_TRUE(r.synchronize) << "the attention recompute is synchronised";
  EXPECT_TRUE(ac_notes(config_with({{"recompute_granularity", "selective"},
                                    {"synchronize_checkpoint_boundary", true},
                                    {"profile", true}}))
                  .empty())
      << "synchronize and profile apply to the attention recompute";

  const json all = {{"recompute_granularity", "selective"},
                    {"number_checkpoints", 2},
                    {"recompute_method", "block"},
                    {"partition_activations", true},
                    {"cpu_checkpointing", true}};
  const json tp2 = {{"parallelism", {{"tensor", 2}}}};
  const RecomputeOptions s = recompute_options(parse_config(config_with(all, tp2)));
  EXPECT_TRUE(s.selective);
  EXPECT_TRUE(s.full.empty());
  EXPECT_FALSE(s.partition);
  EXPECT_FALSE(s.host);
  EXPECT_EQ(ac_notes(config_with(all, tp2), 4),
            (std::vector<std::string>{
                "activation_checkpointing.number_checkpoints/recompute_method have no effect with "
                "activation_checkpointing.recompute_granularity=selective: every block recomputes "
                "its attention core and none is fully recomputed",
                "activation_checkpointing.partition_activations/cpu_checkpointing have no effect "
                "with activation_checkpointing.recompute_granularity=selective: selective "
                "recompute keeps no checkpoints"}));
}

TEST(ConfigRecompute, NoneTurnsCheckpointingOffAndNotesEveryOtherKey) {
  const Config c = parse_config(config_with({{"recompute_granularity", "none"}}));
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  const RecomputeOptions r = recompute_options(c);
  EXPECT_TRUE(r.full.empty());
  EXPECT_FALSE(r.selective || r.partition || r.host || r.synchronize);
  EXPECT_TRUE(config_notices(c, 1).empty());

  const json all = {{"recompute_granularity", "none"},
                    {"cpu_checkpointing", true},
                    {"number_checkpoints", 2},
                    {"profile", true}};
  const Config off = parse_config(config_with(all));
  const RecomputeOptions o = recompute_options(off);
  EXPECT_TRUE(o.full.empty());
  EXPECT_FALSE(o.host);
  EXPECT_EQ(ac_notes(config_with(all)),
            (std::vector<std::string>{
                "activation_checkpointing.cpu_checkpointing/number_checkpoints/profile have no "
                "effect: activation_checkpointing.recompute_granularity=none turns checkpointing "
                "off"}));
}

TEST(ConfigRecompute, RecomputeMethodNeedsNumberCheckpoints) {
  EXPECT_EQ(ac_notes(config_with({{"recompute_method", "block"}})),
            (std::vector<std::string>{
                "activation_checkpointing.recompute_method=block has no effect without "
                "activation_checkpointing.number_checkpoints: every block is fully recomputed"}));
  EXPECT_TRUE(
      ac_notes(config_with({{"recompute_method", "block"}, {"number_checkpoints", 2}})).empty());
  EXPECT_TRUE(ac_notes(config_with({{"number_checkpoints", 2}})).empty());
}

TEST(ConfigRecompute, BadValuesNameTheKeyAndWhatIsAllowed) {
  EXPECT_EQ(error_of(config_with({{"recompute_granularity", "partial"}})),
            "activation_checkpointing.recompute_granularity must be one of \"full\", "
            "\"selective\", \"none\", got \"partial\"");
  EXPECT_EQ(error_of(config_with({{"recompute_granularity", "ful"}})),
            "activation_checkpointing.recompute_granularity must be one of \"full\", "
            "\"selective\", \"none\", got \"ful\"; did you mean \"full\"?");
  EXPECT_EQ(error_of(config_with({{"recompute_granularity", true}})),
            "activation_checkpointing.recompute_granularity must be one of \"full\", "
            "\"selective\", \"none\", got true");
  EXPECT_EQ(error_of(config_with({{"recompute_method", "even"}})),
            "activation_checkpointing.recompute_method must be one of \"uniform\", \"block\", got "
            "\"even\"");
  EXPECT_NE(error_of(config_with({{"number_checkpoints", 0}}))
                .find("activation_checkpointing.number_checkpoints must be"),
            std::string::npos);
  EXPECT_EQ(error_of(config_with({{"number_checkpoints", nullptr}})), "") << "DeepSpeed's None";
  EXPECT_NE(error_of(config_with({{"recompute_granuarity", "full"}}))
                .find("did you mean 'activation_checkpointing.recompute_granularity'?"),
            std::string::npos);
}

TEST(ConfigRecompute, NumberCheckpointsBeyondTheModelsBlocksIsRefused) {
  EXPECT_EQ(error_of(config_with({{"number_checkpoints", 13}}, layers(12))),
            "activation_checkpointing.number_checkpoints=13 exceeds the model's 12 blocks; set "
            "1..12 or remove it to checkpoint every block");
  // Checked against the model as given, whichever block comes first in the file.
  EXPECT_EQ(error_of(config_with({{"number_checkpoints", 5}})),
            "activation_checkpointing.number_checkpoints=5 exceeds the model's 4 blocks; set 1..4 "
            "or remove it to checkpoint every block");
  EXPECT_EQ(error_of(config_with({{"number_checkpoints", 12}}, layers(12))), "");
}

// The seed config: full recompute of every block with the checkpoints in host memory;
// partition_activations has nothing to shard across at tensor 1.
TEST(ConfigRecompute, SeedConfigRecomputesEveryBlockIntoHostMemory) {
  const std::string seed = std::string(STRATA_SOURCE_DIR) + "/configs/seed_ds_config.json";
  const Config c = load_config(seed);
  EXPECT_EQ(full_blocks(c), all_blocks(c.model.layers));
  const RecomputeOptions r = recompute_options(c);
  EXPECT_TRUE(r.host);
  EXPECT_FALSE(r.partition);
  EXPECT_FALSE(r.selective);
  EXPECT_FALSE(r.synchronize);
  std::vector<std::string> notes;
  for (const std::string& n : config_notices(c, 4)) {
    if (n.find("activation_checkpointing") != std::string::npos) notes.push_back(n);
  }
  EXPECT_EQ(notes,
            (std::vector<std::string>{
                "activation_checkpointing.partition_activations has no effect at "
                "parallelism.tensor=1: nothing to shard a checkpoint across (tensor-parallel size "
                "1)"}));

  const Config off = load_config(seed, {"activation_checkpointing.recompute_granularity=none"});
  EXPECT_TRUE(recompute_options(off).full.empty());
  EXPECT_FALSE(recompute_options(off).host);
}

}  // namespace
}  // namespace strata
