// Real DeepSpeed configs load (tests/config/ds_configs, sources in SOURCES.md there): every file
// SOURCES.md says trains parses and resolves its batch at 1 and 2 ranks once the Hugging Face
// Trainer's "auto" values are filled; every file it says is refused is refused naming the key, and
// trains without it. Around them: all of a config's errors in one message, DeepSpeed's disabled
// or printout-only blocks accepted (with a note when they would do something), features that
// would change training refused, bucket sizes of 0, and DeepSpeed's legacy spellings.
#include "tests/config/ds_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"

namespace strata {
namespace {

using nlohmann::json;
using testing::DsConfig;

const json kMinimal = {{"train_micro_batch_size_per_gpu", 1}};

json with(json j, const json& patch) {
  j.merge_patch(patch);
  return j;
}

// The InputError of parsing `j` and resolving its batch at `dp` ranks; "" when both pass.
std::string error_of(const json& j, int dp = 1) {
  try {
    Config c = parse_config(j);
    resolve_batch(c, dp);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool any_contains(const std::vector<std::string>& notes, const std::string& part) {
  return std::any_of(notes.begin(), notes.end(),
                     [&](const std::string& n) { return contains(n, part); });
}

std::vector<std::string> notes_of(const json& j, int world = 2) {
  return config_notices(parse_config(j), world);
}

class DsCorpusTest : public ::testing::TestWithParam<DsConfig> {};

TEST_P(DsCorpusTest, TrainsOrIsRefusedNamingTheKey) {
  const DsConfig& d = GetParam();
  for (int world : {1, 2}) {
    const std::string as_is = error_of(testing::ds_config_for_run(d, world, false), world);
    if (d.refused.empty()) {
      EXPECT_EQ(as_is, "") << d.name << " at " << world << " rank(s)";
      continue;
    }
    for (const std::string& key : d.refused) {
      EXPECT_TRUE(contains(as_is, key))
          << d.name << " at " << world << " rank(s): the error does not name " << key
          << "\n  error: " << as_is;
    }
    EXPECT_FALSE(contains(as_is, ".cc:")) << as_is;
    EXPECT_EQ(error_of(testing::ds_config_for_run(d, world, true), world), "")
        << d.name << " without the refused keys, at " << world << " rank(s)";
  }
}

INSTANTIATE_TEST_SUITE_P(Files, DsCorpusTest, ::testing::ValuesIn(testing::ds_configs()),
                         testing::ds_config_name);

TEST(DsCorpus, HoldsAtLeastEightConfigsThatTrainAsIs) {
  const auto& all = testing::ds_configs();
  EXPECT_GE(
      std::count_if(all.begin(), all.end(), [](const DsConfig& d) { return d.refused.empty(); }),
      8);
}

TEST(DsCorpus, TheAutoFillIsTheTrainersAndLeavesOtherAutoValues) {
  json j = testing::read_ds_config("fastchat_s3");
  testing::hf_fill_auto(j, testing::HfArgs{}, 4);
  EXPECT_EQ(j["train_batch_size"], 8);  // 4 ranks x 2 x 1
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], json::array({0.9, 0.999}));
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 32 * 32);
  EXPECT_EQ(j["zero_optimization"]["stage3_prefetch_bucket_size"], 921);
  EXPECT_EQ(j["zero_optimization"]["stage3_param_persistence_threshold"], 320);
  EXPECT_EQ(j["zero_optimization"]["sub_group_size"], "auto");  // not the Trainer's to fill
  EXPECT_EQ(j["micro_batch_size_per_gpu"], "auto");             // the typo is left as it is
}

TEST(DsCorpus, AutoInAZeroKeyTheTrainerDoesNotFillMeansTheDefault) {
  json j = testing::ds_config_for_run({"fastchat_s3", {}, {"/micro_batch_size_per_gpu"}}, 1, true);
  const Config c = parse_config(j);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
}

// ---- all of a config's errors in one run ----

TEST(ConfigErrors, ThreeMistakesInThreeBlocksAreReportedTogether) {
  const json bad = with(kMinimal, {{"zero_optimization", {{"stage", 7}}},
                                   {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "fast"}}}}},
                                   {"model", {{"preset", "gpt2-tiny"}, {"layrs", 2}}}});
  const std::string e = error_of(bad);
  EXPECT_TRUE(contains(e, "the config has 3 errors:")) << e;
  EXPECT_TRUE(contains(e, "zero_optimization.stage must be one of 0, 1, 2, 3, got 7")) << e;
  EXPECT_TRUE(contains(e, "optimizer.params.lr must be a finite number >= 0, got \"fast\"")) << e;
  EXPECT_TRUE(contains(e, "unknown key 'model.layrs'; did you mean 'model.layers'?")) << e;
}

TEST(ConfigErrors, EveryBadKeyOfOneBlockAndEveryUnknownKeyIsListed) {
  const json bad = {{"train_micro_batch_size_per_gpu", 0},
                    {"gradient_acumulation_steps", 2},
                    {"steps_per_prnt", 1},
                    {"fp16", {{"enabled", "yes"}, {"hysteresis", 0}}}};
  const std::string e = error_of(bad);
  EXPECT_TRUE(contains(e, "the config has 5 errors:")) << e;
  for (const char* part :
       {"train_micro_batch_size_per_gpu must be an integer >= 1, got 0",
        "unknown key 'gradient_acumulation_steps'", "unknown key 'steps_per_prnt'",
        "fp16.enabled must be true or false, got \"yes\"", "fp16.hysteresis must be an integer"}) {
    EXPECT_TRUE(contains(e, part)) << part << "\n  in: " << e;
  }
}

TEST(ConfigErrors, OneErrorKeepsItsMessageAsIs) {
  EXPECT_EQ(error_of(with(kMinimal, {{"zero_optimization", {{"stage", 7}}}})),
            "zero_optimization.stage must be one of 0, 1, 2, 3, got 7");
}

TEST(ConfigErrors, ABlockThatIsNotAnObjectIsListedWithTheOthers) {
  const std::string e = error_of(with(kMinimal, {{"fp16", 3}, {"bf16", {{"enabld", true}}}}));
  EXPECT_TRUE(contains(e, "the config has 2 errors:")) << e;
  EXPECT_TRUE(contains(e, "fp16 must be a block (a JSON object), got 3")) << e;
  EXPECT_TRUE(contains(e, "unknown key 'bf16.enabld'")) << e;
}

// ---- DeepSpeed blocks that are off, at their default, or a printout ----

TEST(DeepSpeedExtras, DisabledOrDefaultBlocksAreAcceptedWithoutANote) {
  const json quiet = with(kMinimal, {{"flops_profiler", {{"enabled", false}}},
                                     {"comms_logger", {{"enabled", false}}},
                                     {"torch_autocast", {{"enabled", false}}},
                                     {"data_efficiency", {{"enabled", false}}},
                                     {"dataloader_drop_last", false},
                                     {"zero_force_ds_cpu_optimizer", true},
                                     {"zero_optimization", {{"elastic_checkpoint", false}}}});
  EXPECT_EQ(error_of(quiet), "");
  EXPECT_TRUE(notes_of(quiet).empty()) << notes_of(quiet).front();
}

TEST(DeepSpeedExtras, PrintoutsAndKeysWithoutEffectAreNoted) {
  const json set =
      with(kMinimal, {{"flops_profiler", {{"enabled", true}, {"profile_step", -1}}},
                      {"comms_logger", {{"enabled", true}, {"prof_ops", {"all_reduce"}}}},
                      {"aio", {{"block_size", 1048576}, {"thread_count", 2}}},
                      {"dataloader_drop_last", true},
                      {"zero_force_ds_cpu_optimizer", false},
                      {"zero_optimization", {{"elastic_checkpoint", true}}}});
  const std::vector<std::string> n = notes_of(set);
  EXPECT_TRUE(any_contains(n,
                           "flops_profiler.enabled/profile_step have no effect: no FLOPs "
                           "profile is printed"));
  EXPECT_TRUE(any_contains(n, "comms_logger.enabled/prof_ops have no effect"));
  EXPECT_TRUE(any_contains(n, "aio.block_size/thread_count have no effect"));
  EXPECT_TRUE(any_contains(n, "dataloader_drop_last has no effect"));
  EXPECT_TRUE(any_contains(n, "zero_force_ds_cpu_optimizer=false has no effect"));
  EXPECT_TRUE(any_contains(n, "zero_optimization.elastic_checkpoint has no effect"));
}

TEST(DeepSpeedExtras, TheirValuesAreStillChecked) {
  const std::string e = error_of(with(kMinimal, {{"flops_profiler", {{"enabled", "on"}}},
                                                 {"aio", {{"queue_depth", 0}}},
                                                 {"comms_logger", {{"prof_ops", "all"}}},
                                                 {"flops_profiler2", true}}));
  EXPECT_TRUE(contains(e, "the config has 4 errors")) << e;
  EXPECT_TRUE(contains(e, "flops_profiler.enabled must be true or false")) << e;
  EXPECT_TRUE(contains(e, "aio.queue_depth must be an integer >= 1, got 0")) << e;
  EXPECT_TRUE(contains(e, "comms_logger.prof_ops must be a list of strings")) << e;
  EXPECT_TRUE(contains(e, "unknown key 'flops_profiler2'; did you mean 'flops_profiler'?")) << e;
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"aio", {{"thread_count", 2}, {"intra_op_parallelism", 2}}}})),
      "aio.thread_count is the former name of aio.intra_op_parallelism"));
}

TEST(DeepSpeedExtras, DataEfficiencyFeaturesThatChangeTrainingAreRefused) {
  const json off = {
      {"enabled", false},
      {"seed", 1234},
      {"data_sampling", {{"enabled", false}, {"curriculum_learning", {{"enabled", false}}}}},
      {"data_routing", {{"enabled", false}, {"random_ltd", {{"enabled", false}}}}}};
  EXPECT_EQ(error_of(with(kMinimal, {{"data_efficiency", off}})), "");
  EXPECT_TRUE(any_contains(notes_of(with(kMinimal, {{"data_efficiency", off}})),
                           "data_efficiency.seed/data_sampling/data_routing have no effect"));
  for (const char* pointer :
       {"/data_sampling/enabled", "/data_sampling/curriculum_learning/enabled",
        "/data_routing/enabled", "/data_routing/random_ltd/enabled"}) {
    json on = off;
    on["enabled"] = true;
    on[json::json_pointer(pointer)] = true;
    std::string key = std::string("data_efficiency") + pointer;
    std::replace(key.begin(), key.end(), '/', '.');
    const std::string e = error_of(with(kMinimal, {{"data_efficiency", on}}));
    EXPECT_TRUE(contains(e, key + "=true: ")) << e;
    EXPECT_TRUE(contains(e, "set " + key + "=false")) << e;
  }
  json switched = off;
  switched["enabled"] = true;
  EXPECT_TRUE(
      any_contains(notes_of(with(kMinimal, {{"data_efficiency", switched}})),
                   "data_efficiency.enabled/seed/data_sampling/data_routing have no effect"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"data_efficiency", {{"data_sampling", {{"enabled", 1}}}}}})),
      "data_efficiency.data_sampling.enabled must be true or false, got 1"));
}

TEST(DeepSpeedExtras, TorchAutocastIsNotedOverItsOwnDtypeAndRefusedOverAnother) {
  const json ac = {{"torch_autocast", {{"enabled", true}, {"dtype", "torch.bfloat16"}}}};
  const json bf16 = with(with(kMinimal, ac), {{"bf16", {{"enabled", true}}}});
  EXPECT_EQ(error_of(bf16), "");
  EXPECT_TRUE(any_contains(notes_of(bf16),
                           "torch_autocast.enabled/dtype have no effect: the "
                           "model already runs in bf16"));
  const std::string e = error_of(with(kMinimal, ac));
  EXPECT_TRUE(contains(e, "torch_autocast.enabled=true computes in bf16 over fp32 parameters"))
      << e;
  EXPECT_TRUE(contains(e, "set bf16.enabled=true")) << e;
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"torch_autocast", {{"dtype", "int8"}}}})),
                       "torch_autocast.dtype must be \"torch.bfloat16\" or \"torch.float16\""));
}

// ---- bucket sizes of 0 (DeepSpeed's fields are ge=0) ----

TEST(ZeroBuckets, ZeroIsAcceptedWhereDeepSpeedAcceptsIt) {
  const Config c = parse_config(with(kMinimal, {{"zero_optimization",
                                                 {{"stage", 3},
                                                  {"reduce_bucket_size", 0},
                                                  {"allgather_bucket_size", 0},
                                                  {"stage3_prefetch_bucket_size", 0},
                                                  {"stage3_max_live_parameters", 0},
                                                  {"stage3_max_reuse_distance", 0},
                                                  {"stage3_param_persistence_threshold", 0},
                                                  {"sub_group_size", 0}}}}));
  EXPECT_EQ(c.zero.reduce_bucket_size, 0);
  EXPECT_EQ(c.zero.allgather_bucket_size, 0);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 0);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 0);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 0);
  EXPECT_EQ(c.zero.sub_group_size, 0);
  // Below zero stays an error, listed for each key.
  const std::string e = error_of(with(
      kMinimal, {{"zero_optimization", {{"reduce_bucket_size", -1}, {"sub_group_size", -1}}}}));
  EXPECT_TRUE(contains(e, "zero_optimization.reduce_bucket_size must be an integer >= 0, got -1"))
      << e;
  EXPECT_TRUE(contains(e, "zero_optimization.sub_group_size must be an integer >= 0, got -1")) << e;
}

TEST(ZeroBuckets, SubGroupAndAllgatherSizesOfZeroAreNotedAsWithoutEffect) {
  const std::vector<std::string> n = notes_of(
      with(kMinimal, {{"zero_optimization",
                       {{"stage", 2}, {"sub_group_size", 0}, {"allgather_bucket_size", 0}}}}));
  EXPECT_TRUE(any_contains(n, "zero_optimization.sub_group_size has no effect"));
  EXPECT_TRUE(any_contains(n, "zero_optimization.allgather_bucket_size has no effect"));
}

// ---- DeepSpeed's legacy spellings ----

TEST(LegacySpellings, BfloatSixteenBlockAndGatherFp16AreAliases) {
  const Config c = parse_config(with(
      kMinimal, {{"bfloat16", {{"enabled", true}}},
                 {"zero_optimization", {{"stage3_gather_fp16_weights_on_model_save", true}}}}));
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
}

TEST(LegacySpellings, CpuOffloadSwitchesMapToTheOffloadBlocks) {
  const Config c = parse_config(with(
      kMinimal,
      {{"zero_optimization", {{"stage", 3}, {"cpu_offload", true}, {"cpu_offload_param", true}}}}));
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_EQ(c.zero.offload_param.device, "cpu");
  const Config off =
      parse_config(with(kMinimal, {{"zero_optimization", {{"cpu_offload", false}}}}));
  EXPECT_EQ(off.zero.offload_optimizer.device, "none");
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"zero_optimization",
                                                 {{"cpu_offload", true},
                                                  {"offload_optimizer", {{"device", "cpu"}}}}}})),
                       "zero_optimization.cpu_offload is the deprecated form of "
                       "zero_optimization.offload_optimizer; give only"));
  EXPECT_TRUE(any_contains(
      notes_of(with(kMinimal, {{"zero_optimization", {{"cpu_offload_use_pin_memory", true}}}})),
      "zero_optimization.cpu_offload_use_pin_memory has no effect"));
}

TEST(LegacySpellings, BfpSixteenIsReadAsBf16WithANote) {
  // Older DeepSpeed spelt bf16 "bfp16" here (and only so); v0.19 refuses it. strata reads both.
  const json j = with(kMinimal, {{"communication_data_type", "bfp16"}});
  EXPECT_EQ(*parse_config(j).communication_data_type, DType::BF16);
  EXPECT_TRUE(any_contains(notes_of(j), "communication_data_type \"bfp16\" is read as \"bf16\""));
  EXPECT_EQ(
      *parse_config(with(kMinimal, {{"communication_data_type", "BF16"}})).communication_data_type,
      DType::BF16);
  EXPECT_FALSE(
      any_contains(notes_of(with(kMinimal, {{"communication_data_type", "bf16"}})), "bfp16"));
}

// ---- schedulers as DeepSpeed runs them ----

TEST(Schedulers, WarmupDecayTotalBelowWarmupIsAcceptedWithANote) {
  const json j =
      with(kMinimal, {{"scheduler",
                       {{"type", "WarmupDecayLR"},
                        {"params", {{"total_num_steps", 2}, {"warmup_num_steps", 10}}}}}});
  EXPECT_EQ(error_of(j), "");
  EXPECT_TRUE(any_contains(notes_of(j),
                           "scheduler.params.total_num_steps=2 is below "
                           "scheduler.params.warmup_num_steps=10"));
  // WarmupCosineLR divides by total - warmup: still refused.
  EXPECT_TRUE(
      contains(error_of(with(kMinimal,
                             {{"scheduler",
                               {{"type", "WarmupCosineLR"},
                                {"params", {{"total_num_steps", 2}, {"warmup_num_steps", 10}}}}}})),
               "must be greater than scheduler.params.warmup_num_steps=10"));
}

}  // namespace
}  // namespace strata
