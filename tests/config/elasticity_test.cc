// compute_elastic against DeepSpeed's own expectations, tests/unit/elasticity/test_elastic.py in
// deepspeedai/DeepSpeed (the basic 0.1 config: max_train_batch_size 10000, micro_batch_sizes
// [8, 12, 16, 17], min_gpus 32, max_gpus 1500). The full lists and the version 0.2 numbers were
// produced by running DeepSpeed's _get_compatible_gpus_v01/_v02
// (deepspeed/elasticity/elasticity.py) on the same inputs.
#include "strata/config/elasticity.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strata/core/check.h"

namespace strata {
namespace {

ElasticityConfig basic_10k() {
  ElasticityConfig e;
  e.enabled = true;
  e.max_train_batch_size = 10000;
  e.micro_batch_sizes = {8, 12, 16, 17};
  e.min_gpus = 32;
  e.max_gpus = 1500;
  e.version = 0.1;
  return e;
}

std::string error_of(const ElasticityConfig& e, int world = 0) {
  try {
    elastic_step(e, compute_elastic(e, world), world > 0 ? world : 1);
  } catch (const InputError& err) {
    return err.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// test_basic_10k: 9792 with 23 GPU counts, each dividing it into whole listed micro-batches.
TEST(Elasticity, DeepSpeedBasic10k) {
  const ElasticityConfig e = basic_10k();
  const ElasticPlan p = compute_elastic(e);
  EXPECT_EQ(p.train_batch_size, 9792);
  EXPECT_EQ(p.valid_world_sizes,
            (std::vector<int>{32,  34,  36,  48,  51,  64,  68,  72,  96,  102, 136, 144,
                              153, 192, 204, 272, 288, 306, 408, 576, 612, 816, 1224}));
  EXPECT_EQ(p.valid_dp_sizes, p.valid_world_sizes);
  for (int n : p.valid_world_sizes) {
    const ElasticStep s = elastic_step(e, p, n);
    EXPECT_EQ(s.micro_batch * s.grad_accum * n, 9792) << n;
  }
  ElasticityConfig smaller = e;
  smaller.prefer_larger_batch = false;  // one candidate has the most counts: no tie to break
  EXPECT_EQ(compute_elastic(smaller).train_batch_size, 9792);
}

// test_valid_world_size (64 → micro-batch 17) and test_invalid_world_size (128).
TEST(Elasticity, DeepSpeedWorldSize) {
  const ElasticityConfig e = basic_10k();
  const ElasticPlan p = compute_elastic(e, 64);
  const ElasticStep s = elastic_step(e, p, 64);
  EXPECT_EQ(s.micro_batch, 17);
  EXPECT_EQ(s.grad_accum, 9);  // 9792 / (17 × 64)
  EXPECT_TRUE(contains(error_of(e, 128), "world size 128 is not valid"));
}

// test_proper_mbsz (world 4 → micro-batch 3) and test_batch_size_within_max (≤ 100).
TEST(Elasticity, DeepSpeedSmallBatches) {
  ElasticityConfig e = basic_10k();
  e.max_train_batch_size = 32;
  e.micro_batch_sizes = {1, 2, 3, 7};
  e.min_gpus = 1;
  ElasticPlan p = compute_elastic(e, 4);
  EXPECT_EQ(p.train_batch_size, 24);
  EXPECT_EQ(p.valid_world_sizes, (std::vector<int>{1, 2, 3, 4, 6, 8, 12, 24}));
  EXPECT_EQ(elastic_step(e, p, 4).micro_batch, 3);
  EXPECT_TRUE(contains(error_of(e, 7), "world size 7 is not valid"));

  e.max_train_batch_size = 100;
  e.micro_batch_sizes = {8, 10, 12};
  p = compute_elastic(e);
  EXPECT_EQ(p.train_batch_size, 96);
  EXPECT_EQ(p.valid_world_sizes, (std::vector<int>{1, 2, 3, 4, 6, 8, 12}));
}

// test_model_parallel_v2_valid (mp 4, 8 GPUs per node, WORLD_SIZE 16): data-parallel size 4 is
// not in the per-node list, so DeepSpeed falls back to floor(10000 / (17·4))·17·4 = 9996.
TEST(Elasticity, DeepSpeedV02ModelParallel) {
  ElasticityConfig e = basic_10k();
  e.version = 0.2;
  e.model_parallel_size = 4;
  e.num_gpus_per_node = 8;
  ElasticPlan p = compute_elastic(e, 16);
  EXPECT_EQ(p.train_batch_size, 9996);
  EXPECT_EQ(p.valid_dp_sizes, (std::vector<int>{4}));
  EXPECT_EQ(p.valid_world_sizes, (std::vector<int>{16}));
  ElasticStep s = elastic_step(e, p, 16);
  EXPECT_EQ(s.micro_batch, 17);
  EXPECT_EQ(s.grad_accum, 147);

  // At 64 GPUs (dp 16) the per-node search holds: 4320 per node's 2 data-parallel ranks.
  const std::vector<int> dp = {8,  10, 12, 16, 18,  20,  24,  30,  36,  40,  48,  54,
                               60, 72, 80, 90, 108, 120, 144, 180, 216, 240, 270, 360};
  for (int world : {0, 64}) {
    p = compute_elastic(e, world);
    EXPECT_EQ(p.train_batch_size, 8640);
    EXPECT_EQ(p.valid_dp_sizes, dp);
    for (size_t i = 0; i < dp.size(); ++i) EXPECT_EQ(p.valid_world_sizes[i], 4 * dp[i]);
  }
  s = elastic_step(e, p, 64);
  EXPECT_EQ(s.micro_batch, 12);
  EXPECT_EQ(s.grad_accum, 45);
  EXPECT_TRUE(contains(error_of(e, 18), "not a multiple of elasticity.model_parallel_size=4"));
}

// Version 0.2, mp 2 on 8-GPU nodes: the search runs over nodes (min 1, max 8), dp 4 per node.
TEST(Elasticity, V02PerNode) {
  ElasticityConfig e;
  e.enabled = true;
  e.max_train_batch_size = 2000;
  e.micro_batch_sizes = {2, 4, 6};
  e.min_gpus = 8;
  e.max_gpus = 64;
  e.num_gpus_per_node = 8;
  e.model_parallel_size = 2;
  const ElasticPlan p = compute_elastic(e, 24);
  EXPECT_EQ(p.train_batch_size, 1920);
  EXPECT_EQ(p.valid_dp_sizes, (std::vector<int>{4, 8, 12, 16, 20, 24, 32}));
  EXPECT_EQ(p.valid_world_sizes, (std::vector<int>{8, 16, 24, 32, 40, 48, 64}));
  const ElasticStep s = elastic_step(e, p, 24);  // dp 12: 160 per rank
  EXPECT_EQ(s.micro_batch, 4);
  EXPECT_EQ(s.grad_accum, 40);
}

// DeepSpeed's error cases: test_disabled, test_missing_*, test_future_elastic_version,
// test_model_parallel_v1_invalid, test_model_parallel_v2_invalid; and a micro-batch above the
// maximum, min_gpus > max_gpus and a range no batch fits.
TEST(Elasticity, DeepSpeedErrors) {
  ElasticityConfig e = basic_10k();
  e.enabled = false;
  EXPECT_TRUE(contains(error_of(e), "elasticity.enabled is false"));
  e = basic_10k();
  e.max_train_batch_size = 0;
  EXPECT_TRUE(contains(error_of(e), "elasticity.max_train_batch_size is required"));
  e = basic_10k();
  e.micro_batch_sizes.clear();
  EXPECT_TRUE(contains(error_of(e), "elasticity.micro_batch_sizes is required"));
  e = basic_10k();
  e.version = 0.15;
  EXPECT_TRUE(contains(error_of(e), "elasticity.version=0.15"));
  e = basic_10k();
  e.model_parallel_size = 4;
  e.num_gpus_per_node = 8;
  EXPECT_TRUE(contains(error_of(e), "needs elasticity.version 0.2"));
  e.version = 0.2;
  e.model_parallel_size = 16;
  EXPECT_TRUE(contains(error_of(e, 16),
                       "elasticity.num_gpus_per_node=8 is not divisible by "
                       "elasticity.model_parallel_size=16"));
  e = basic_10k();
  e.micro_batch_sizes = {8, 20000};
  EXPECT_TRUE(contains(error_of(e),
                       "every micro-batch must be at most "
                       "elasticity.max_train_batch_size=10000"));
  e = basic_10k();
  e.min_gpus = 64;
  e.max_gpus = 32;
  EXPECT_TRUE(contains(error_of(e), "elasticity.min_gpus=64 cannot be greater than max_gpus=32"));
  e = basic_10k();
  e.min_gpus = 2000;
  e.max_gpus = 3000;
  EXPECT_TRUE(contains(error_of(e), "no batch size up to elasticity.max_train_batch_size=10000"));
}

}  // namespace
}  // namespace strata
