// The layout an elastic restart chooses (choose_elastic_layout), and the batch the elasticity block
// gives `train` (apply_elastic_batch): the global batch is kept, tensor-parallel groups stay
// inside a host, tensor × pipeline shrink only when they cannot fit, and train's own checks refuse
// what train would refuse.
#include "strata/elastic/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/config/elasticity.h"
#include "strata/core/check.h"
#include "tests/tiny_moe.h"

namespace strata {
namespace {

using json = nlohmann::json;

ConfigLoader loader(json j) {
  return [j](const std::vector<std::string>& overrides) { return parse_config(j, overrides); };
}

json tiny(json extra = json::object()) {
  json j = {{"train_batch_size", 12},
            {"train_micro_batch_size_per_gpu", 2},
            {"model", {{"preset", "llama-tiny"}}}};  // 4 heads, 2 kv heads
  j.update(extra, true);
  return j;
}

std::string error_of(const ConfigLoader& load, const std::vector<ElasticHost>& hosts, int lo,
                     int hi, int64_t batch) {
  try {
    choose_elastic_layout(load, hosts, lo, hi, batch);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ElasticLayout, FirstStartTakesTheConfigsBatchThenKeepsIt) {
  const ConfigLoader load = loader(tiny());
  // 12 = micro 2 x gas 1 x dp 6 at 6 ranks: the config as written.
  ElasticLayout first = choose_elastic_layout(load, {{"localhost", 6}}, 1, 6, 0);
  EXPECT_EQ(first.world, 6);
  EXPECT_EQ(first.batch, 12);
  EXPECT_EQ(first.micro, 2);
  EXPECT_EQ(first.accumulation, 1);
  EXPECT_TRUE(first.overrides.empty());
  // 5 workers left: 12 does not split over 5 ranks, so 4 ranks; 3 samples per rank, which
  // micro 2 does not divide: micro 1 x accumulation 3.
  ElasticLayout next = choose_elastic_layout(load, {{"localhost", 5}}, 1, 6, 12);
  EXPECT_EQ(next.world, 4);
  EXPECT_EQ(next.micro, 1);
  EXPECT_EQ(next.accumulation, 3);
  EXPECT_EQ(next.overrides,
            (std::vector<std::string>{"train_batch_size=12", "train_micro_batch_size_per_gpu=1",
                                      "gradient_accumulation_steps=3"}));
  // 3 workers: 4 samples per rank, micro 2 x accumulation 2.
  ElasticLayout three = choose_elastic_layout(load, {{"localhost", 3}}, 1, 6, 12);
  EXPECT_EQ(three.world, 3);
  EXPECT_EQ(three.micro, 2);
  EXPECT_EQ(three.accumulation, 2);
}

TEST(ElasticLayout, AMicroBatchThatNoLongerDividesShrinks) {
  // micro 4 at dp 3 (12 = 4 x 1 x 3); at dp 2 the batch per rank is 6: micro 3 x accumulation 2.
  const ConfigLoader load = loader(tiny({{"train_micro_batch_size_per_gpu", 4}}));
  const ElasticLayout l = choose_elastic_layout(load, {{"localhost", 2}}, 1, 3, 12);
  EXPECT_EQ(l.world, 2);
  EXPECT_EQ(l.micro, 3);
  EXPECT_EQ(l.accumulation, 2);
}

TEST(ElasticLayout, TensorGroupsStayInsideHosts) {
  const ConfigLoader load = loader(tiny({{"parallelism", {{"tensor", 2}}}}));
  // Hosts of 3, 2 and 1 slots: tp pairs fit 2 + 2 + 0 ranks.
  const std::vector<ElasticHost> hosts = {{"a", 3}, {"b", 2}, {"c", 1}};
  const ElasticLayout l = choose_elastic_layout(load, hosts, 1, 6, 12);
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.tensor, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.ranks_per_host, (std::vector<int>{2, 2, 0}));
  EXPECT_EQ(l.micro * l.accumulation * l.dp, 12);
}

TEST(ElasticLayout, ModelParallelismShrinksOnlyWhenItCannotFit) {
  const ConfigLoader load = loader(tiny({{"parallelism", {{"tensor", 2}, {"pipeline", 2}}}}));
  ElasticLayout kept = choose_elastic_layout(load, {{"localhost", 5}}, 1, 8, 12);
  EXPECT_EQ(kept.tensor, 2);
  EXPECT_EQ(kept.pipeline, 2);
  EXPECT_EQ(kept.world, 4);
  // 3 workers cannot hold a tp 2 x pp 2 group: tp 2 x pp 1 (tensor kept before pipeline).
  ElasticLayout shrunk = choose_elastic_layout(load, {{"localhost", 3}}, 1, 8, 12);
  EXPECT_EQ(shrunk.tensor, 2);
  EXPECT_EQ(shrunk.pipeline, 1);
  EXPECT_EQ(shrunk.world, 2);
  EXPECT_EQ(shrunk.overrides[0], "parallelism.tensor=2");
  EXPECT_EQ(shrunk.overrides[1], "parallelism.pipeline=1");
  EXPECT_EQ(shrunk.micro * shrunk.accumulation * shrunk.dp, 12);
}

TEST(ElasticLayout, ContextParallelismIsKeptThenShrunkLikeTheOtherModelAxes) {
  const ConfigLoader load =
      loader(tiny({{"parallelism", {{"tensor", 2}, {"context", 2}, {"context_impl", "ring"}}}}));
  // 6 workers: the tp 2 x cp 2 groups kept, one of them (dp 1) fits; 12 sequences on it.
  const ElasticLayout kept = choose_elastic_layout(load, {{"localhost", 6}}, 1, 8, 12);
  EXPECT_EQ(kept.world, 4);
  EXPECT_EQ(kept.tensor, 2);
  EXPECT_EQ(kept.context, 2);
  EXPECT_EQ(kept.dp, 1);
  EXPECT_TRUE(kept.overrides.size() == 3 && kept.overrides[0].rfind("train_batch_size", 0) == 0);
  EXPECT_NE(kept.describe().find("dp 1 x cp 2 x tp 2"), std::string::npos) << kept.describe();
  // 3 workers cannot hold tp 2 x cp 2: tp 2 x cp 1 (tensor kept before context), said as an
  // override of each axis.
  const ElasticLayout shrunk = choose_elastic_layout(load, {{"localhost", 3}}, 1, 8, 12);
  EXPECT_EQ(shrunk.tensor, 2);
  EXPECT_EQ(shrunk.context, 1);
  EXPECT_EQ(shrunk.world, 2);
  EXPECT_EQ(shrunk.overrides[2], "parallelism.context=1");
  EXPECT_EQ(shrunk.micro * shrunk.accumulation * shrunk.dp, 12);
}

const json kMoe = test::tiny_mixtral(8);  // eight experts, top 2

// Expert parallelism is kept while it divides the data × context ranks, then shrunk to the
// largest divisor that does (each rank holding more of the experts); the model stays as it is.
TEST(ElasticLayout, ExpertParallelismIsKeptThenShrunk) {
  const ConfigLoader load = loader(tiny({{"model", kMoe}, {"parallelism", {{"expert", 4}}}}));
  const ElasticLayout kept = choose_elastic_layout(load, {{"localhost", 8}}, 1, 8, 16);
  EXPECT_EQ(kept.world, 8);
  EXPECT_EQ(kept.expert, 4);
  EXPECT_NE(kept.describe().find("(ep 4)"), std::string::npos) << kept.describe();
  for (const std::string& o : kept.overrides)
    EXPECT_EQ(o.find("parallelism.expert"), std::string::npos);
  // 6 workers: ep 4 does not divide 6 ranks, ep 2 does.
  const ElasticLayout six = choose_elastic_layout(load, {{"localhost", 6}}, 1, 8, 12);
  EXPECT_EQ(six.world, 6);
  EXPECT_EQ(six.expert, 2);
  EXPECT_NE(std::find(six.overrides.begin(), six.overrides.end(), "parallelism.expert=2"),
            six.overrides.end());
  // 3 workers: ep 1 (every rank holds every expert).
  const ElasticLayout three = choose_elastic_layout(load, {{"localhost", 3}}, 1, 8, 12);
  EXPECT_EQ(three.expert, 1);
  EXPECT_NE(std::find(three.overrides.begin(), three.overrides.end(), "parallelism.expert=1"),
            three.overrides.end());
}

// Whole experts beside tensor parallelism (expert_tensor 1) are placed over the tensor × data
// ranks: ep 8 stays on 8 workers (tp 2 × dp 4), and shrinks to what divides tp × dp after.
TEST(ElasticLayout, WholeExpertsCountTheTensorRanks) {
  const json parallel = {
      {"tensor", 2}, {"sequence_parallel", true}, {"expert", 8}, {"expert_tensor", 1}};
  const ConfigLoader load = loader(tiny({{"model", kMoe}, {"parallelism", parallel}}));
  const ElasticLayout kept = choose_elastic_layout(load, {{"localhost", 8}}, 1, 8, 16);
  EXPECT_EQ(kept.world, 8);
  EXPECT_EQ(kept.dp, 4);
  EXPECT_EQ(kept.expert, 8) << kept.describe();
  const ElasticLayout six = choose_elastic_layout(load, {{"localhost", 6}}, 1, 8, 12);
  EXPECT_EQ(six.world, 6);
  EXPECT_EQ(six.expert, 2);
  EXPECT_NE(std::find(six.overrides.begin(), six.overrides.end(), "parallelism.expert=2"),
            six.overrides.end());
}

TEST(ElasticLayout, NothingValidIsAnErrorSayingWhy) {
  const ConfigLoader load = loader(tiny());
  // 12 over 5 ranks does not divide, and --min-ranks 5 forbids going lower.
  const std::string e = error_of(load, {{"localhost", 5}}, 5, 8, 12);
  EXPECT_NE(e.find("no valid layout for 5..8 ranks on 5 available worker(s)"), std::string::npos)
      << e;
  EXPECT_NE(error_of(load, {{"localhost", 0}}, 1, 8, 12).find("too few"), std::string::npos);
  EXPECT_NE(error_of(load, {{"localhost", 4}}, 3, 2, 12).find("--min-ranks"), std::string::npos);
}

TEST(ElasticLayout, TrainsOwnChecksApply) {
  // Sequence parallelism splits the micro-batch's token rows (micro 1 x 16) over tp 2: fine;
  // the interleaved schedule needs accumulation to be a multiple of the pipeline size.
  const ConfigLoader load = loader(
      tiny({{"train_micro_batch_size_per_gpu", 1},
            {"parallelism", {{"pipeline", 2}, {"virtual_stages", 2}, {"schedule", "interleaved"}}},
            {"model", {{"preset", "llama-tiny"}, {"layers", 4}}}}));
  // At 6 ranks, dp 3: accumulation 4 is a multiple of 2. At 4 workers... dp 2, accumulation 6.
  const ElasticLayout l = choose_elastic_layout(load, {{"localhost", 4}}, 1, 6, 12);
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.accumulation % 2, 0);
  // MiCS shard groups must divide the data-parallel size.
  const ConfigLoader mics =
      loader(tiny({{"zero_optimization", {{"stage", 1}, {"mics_shard_size", 2}}}}));
  const ElasticLayout m = choose_elastic_layout(mics, {{"localhost", 5}}, 1, 6, 12);
  EXPECT_EQ(m.world, 4) << "3 ranks would leave a shard group of 2 over dp 3";
}

TEST(ElasticLayout, TheElasticityBlockDecidesTheWorldSizesAndBatch) {
  // DeepSpeed version 0.1: micro-batches {2, 3}, at most 12: batch 12 on 1, 2, 3, 4 and 6 GPUs.
  const ConfigLoader load = loader({{"model", {{"preset", "gpt2-tiny"}}},
                                    {"elasticity",
                                     {{"enabled", true},
                                      {"max_train_batch_size", 12},
                                      {"micro_batch_sizes", {2, 3}},
                                      {"version", 0.1}}}});
  const ElasticLayout l = choose_elastic_layout(load, {{"localhost", 5}}, 1, 8, 12);
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.batch, 12);
  EXPECT_EQ(l.micro, 3);
  EXPECT_EQ(l.accumulation, 1);
  EXPECT_TRUE(l.overrides.empty()) << "train takes the batch from the block itself";
}

TEST(ElasticBatch, TheBlockSetsTrainsBatchAsDeepSpeedDoes) {
  const json block = {{"enabled", true},
                      {"max_train_batch_size", 12},
                      {"micro_batch_sizes", {2, 3}},
                      {"version", 0.1}};
  Config c = parse_config({{"model", {{"preset", "gpt2-tiny"}}}, {"elasticity", block}});
  apply_elastic_batch(c, 2);
  resolve_batch(c, 2);
  EXPECT_EQ(c.train_batch_size, 12);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 3);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  // Batch keys beside the block are refused unless ignore_non_elastic_batch_info says so.
  Config both = parse_config({{"train_batch_size", 8}, {"elasticity", block}});
  try {
    apply_elastic_batch(both, 2);
    ADD_FAILURE() << "batch keys beside an enabled elasticity block were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ignore_non_elastic_batch_info"), std::string::npos);
  }
  json ignored = block;
  ignored["ignore_non_elastic_batch_info"] = true;
  Config kept = parse_config({{"train_batch_size", 8}, {"elasticity", ignored}});
  apply_elastic_batch(kept, 2);
  resolve_batch(kept, 2);
  EXPECT_EQ(kept.train_batch_size, 12);
  // tensor x pipeline must be the block's model_parallel_size.
  Config tp = parse_config({{"model", {{"preset", "gpt2-tiny"}}},
                            {"parallelism", {{"tensor", 2}}},
                            {"elasticity", block}});
  try {
    apply_elastic_batch(tp, 2);
    ADD_FAILURE() << "tp 2 with model_parallel_size 1 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model_parallel_size"), std::string::npos);
  }
  // A disabled block changes nothing.
  Config off = parse_config({{"train_batch_size", 8}});
  apply_elastic_batch(off, 2);
  EXPECT_EQ(off.given_train_batch_size, 8);
}

}  // namespace
}  // namespace strata
