// The config parser: the seed config, DeepSpeed's defaults, the batch triangle, "auto", overrides,
// strict JSON, and the notices for settings not in effect.
#include "strata/config/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/check.h"
#include "tests/tiny_moe.h"

namespace strata {
namespace {

using nlohmann::json;

const json kMinimal = {{"train_micro_batch_size_per_gpu", 1}};

// `j` with `patch` merged in, objects recursively; unlike merge_patch, null is kept as a value.
json with(json j, const json& patch) {
  j.update(patch, true);
  return j;
}

// The InputError message of parsing `j` (with `overrides`); "" when it parses.
std::string error_of(const json& j, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(j, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The InputError message of parse_json_strict on `text`; "" when it parses.
std::string error_of_text(const std::string& text) {
  try {
    parse_json_strict(text, "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines) {
    if (contains(l, part)) return true;
  }
  return false;
}

TEST(Config, SeedConfigLoadsUnchanged) {
  Config c = load_config(std::string(STRATA_SOURCE_DIR) + "/configs/seed_ds_config.json");
  EXPECT_EQ(c.given_micro_batch, 1);
  EXPECT_EQ(c.given_grad_accum, 16);
  EXPECT_EQ(c.given_train_batch_size, 0);
  EXPECT_EQ(c.train_batch_size, 0) << "parse_config must not resolve the batch";
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.param_dtype(), DType::BF16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  ASSERT_TRUE(c.communication_data_type.has_value());
  EXPECT_EQ(*c.communication_data_type, DType::BF16);
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.activation_checkpointing.recompute_granularity, "full");
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(c.activation_checkpointing.contiguous_memory_optimization, true);
  EXPECT_EQ(c.grad_accum_dtype, DType::F32);  // strata's default (DeepSpeed's: the model dtype)
  EXPECT_EQ(c.model.preset, "demo");          // no model block
  resolve_batch(c, 1);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 16);

  const std::vector<std::string> notes = config_notices(c, 1);
  EXPECT_TRUE(any_contains(notes, "zero_optimization.stage=3 is honoured trivially"));
  EXPECT_TRUE(any_contains(notes, "zero_optimization.overlap_comm"));
  EXPECT_TRUE(any_contains(notes, "activation_checkpointing.partition_activations"));
  EXPECT_TRUE(any_contains(notes, "communication_data_type=bf16"));
}

TEST(Config, DeepSpeedDefaults) {
  Config c = parse_config(kMinimal);
  EXPECT_FLOAT_EQ(c.gradient_clipping, 1.0f);
  EXPECT_EQ(c.steps_per_print, 10);  // strata prints progress; DeepSpeed's None is null here
  EXPECT_EQ(parse_config(with(kMinimal, {{"steps_per_print", nullptr}})).steps_per_print, 0);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_EQ(c.comm_dtype(), DType::F32);
  EXPECT_EQ(c.grad_accum_dtype, DType::F32);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_FLOAT_EQ(c.gradient_predivide_factor, 1.0f);

  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0.0f);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_FALSE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0f);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(c.bf16.check_grad_overflow);

  const ZeroConfig& z = c.zero;
  EXPECT_EQ(z.stage, 0);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_TRUE(z.stage3_reshard_after_forward);
  EXPECT_EQ(z.stage3_model_persistence_threshold, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_FALSE(z.round_robin_gradients);
  EXPECT_EQ(z.offload_param.device, "none");
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100000000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1000000000);
  EXPECT_TRUE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);

  EXPECT_FALSE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.activation_checkpointing.recompute_granularity, "full");
  EXPECT_EQ(c.activation_checkpointing.recompute_method, "uniform");
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_FALSE(c.activation_checkpointing.contiguous_memory_optimization.has_value());
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_FALSE(c.checkpoint.load_universal);
  EXPECT_FALSE(c.checkpoint.use_node_local_storage);
  EXPECT_FALSE(c.checkpoint.parallel_write_pipeline_stage);
  EXPECT_FALSE(c.elasticity.enabled);
  EXPECT_EQ(c.elasticity.max_gpus, 10000);
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_EQ(c.wandb.project, "deepspeed");

  EXPECT_EQ(c.parallelism.tensor, 1);
  EXPECT_EQ(c.parallelism.order, "tp-dp-pp");
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_TRUE(config_notices(c, 1).empty());
}

TEST(Config, OptimizerDefaultsAsDeepSpeed) {
  Config adam = parse_config(with(kMinimal, {{"optimizer", {{"type", "adam"}}}}));
  EXPECT_EQ(adam.optimizer.type, "adam");
  EXPECT_FLOAT_EQ(adam.optimizer.lr, 1e-3f);
  EXPECT_FLOAT_EQ(adam.optimizer.beta1, 0.9f);
  EXPECT_FLOAT_EQ(adam.optimizer.beta2, 0.999f);
  EXPECT_FLOAT_EQ(adam.optimizer.eps, 1e-8f);
  EXPECT_FLOAT_EQ(adam.optimizer.weight_decay, 0.0f);  // FusedAdam's default
  EXPECT_TRUE(adam.optimizer.adam_w_mode);             // DeepSpeed's Adam is AdamW by default

  Config l2 = parse_config(
      with(kMinimal, {{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}}));
  EXPECT_FALSE(l2.optimizer.adam_w_mode);

  Config w = parse_config(with(
      kMinimal, {{"optimizer",
                  {{"type", "ADAMW"},
                   {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.1}}}}}}));
  EXPECT_EQ(w.optimizer.type, "adamw");
  EXPECT_TRUE(w.optimizer.adam_w_mode);
  EXPECT_FLOAT_EQ(w.optimizer.lr, 3e-4f);
  EXPECT_FLOAT_EQ(w.optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(w.optimizer.weight_decay, 0.1f);

  // torch_adam picks torch.optim.AdamW, whose default decay is 0.01.
  Config torch = parse_config(
      with(kMinimal, {{"optimizer", {{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}}}));
  EXPECT_FLOAT_EQ(torch.optimizer.weight_decay, 0.01f);

  Config sgd = parse_config(with(
      kMinimal,
      {{"optimizer", {{"type", "sgd"}, {"params", {{"momentum", 0.9}, {"nesterov", true}}}}}}));
  EXPECT_EQ(sgd.optimizer.type, "sgd");
  EXPECT_FLOAT_EQ(sgd.optimizer.momentum, 0.9f);
  EXPECT_TRUE(sgd.optimizer.nesterov);
  EXPECT_FLOAT_EQ(sgd.optimizer.weight_decay, 0.0f);

  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"optimizer", {{"params", {{"lr", 1}}}}}})),
                       "optimizer.type is required"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal,
                    {{"optimizer", {{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}}})),
      "optimizer.params.adam_w_mode=false"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9}}}}}}})),
      "optimizer.params.betas must be two numbers in [0, 1)"));
}

TEST(Config, SchedulerDefaultsAsDeepSpeed) {
  Config w =
      parse_config(with(kMinimal, {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}}}}},
                                   {"scheduler", {{"type", "WarmupLR"}}}}));
  EXPECT_EQ(w.scheduler.type, "WarmupLR");
  EXPECT_FLOAT_EQ(w.scheduler.warmup_min_lr, 0.0f);
  EXPECT_FLOAT_EQ(w.scheduler.warmup_max_lr, 3e-4f);  // unset: the optimizer's lr
  EXPECT_EQ(w.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(w.scheduler.warmup_type, "log");

  Config d = parse_config(with(
      kMinimal,
      {{"scheduler",
        {{"type", "WarmupDecayLR"},
         {"params",
          {{"total_num_steps", 5000}, {"warmup_max_lr", 0.01}, {"warmup_type", "linear"}}}}}}));
  EXPECT_EQ(d.scheduler.total_num_steps, 5000);
  EXPECT_FLOAT_EQ(d.scheduler.warmup_max_lr, 0.01f);
  EXPECT_EQ(d.scheduler.warmup_type, "linear");

  Config cos = parse_config(
      with(kMinimal,
           {{"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 2000}}}}}}));
  EXPECT_FLOAT_EQ(cos.scheduler.cos_min_ratio, 1e-4f);
  EXPECT_FLOAT_EQ(cos.scheduler.warmup_min_ratio, 0.0f);
  EXPECT_EQ(cos.scheduler.warmup_num_steps, 1000);

  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"scheduler",
                                {{"type", "WarmupCosineLR"},
                                 {"params", {{"total_num_steps", 10}, {"warmup_max_lr", 0.1}}}}}})),
      "scheduler.params.warmup_max_lr is not a parameter of WarmupCosineLR"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"scheduler", {{"type", "warmuplr"}}}})),
                       "did you mean \"WarmupLR\"?"));
  // DeepSpeed takes warmup_num_steps 0 (the Hugging Face Trainer's default fills it) and warms
  // up over max(2, it) steps.
  EXPECT_EQ(parse_config(
                with(kMinimal, {{"scheduler",
                                 {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 0}}}}}}))
                .scheduler.warmup_num_steps,
            0);
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"scheduler",
                                {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", -1}}}}}})),
      "scheduler.params.warmup_num_steps must be an integer >= 0, got -1"));
}

TEST(Config, OverlapCommFollowsTheStageWhenUnset) {
  auto zero = [](const json& z) {
    return parse_config(with(kMinimal, {{"zero_optimization", z}})).zero;
  };
  EXPECT_TRUE(zero({{"stage", 3}}).overlap_comm);
  EXPECT_FALSE(zero({{"stage", 2}}).overlap_comm);
  EXPECT_FALSE(zero({{"stage", 3}, {"overlap_comm", false}}).overlap_comm);
  EXPECT_TRUE(zero({{"stage", 1}, {"overlap_comm", true}}).overlap_comm);
  EXPECT_TRUE(zero({{"stage", 3}, {"overlap_comm", nullptr}}).overlap_comm);
}

// DeepSpeed's sequence_parallel_size is DeepSpeed-Ulysses' degree: strata's context parallelism
// by all-to-all; naming a different parallelism.context too is refused.
TEST(Config, SequenceParallelSizeIsUlyssesContextParallelism) {
  const json model = {{"preset", "gpt2-tiny"}};
  const Config c = parse_config(with(kMinimal, {{"sequence_parallel_size", 2}, {"model", model}}));
  EXPECT_EQ(c.parallelism.context, 2);
  EXPECT_EQ(c.parallelism.context_impl, "ulysses");
  EXPECT_EQ(parse_config(with(kMinimal, {{"sequence_parallel_size", 2},
                                         {"model", model},
                                         {"parallelism", {{"context", 2}}}}))
                .parallelism.context,
            2);
  try {
    parse_config(
        with(kMinimal,
             {{"sequence_parallel_size", 2}, {"model", model}, {"parallelism", {{"context", 4}}}}));
    ADD_FAILURE() << "disagreeing sizes accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
}

TEST(Config, AutoMeansDefaultInsideDeepSpeedsPydanticBlocks) {
  Config c = parse_config(with(kMinimal, {{"zero_optimization",
                                           {{"stage", "auto"},
                                            {"reduce_bucket_size", "auto"},
                                            {"overlap_comm", "auto"},
                                            {"offload_optimizer", {{"device", "auto"}}}}},
                                          {"bf16", {{"enabled", "auto"}}},
                                          {"fp16", {{"enabled", "auto"}, {"loss_scale", "auto"}}},
                                          {"tensorboard", {{"enabled", "auto"}}}}));
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.offload_optimizer.device, "none");
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_FALSE(c.fp16.enabled);
  // Outside those blocks "auto" is an error that says why.
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"gradient_clipping", "auto"}})),
                       "gradient_clipping must be a finite number >= 0, got \"auto\""));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"train", {{"steps", "auto"}}}})), "Hugging Face Trainer"));
}

TEST(Config, IntegralFloatsAreAcceptedForIntegerKeys) {
  Config c = parse_config(
      with(kMinimal,
           {{"zero_optimization",
             {{"reduce_bucket_size", 5e8}, {"stage3_prefetch_bucket_size", 5e7}, {"stage", 2.0}}},
            {"train", {{"steps", 1e3}}}}));
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"zero_optimization", {{"allgather_bucket_size", 3}}}})),
               "zero_optimization.allgather_bucket_size must be an even integer"));
}

TEST(Config, ZeroAliasesAndOffload) {
  Config c = parse_config(with(
      kMinimal,
      {{"zero_optimization",
        {{"stage", 3},
         {"prefetch_bucket_size", 1000},
         {"max_live_parameters", 2000},
         {"stage3_gather_16bit_weights_on_model_save", true},
         {"offload_param", {{"device", "cpu"}}},
         {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/nvme"}, {"ratio", 0.5}}}}}}));
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 2000);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.offload_param.device, "cpu");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/nvme");
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 0.5);
  const std::vector<std::string> notes = config_notices(c, 1);
  EXPECT_TRUE(any_contains(
      notes, "zero_optimization.offload_param.device=cpu has no effect: strata does not offload"));
  EXPECT_TRUE(any_contains(notes, "zero_optimization.offload_optimizer.device=nvme"));

  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"zero_optimization",
                                                 {{"prefetch_bucket_size", 1},
                                                  {"stage3_prefetch_bucket_size", 2}}}})),
                       "are two names of one setting"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"zero_optimization",
                                {{"stage", 2},
                                 {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}}})),
      "needs zero_optimization.stage 3"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"zero_optimization",
                                                 {{"offload_optimizer", {{"max_in_cpu", 1}}}}}})),
                       "unknown key 'zero_optimization.offload_optimizer.max_in_cpu'"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"zero_optimization", true}})), "legacy boolean"));
}

TEST(Config, PrecisionAndDataTypes) {
  Config legacy = parse_config(with(kMinimal, {{"bfloat16", {{"enabled", true}}}}));
  EXPECT_TRUE(legacy.bf16.enabled);
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}})),
      "legacy name"));

  Config fp32acc = parse_config(with(
      kMinimal, {{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "fp32"}}}}));
  EXPECT_EQ(fp32acc.grad_accum_dtype, DType::F32);
  Config fp16 = parse_config(with(kMinimal, {{"fp16", {{"enabled", true}, {"loss_scale", 128}}}}));
  EXPECT_EQ(fp16.grad_accum_dtype, DType::F32);
  Config bf16acc = parse_config(with(
      kMinimal, {{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "bf16"}}}}));
  EXPECT_EQ(bf16acc.grad_accum_dtype, DType::BF16);
  EXPECT_EQ(fp16.comm_dtype(), DType::F16);
  EXPECT_FLOAT_EQ(fp16.fp16.loss_scale, 128.0f);
  // Static scaling: the dynamic-only checks do not apply (DeepSpeed).
  EXPECT_EQ(
      error_of(with(kMinimal,
                    {{"fp16", {{"enabled", true}, {"loss_scale", 8}, {"min_loss_scale", 0}}}})),
      "");
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"fp16", {{"enabled", true}, {"min_loss_scale", 0}}}})),
               "fp16.min_loss_scale must be > 0"));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"data_types", {{"grad_accum_dtype", "bf16"}}}})),
               "data_types.grad_accum_dtype=\"bf16\" with fp32 parameters is not supported"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"data_types", {{"param_dtype", "bf16"}}}})),
                       "data_types.param_dtype=\"bf16\" conflicts"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"fp16", {{"loss_scale", "inf"}}}})),
                       "fp16.loss_scale must be a finite number >= 0"));

  for (const char* s : {"BF16", "bfloat16", "bf16"}) {
    Config c = parse_config(with(kMinimal, {{"communication_data_type", s}}));
    EXPECT_EQ(c.comm_dtype(), DType::BF16) << s;
  }
  EXPECT_EQ(
      parse_config(with(kMinimal, {{"communication_data_type", nullptr}})).communication_data_type,
      std::nullopt);
}

TEST(Config, BatchTriangleAsDeepSpeed) {
  struct Case {
    int64_t tb, mb, gas;
    int dp;
    int64_t want_tb, want_mb, want_gas;  // 0: must fail
  };
  const Case cases[] = {
      // test_ds_config_dict.py, 2 ranks
      {32, 16, 1, 2, 32, 16, 1},
      {32, 8, 2, 2, 32, 8, 2},
      {33, 17, 2, 2, 0, 0, 0},
      {32, 18, 1, 2, 0, 0, 0},
      // the inference table, floor division
      {32, 4, 0, 2, 32, 4, 4},   // tb + mb: gas = tb // mb // ws
      {32, 0, 2, 2, 32, 8, 2},   // tb + gas: mb = tb // ws // gas
      {0, 4, 2, 2, 16, 4, 2},    // mb + gas: tb = mb * gas * ws
      {32, 0, 0, 2, 32, 16, 1},  // tb only
      {0, 4, 0, 2, 8, 4, 1},     // mb only
      {0, 1, 16, 1, 16, 1, 16},  // the seed config
      {33, 0, 2, 2, 0, 0, 0},    // mb = 33 // 2 // 2 = 8: 8·2·2 != 33
      {8, 16, 0, 1, 0, 0, 0},    // gas = 8 // 16 = 0
      {30, 4, 0, 2, 0, 0, 0},    // gas = 30 // 4 // 2 = 3: 4·3·2 != 30
  };
  for (const Case& k : cases) {
    json j = json::object();
    if (k.tb) j["train_batch_size"] = k.tb;
    if (k.mb) j["train_micro_batch_size_per_gpu"] = k.mb;
    if (k.gas) j["gradient_accumulation_steps"] = k.gas;
    Config c = parse_config(j);
    const std::string what = j.dump() + " dp=" + std::to_string(k.dp);
    if (k.want_tb == 0) {
      try {
        resolve_batch(c, k.dp);
        ADD_FAILURE() << what << " was accepted";
      } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_TRUE(contains(msg, "data-parallel size " + std::to_string(k.dp))) << msg;
        EXPECT_TRUE(contains(msg, "train_batch_size=")) << msg;
        EXPECT_TRUE(contains(msg, "train_micro_batch_size_per_gpu=")) << msg;
        EXPECT_TRUE(contains(msg, "gradient_accumulation_steps=")) << msg;
        EXPECT_TRUE(contains(msg, "Consistent: ")) << msg;
      }
      continue;
    }
    resolve_batch(c, k.dp);
    EXPECT_EQ(c.train_batch_size, k.want_tb) << what;
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, k.want_mb) << what;
    EXPECT_EQ(c.gradient_accumulation_steps, k.want_gas) << what;
  }
}

TEST(Config, ResolveBatchRecomputesFromTheGivenKeys) {
  Config c = parse_config({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}});
  resolve_batch(c, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  resolve_batch(c, 4);  // a different DP degree: the global batch stays, accumulation follows
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_THROW(resolve_batch(c, 0), InputError);
}

// parallelism.expert against the world: the experts are placed over ranks of the data ×
// context-parallel group of a stage (with whole experts, of the tensor × data × context ranks),
// so ep must divide it (checked where the sizes are known).
TEST(Config, ExpertParallelismDividesTheDataAndContextRanks) {
  const nlohmann::json model = test::tiny_mixtral(8);
  const Config c = parse_config(
      {{"train_micro_batch_size_per_gpu", 1}, {"model", model}, {"parallelism", {{"expert", 4}}}});
  EXPECT_EQ(c.parallelism.expert, 4);
  EXPECT_NO_THROW(check_expert_grid(c, 4));
  EXPECT_NO_THROW(check_expert_grid(c, 8));
  for (int dp_cp : {1, 2, 6}) {
    try {
      check_expert_grid(c, dp_cp);
      ADD_FAILURE() << "ep 4 over " << dp_cp << " ranks was accepted";
    } catch (const InputError& e) {
      EXPECT_TRUE(contains(e.what(),
                           "parallelism.expert=4 must divide the data x context-parallel "
                           "ranks of a stage (" +
                               std::to_string(dp_cp)))
          << e.what();
    }
  }
  // Whole experts beside tp 2: over the tensor × data × context ranks (ep 4 over tp 2 × dp 2).
  const Config w = parse_config(
      {{"train_micro_batch_size_per_gpu", 2},
       {"model", model},
       {"parallelism",
        {{"expert", 4}, {"tensor", 2}, {"sequence_parallel", true}, {"expert_tensor", 1}}}});
  EXPECT_TRUE(w.parallelism.whole_experts());
  EXPECT_NO_THROW(check_expert_grid(w, 2));
  try {
    check_expert_grid(w, 3);
    ADD_FAILURE() << "ep 4 over tp 2 x 3 ranks was accepted";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(),
                         "parallelism.expert=4 must divide the tensor x data x context-parallel "
                         "ranks of a stage (6"))
        << e.what();
  }
}

TEST(Config, Overrides) {
  Config c = parse_config(kMinimal,
                          {"zero_optimization.stage=2", "bf16.enabled=true", "optimizer.type=AdamW",
                           "optimizer.params.lr=3e-4", "model.preset=gpt2-tiny", "model.seq_len=8",
                           "data.path=/tmp/tokens.bin", "train.run_dir=\"runs/x\"",
                           "train.seed=18446744073709551615", "gradient_clipping=0"});
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_FLOAT_EQ(c.optimizer.lr, 3e-4f);
  EXPECT_EQ(c.model.preset, "gpt2-tiny");
  EXPECT_EQ(c.model.seq_len, 8);
  EXPECT_EQ(c.data.path, "/tmp/tokens.bin");
  EXPECT_EQ(c.train.run_dir, "runs/x");
  EXPECT_EQ(c.train.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c.gradient_clipping, 0.0f);

  // An override replaces a value the file gave, and may set a whole block.
  Config d = parse_config(with(kMinimal, {{"train", {{"steps", 5}}}}),
                          {"train.steps=7", "model={\"preset\": \"llama-tiny\"}"});
  EXPECT_EQ(d.train.steps, 7);
  EXPECT_EQ(d.model.family, "llama");

  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"train", {{"steps", -5}}}})),
                       "train.steps must be an integer >= 1, got -5"));
  // A value that is not JSON is a string; a string where a number belongs is caught.
  EXPECT_TRUE(contains(error_of(kMinimal, {"train.steps=ten"}),
                       "train.steps must be an integer >= 1, got \"ten\""));
  EXPECT_TRUE(contains(error_of(kMinimal, {"zero_optimization.stagee=1"}),
                       "unknown key 'zero_optimization.stagee'; did you mean "
                       "'zero_optimization.stage'?"));
  EXPECT_TRUE(contains(error_of(kMinimal, {"zero_optimization.stage"}),
                       "--set \"zero_optimization.stage\": expected KEY=VALUE"));
  EXPECT_TRUE(contains(error_of(kMinimal, {"=3"}), "--set \"=3\": the key path"));
  EXPECT_TRUE(contains(error_of(kMinimal, {"train..steps=3"}), "--set \"train..steps=3\""));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"train", {{"steps", 5}}}}), {"train.steps.x=1"}),
                       "train.steps is 5, not a block"));
  EXPECT_TRUE(contains(error_of(kMinimal, {"model={\"preset\": \"demo\", \"preset\": \"demo\"}"}),
                       "duplicate key 'preset'"));
}

TEST(Config, ModelPresets) {
  const std::vector<std::string> names = model_preset_names();
  EXPECT_EQ(names.size(), 8u);
  for (const std::string& n : names) {
    ModelConfig m = model_preset(n);
    EXPECT_EQ(m.preset, n);
    EXPECT_GT(m.ffn_hidden, 0) << n;
    EXPECT_GT(m.kv_heads, 0) << n;
  }
  ModelConfig g = model_preset("gpt2-tiny");
  EXPECT_EQ(g.family, "gpt2");
  EXPECT_EQ(g.layers, 2);
  EXPECT_EQ(g.hidden, 32);
  EXPECT_EQ(g.heads, 4);
  EXPECT_EQ(g.kv_heads, 4);
  EXPECT_EQ(g.vocab, 64);
  EXPECT_EQ(g.seq_len, 16);
  EXPECT_EQ(g.ffn_hidden, 128);
  EXPECT_TRUE(g.tied_embeddings);

  ModelConfig l = model_preset("llama-tiny");
  EXPECT_EQ(l.family, "llama");
  EXPECT_EQ(l.kv_heads, 2);
  EXPECT_EQ(l.ffn_hidden, 64);
  EXPECT_FALSE(l.tied_embeddings);

  EXPECT_EQ(model_preset("demo").vocab, 257);
  EXPECT_EQ(model_preset("demo").layers, 4);
  EXPECT_EQ(model_preset("llama-demo").ffn_hidden, 352);
  EXPECT_EQ(model_preset("bench-23M").hidden, 512);
  EXPECT_EQ(model_preset("bench-23M").vocab, 8192);
  ModelConfig g124 = model_preset("gpt2-124M");
  EXPECT_EQ(g124.layers, 12);
  EXPECT_EQ(g124.hidden, 768);
  EXPECT_EQ(g124.vocab, 50304);
  EXPECT_EQ(g124.ffn_hidden, 3072);
  EXPECT_EQ(model_preset("gpt2-350M").layers, 24);
  ModelConfig l1 = model_preset("llama-1B");
  EXPECT_EQ(l1.kv_heads, 8);
  EXPECT_EQ(l1.ffn_hidden, 8192);
  EXPECT_EQ(l1.vocab, 128256);
  EXPECT_FALSE(l1.tied_embeddings);

  try {
    model_preset("gpt2-124m");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "did you mean \"gpt2-124M\"?")) << e.what();
  }
}

TEST(Config, ModelBlock) {
  // Preset with overrides on top; derived fields follow the overrides.
  Config a = parse_config(with(kMinimal, {{"model", {{"preset", "gpt2-124M"}, {"seq_len", 256}}}}));
  EXPECT_EQ(a.model.preset, "gpt2-124M");
  EXPECT_EQ(a.model.seq_len, 256);
  EXPECT_EQ(a.model.hidden, 768);
  Config b = parse_config(with(kMinimal, {{"model", {{"preset", "gpt2-tiny"}, {"hidden", 64}}}}));
  EXPECT_EQ(b.model.ffn_hidden, 256);

  // Explicit fields: Llama's rule for the FFN (8/3·hidden up to a multiple of 256), untied.
  Config l = parse_config(with(kMinimal, {{"model",
                                           {{"family", "llama"},
                                            {"layers", 2},
                                            {"hidden", 4096},
                                            {"heads", 32},
                                            {"vocab", 32000},
                                            {"seq_len", 64}}}}));
  EXPECT_EQ(l.model.ffn_hidden, 11008);
  EXPECT_EQ(l.model.kv_heads, 32);
  EXPECT_FALSE(l.model.tied_embeddings);
  EXPECT_TRUE(l.model.preset.empty());

  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"model", {{"family", "gpt2"}, {"layers", 2}}}})),
                       "model.hidden is required when model.preset is not given"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"model", {{"preset", "gpt2-tiny"}, {"rope_theta", 1e4}}}})),
      "model.rope_theta applies to the RoPE families only"));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"model", {{"preset", "llama-tiny"}, {"kv_heads", 3}}}})),
               "model.heads=4 is not divisible by model.kv_heads=3"));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"model", {{"preset", "demo"}, {"family", "bert"}}}})),
               "model.family must be one of \"gpt2\", \"llama\", \"mistral\""));

  ModelConfig bad;
  bad.family = "gpt2";
  EXPECT_THROW(finalize_model(bad), InputError);  // layers 0
}

// A family is a description of its block: its defaults, and every field written by hand.
TEST(Config, ModelFamiliesDescribeTheirBlock) {
  auto model = [](json fields) {
    json m = {{"layers", 4},   {"hidden", 64}, {"heads", 4},
              {"kv_heads", 2}, {"vocab", 96},  {"seq_len", 16}};
    m.update(fields);
    return parse_config(with(kMinimal, {{"model", m}})).model;
  };
  const ModelConfig qwen2 = model({{"family", "qwen2"}});
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_EQ(qwen2.qk_norm, "none");
  EXPECT_FALSE(qwen2.tied_embeddings);
  const ModelConfig qwen3 = model({{"family", "qwen3"}, {"head_dim", 24}});
  EXPECT_EQ(qwen3.qk_norm, "head");
  EXPECT_FALSE(qwen3.qkv_bias);
  EXPECT_EQ(qwen3.hd(), 24);
  const ModelConfig smol = model({{"family", "smollm3"}});
  EXPECT_TRUE(smol.rope(0) && smol.rope(1) && smol.rope(2));
  EXPECT_FALSE(smol.rope(3)) << "every fourth layer leaves RoPE out";
  const ModelConfig mistral = model({{"family", "mistral"}, {"sliding_window", 5}});
  EXPECT_TRUE(mistral.sliding(0) && mistral.sliding(3));
  const ModelConfig mixed =
      model({{"family", "llama"},
             {"sliding_window", 3},
             {"layer_types",
              {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
             {"rope_layers", {1, 1, 0, 1}},
             {"qkv_bias", true},
             {"rope_scaling",
              {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 8}}}});
  EXPECT_TRUE(mixed.sliding(0));
  EXPECT_FALSE(mixed.sliding(1));
  EXPECT_FALSE(mixed.rope(2));
  EXPECT_TRUE(mixed.qkv_bias);
  EXPECT_EQ(mixed.rope_scaling.type, "yarn");
  EXPECT_EQ(mixed.rope_scaling.original_max_positions, 8);
  // The block's JSON form (checkpoint manifests, a resume's model) reads back as the same model.
  const ModelConfig back = model(model_block_json(mixed));
  EXPECT_EQ(model_block_json(back), model_block_json(mixed));
  // So do the mixtures of experts, dropless and with a capacity.
  for (const json& moe :
       {json{{"experts", 4}, {"top_k", 2}, {"ffn_hidden", 32}, {"mlp_only_layers", {1}}},
        json{{"experts", 4},
             {"top_k", 1},
             {"shared_ffn_hidden", 16},
             {"shared_gate", true},
             {"capacity_factor", 1.25},
             {"capacity_scope", "micro_batch"},
             {"drop_policy", "position"},
             {"aux_loss", "per_layer"},
             {"router_aux_loss_coef", 0.01},
             {"z_loss_coef", 0.001}}}) {
    const ModelConfig m = model({{"family", "qwen2_moe"}, {"moe", moe}});
    EXPECT_TRUE(m.moe_layer(0));
    EXPECT_EQ(m.moe_layer(1), !moe.contains("mlp_only_layers"));
    EXPECT_EQ(model(model_block_json(m)).moe, m.moe) << moe.dump();
  }

  const std::pair<json, std::string> bad[] = {
      {{{"family", "qwen3"}, {"head_dim", 15}}, "must be even"},
      {{{"family", "llama"}, {"layer_types", {"sliding_attention"}}},
       "model.layer_types lists 1 layers, but model.layers=4"},
      {{{"family", "llama"},
        {"layer_types",
         {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}},
       "model.sliding_window is not given"},
      {{{"family", "llama"}, {"layer_types", {"local", "full_attention"}}}, "layer_types"},
      {{{"family", "llama"}, {"rope_layers", {1, 2, 1, 1}}}, "rope_layers"},
      {{{"family", "llama"}, {"rope_scaling", {{"type", "llama3"}, {"factor", 8.0}}}},
       "needs original_max_position_embeddings"},
      {{{"family", "llama"}, {"rope_scaling", {{"type", "ntk"}}}}, "rope_scaling.type"},
      {{{"family", "gpt2"}, {"kv_heads", 4}, {"qk_norm", "head"}}, "family gpt2 has its own"},
      {{{"family", "llama"}, {"hidden", 63}}, "or set head_dim"},
  };
  for (const auto& [fields, want] : bad) {
    json m = {{"layers", 4},   {"hidden", 64}, {"heads", 4},
              {"kv_heads", 2}, {"vocab", 96},  {"seq_len", 16}};
    m.update(fields);
    const std::string e = error_of(with(kMinimal, {{"model", m}}));
    EXPECT_TRUE(contains(e, want)) << fields.dump() << "\n -> " << e;
  }
}

TEST(Config, Parallelism) {
  Config c = parse_config(with(kMinimal, {{"model", {{"preset", "gpt2-124M"}}},
                                          {"parallelism",
                                           {{"tensor", 4},
                                            {"pipeline", 4},
                                            {"virtual_stages", 3},
                                            {"schedule", "interleaved"},
                                            {"sequence_parallel", true},
                                            {"order", "dp-tp-pp"}}}}));
  EXPECT_EQ(c.parallelism.tensor, 4);
  EXPECT_EQ(c.parallelism.order, "dp-tp-pp");
  const std::vector<std::string> notes = config_notices(c, 1);
  EXPECT_FALSE(any_contains(notes, "parallelism.tensor"));
  EXPECT_FALSE(any_contains(notes, "parallelism.pipeline"));  // in effect
  EXPECT_FALSE(any_contains(notes, "parallelism.virtual_stages"));
  EXPECT_FALSE(any_contains(notes, "parallelism.sequence_parallel"));
  EXPECT_FALSE(any_contains(notes, "parallelism.order"));

  const json tiny = with(kMinimal, {{"model", {{"preset", "gpt2-tiny"}}}});
  EXPECT_TRUE(contains(error_of(with(tiny, {{"parallelism", {{"schedule", "interleaved"}}}})),
                       "needs parallelism.virtual_stages >= 2"));
  EXPECT_TRUE(contains(error_of(with(tiny, {{"parallelism", {{"virtual_stages", 2}}}})),
                       "needs parallelism.pipeline > 1"));
  EXPECT_TRUE(contains(error_of(with(tiny, {{"parallelism", {{"order", "tp-dp"}}}})),
                       "parallelism.order must be a permutation"));
  EXPECT_TRUE(
      contains(error_of(with(tiny, {{"parallelism", {{"partition", "explicit"}}}})), "give both"));
  EXPECT_TRUE(contains(
      error_of(with(tiny, {{"parallelism", {{"partition_blocks", json::array({1, "x"})}}}})),
      "parallelism.partition_blocks must be a list of block counts"));
}

// Tensor and sequence parallelism are in effect: a model and micro-batch they split evenly load
// without a note about them.
TEST(Config, TensorAndSequenceParallelLoadWithoutNotices) {
  for (const auto& [preset, tp] : {std::pair{"gpt2-tiny", 2}, std::pair{"gpt2-124M", 4},
                                   std::pair{"llama-tiny", 2}, std::pair{"llama-1B", 4}}) {
    Config c = parse_config(with(
        kMinimal,
        {{"model", {{"preset", preset}}},
         {"parallelism", {{"tensor", tp}, {"sequence_parallel", true}, {"order", "dp-tp-pp"}}}}));
    resolve_batch(c, 2);
    EXPECT_EQ(c.parallelism.tensor, tp) << preset;
    EXPECT_TRUE(c.parallelism.sequence_parallel) << preset;
    for (int world : {tp, 2 * tp}) {
      const std::vector<std::string> notes = config_notices(c, world);
      EXPECT_TRUE(notes.empty()) << preset << " tp=" << tp << " at " << world << ": "
                                 << (notes.empty() ? "" : notes[0]);
    }
  }
  // With tensor=1 sequence parallelism has nothing to split, and the order no axis to place.
  const std::vector<std::string> notes = config_notices(
      parse_config(
          with(kMinimal, {{"parallelism", {{"sequence_parallel", true}, {"order", "dp-tp-pp"}}}})),
      4);
  EXPECT_TRUE(
      any_contains(notes, "parallelism.sequence_parallel has no effect with parallelism.tensor=1"));
  EXPECT_TRUE(any_contains(notes, "parallelism.order=dp-tp-pp has no effect"));
}

// Fewer KV heads than tensor-parallel ranks: each KV head is replicated on tp/kv_heads ranks.
TEST(Config, TensorParallelReplicatesKvHeads) {
  Config c = parse_config(
      with(kMinimal, {{"model", {{"preset", "llama-tiny"}}}, {"parallelism", {{"tensor", 4}}}}));
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.parallelism.tensor, 4);
  EXPECT_TRUE(config_notices(c, 4).empty());
  // kv_heads=4 on 8 ranks of a 16-head model: replicated twice.
  EXPECT_EQ(error_of(with(kMinimal, {{"model",
                                      {{"family", "llama"},
                                       {"layers", 1},
                                       {"hidden", 128},
                                       {"heads", 16},
                                       {"kv_heads", 4},
                                       {"vocab", 64},
                                       {"seq_len", 8}}},
                                     {"parallelism", {{"tensor", 8}}}})),
            "");
}

// The vocabulary is padded to a multiple of the tensor size: the demo's 257 tokens split on 2.
TEST(Config, TensorParallelPadsTheVocabulary) {
  Config c = parse_config(
      with(kMinimal, {{"model", {{"preset", "demo"}}}, {"parallelism", {{"tensor", 2}}}}));
  EXPECT_EQ(c.model.vocab, 257);
}

// Sequence parallelism splits the micro-batch's token rows: when only train_batch_size is given
// the micro batch is known, and checked, once resolve_batch derives it.
TEST(Config, SequenceParallelChecksTheDerivedMicroBatch) {
  const json sp = {{"model", {{"preset", "gpt2-tiny"}, {"seq_len", 6}}},
                   {"parallelism", {{"tensor", 4}, {"sequence_parallel", true}}}};
  Config c = parse_config(with(sp, {{"train_batch_size", 6}}));
  try {
    resolve_batch(c, 2);  // micro batch 3: 18 rows
    ADD_FAILURE() << "3 x 6 rows were split on 4 ranks";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "train_micro_batch_size_per_gpu=3 x model.seq_len=6 = 18 token rows is not divisible "
              "by parallelism.tensor=4: parallelism.sequence_parallel splits each micro-batch's "
              "rows across the tensor-parallel ranks; make train_micro_batch_size_per_gpu a "
              "multiple of 2 or set parallelism.sequence_parallel to false; valid values of "
              "parallelism.tensor: 1, 2");
  }
  resolve_batch(c, 3);  // micro batch 2: 12 rows
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  // Without sequence parallelism the rows are not split.
  Config plain = parse_config(
      with(sp, {{"train_batch_size", 6}, {"parallelism", {{"sequence_parallel", false}}}}));
  resolve_batch(plain, 2);
  EXPECT_EQ(plain.train_micro_batch_size_per_gpu, 3);
}

// Each rule's message names the key and its value, says why, and lists every tensor size that
// passes all the rules.
TEST(Config, TensorSplitErrorsListTheValidSizes) {
  const auto llama = [](int hidden, int heads, int kv_heads, int ffn_hidden) {
    return json{{"family", "llama"}, {"layers", 1},          {"hidden", hidden},
                {"heads", heads},    {"kv_heads", kv_heads}, {"ffn_hidden", ffn_hidden},
                {"vocab", 64},       {"seq_len", 8}};
  };
  const auto error = [&](const json& model, int tp) {
    return error_of(with(kMinimal, {{"model", model}, {"parallelism", {{"tensor", tp}}}}));
  };
  EXPECT_EQ(
      error({{"preset", "gpt2-124M"}}, 8),
      "model.heads=12 is not divisible by parallelism.tensor=8: each tensor-parallel rank "
      "computes whole attention heads; valid values of parallelism.tensor: 1, 2, 3, 4, 6, 12");
  // kv_heads 8 on 6 ranks; 24 replicates each KV head on 3 ranks.
  EXPECT_TRUE(contains(error(llama(96, 24, 8, 384), 6),
                       "model.kv_heads=8 is not divisible by parallelism.tensor=6"));
  EXPECT_TRUE(contains(error(llama(96, 24, 8, 384), 6),
                       "; valid values of parallelism.tensor: 1, 2, 4, 8, 24"));
  EXPECT_TRUE(contains(error(llama(96, 12, 4, 384), 6),
                       "parallelism.tensor=6 is not a multiple of model.kv_heads=4"));
  EXPECT_TRUE(contains(error(llama(128, 16, 16, 100), 8),
                       "model.ffn_hidden=100 is not divisible by parallelism.tensor=8: the MLP's "
                       "hidden units are split across the tensor-parallel ranks; valid values of "
                       "parallelism.tensor: 1, 2, 4"));
  // The list stops at 64 ranks: 128 would split these 128 heads too.
  const std::string many = error(llama(256, 128, 128, 512), 3);
  const std::string tail = "; valid values of parallelism.tensor: 1, 2, 4, 8, 16, 32, 64";
  ASSERT_GE(many.size(), tail.size()) << many;
  EXPECT_EQ(many.substr(many.size() - tail.size()), tail);
}

TEST(Config, RuntimeBlocksAndNotices) {
  Config c = parse_config(
      with(kMinimal,
           {{"checkpoint",
             {{"dir", "ckpt"},
              {"interval", 100},
              {"tag_validation", "fail"},
              {"load_universal", true},
              {"parallel_write", {{"pipeline_stage", true}}}}},
            {"elasticity",
             {{"enabled", true}, {"max_train_batch_size", 1024}, {"micro_batch_sizes", {2, 4}}}},
            {"tensorboard", {{"enabled", true}, {"output_path", "tb"}}},
            {"csv_monitor", {{"enabled", true}}},
            {"wandb", {{"enabled", true}, {"group", nullptr}}},
            {"activation_checkpointing", {{"number_checkpoints", 4}}},
            {"communication_data_type", "fp16"}}));
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");
  EXPECT_TRUE(c.checkpoint.parallel_write_pipeline_stage);
  EXPECT_EQ(c.elasticity.micro_batch_sizes, (std::vector<int64_t>{2, 4}));
  const std::vector<std::string> notes = config_notices(c, 1);
  for (const char* key :
       {"checkpoint.load_universal", "wandb.enabled", "communication_data_type=fp16"}) {
    EXPECT_TRUE(any_contains(notes, key)) << key;
  }
  // The monitors are in effect (RunMonitors): no note.
  EXPECT_FALSE(any_contains(notes, "tensorboard.enabled has")) << "tensorboard is in effect";
  EXPECT_FALSE(any_contains(notes, "tensorboard.output_path")) << "tensorboard is in effect";
  EXPECT_FALSE(any_contains(notes, "csv_monitor")) << "csv_monitor is in effect";
  EXPECT_FALSE(any_contains(notes, "activation_checkpointing")) << "4 of the demo's 4 blocks";
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"elasticity", {{"enabled", true}}}})),
                       "elasticity.max_train_batch_size is required"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"wandb", {{"entity", "x"}}}})),
                       "unknown key 'wandb.entity'"));

  // At more than one process every ZeRO stage is in effect: no notice; MiCS at stage 0 says it
  // does nothing.
  for (int stage : {1, 2, 3}) {
    Config z = parse_config(with(kMinimal, {{"zero_optimization", {{"stage", stage}}}}));
    EXPECT_FALSE(any_contains(config_notices(z, 4), "zero_optimization.stage=")) << stage;
  }
  Config m0 = parse_config(with(kMinimal, {{"zero_optimization", {{"mics_shard_size", 2}}}}));
  EXPECT_TRUE(any_contains(config_notices(m0, 4), "mics_shard_size=2 has no effect at stage 0"));
  Config m2 =
      parse_config(with(kMinimal, {{"zero_optimization", {{"stage", 2}, {"mics_shard_size", 2}}}}));
  EXPECT_TRUE(any_contains(config_notices(m2, 4), "DeepSpeed applies MiCS at stage 3 only"));
  EXPECT_TRUE(any_contains(config_notices(m2, 4), "the bucket size applies at stage 0"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"zero_optimization", {{"mics_shard_size", 0}}}})),
                       "mics_shard_size"));
}

// Keys whose effect depends on the layout say so where they have none; where they act, silence.
TEST(Config, NoticesFollowTheLayout) {
  const auto notes = [](const json& patch, int world) {
    return config_notices(parse_config(with(kMinimal, patch)), world);
  };
  EXPECT_TRUE(notes(json::object(), 4).empty());

  // contiguous_gradients: always on in effect (contiguous unit buffers at stages 2-3).
  const json contiguous_off = {
      {"zero_optimization", {{"stage", 2}, {"contiguous_gradients", false}}}};
  EXPECT_TRUE(any_contains(notes(contiguous_off, 4), "contiguous_gradients=false has no effect"));
  EXPECT_TRUE(any_contains(notes(contiguous_off, 1), "contiguous_gradients=false has no effect"));
  EXPECT_FALSE(any_contains(notes({{"zero_optimization", {{"stage", 2}}}}, 4),
                            "contiguous_gradients=false"));

  // The stage-3 knobs act at stage 3 on several ranks only.
  const json live = {{"zero_optimization", {{"stage", 2}, {"max_live_parameters", 1000}}}};
  EXPECT_TRUE(any_contains(notes(live, 4),
                           "zero_optimization.stage3_max_live_parameters has no effect at "
                           "zero_optimization.stage=2: stage 3 only"));
  EXPECT_TRUE(
      notes({{"zero_optimization", {{"stage", 3}, {"max_live_parameters", 1000}}}}, 4).size() ==
      1u);  // the unit-sized buckets line only

  // Bucket sizes: reduce_bucket_size acts at stage 0 on several ranks; allgather_bucket_size never.
  EXPECT_TRUE(notes({{"zero_optimization", {{"reduce_bucket_size", 1000}}}}, 4).empty());
  EXPECT_TRUE(any_contains(notes({{"zero_optimization", {{"reduce_bucket_size", 1000}}}}, 1),
                           "nothing to communicate at 1 process"));
  for (int stage : {0, 2}) {
    EXPECT_TRUE(any_contains(
        notes({{"zero_optimization", {{"stage", stage}, {"allgather_bucket_size", 1000}}}}, 4),
        "zero_optimization.allgather_bucket_size has no effect"))
        << stage;
  }
  EXPECT_TRUE(any_contains(notes({{"zero_optimization", {{"allgather_partitions", false}}}}, 4),
                           "zero_optimization.allgather_partitions=false has no effect"));

  // Loss-scaling keys without fp16, overflow checks without bf16.
  const json scaling = {{"loss_scale_window", 10}, {"hysteresis", 4}};
  EXPECT_TRUE(any_contains(notes({{"fp16", scaling}}, 1),
                           "fp16.loss_scale_window/hysteresis have no effect: fp16.enabled is "
                           "false"));
  json fp16_on = scaling;
  fp16_on["enabled"] = true;
  EXPECT_TRUE(notes({{"fp16", fp16_on}}, 1).empty());
  EXPECT_TRUE(any_contains(notes({{"bf16", {{"check_grad_overflow", false}}}}, 1),
                           "bf16.check_grad_overflow has no effect"));
  EXPECT_TRUE(notes({{"bf16", {{"enabled", true}, {"check_grad_overflow", false}}}}, 1).empty());

  // Parallelism keys without tensor or pipeline parallelism.
  EXPECT_TRUE(any_contains(notes({{"parallelism", {{"order", "dp-tp-pp"}}}}, 4),
                           "parallelism.order=dp-tp-pp has no effect"));
  EXPECT_TRUE(any_contains(notes({{"parallelism", {{"schedule", "gpipe"}}}}, 4),
                           "parallelism.schedule=gpipe has no effect with parallelism.pipeline=1"));
  EXPECT_TRUE(notes({{"parallelism", {{"timeout_s", 30}}}}, 4).empty());
  EXPECT_TRUE(any_contains(notes({{"parallelism", {{"timeout_s", 30}}}}, 1),
                           "parallelism.timeout_s: no collectives to watch at 1 process"));

  // Checkpoint keys without effect: one line each, naming why; checkpoint.dir is in effect.
  const std::vector<std::string> ckpt =
      notes({{"checkpoint",
              {{"dir", "ckpt"}, {"tag_validation", "Fail"}, {"use_node_local_storage", true}}}},
            4);
  ASSERT_EQ(ckpt.size(), 2u);
  EXPECT_TRUE(contains(ckpt[0], "checkpoint.tag_validation=Fail has no effect")) << ckpt[0];
  EXPECT_TRUE(contains(ckpt[1], "checkpoint.use_node_local_storage has no effect")) << ckpt[1];
}

TEST(Config, StrictJson) {
  EXPECT_EQ(parse_json_strict("{\"a\": [1, {\"b\": 2}]}", "x")["a"][1]["b"], 2);
  try {
    parse_json_strict("{\"a\": [{\"b\": 1}, {\"b\": 1, \"b\": 2}]}", "cfg.json");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "cfg.json: duplicate key 'a[1].b'");
  }
  try {
    parse_json_strict("{\n  \"a\": 1\n  \"b\": 2\n}", "cfg.json");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "cfg.json: invalid JSON: parse error at line 3, column"))
        << e.what();
  }
  EXPECT_TRUE(contains(error_of(json::array()), "the config must be a JSON object"));
  try {
    load_config("/nonexistent/strata.json");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot read the config file /nonexistent/strata.json"));
  }
}

// Nesting is refused past kMaxConfigDepth, before a recursive copy, dump or destructor could
// overflow the stack: in text, in a tree built in code, and where --set values deepen a file.
TEST(Config, NestingDepthIsLimited) {
  const int n = kMaxConfigDepth;
  const std::string limit = "nests deeper than " + std::to_string(n) + " levels";
  const auto nested = [](int levels) {
    return std::string(size_t(levels), '[') + std::string(size_t(levels), ']');
  };
  EXPECT_EQ(parse_json_strict(nested(n), "x").size(), 1u);
  for (const std::string& text : {nested(n + 1), nested(100000), "{\"a\":" + nested(n) + "}"}) {
    try {
      parse_json_strict(text, "cfg.json");
      ADD_FAILURE() << text.size();
    } catch (const InputError& e) {
      EXPECT_TRUE(contains(e.what(), "cfg.json: the JSON " + limit)) << e.what();
      EXPECT_FALSE(contains(e.what(), "invalid JSON")) << e.what();
    }
  }
  // A deep object names where it is.
  std::string objects;
  for (int i = 0; i < 1000; ++i) objects += "{\"zero_optimization\":";
  objects += "1" + std::string(1000, '}');
  EXPECT_TRUE(contains(error_of_text(objects), "(at zero_optimization.zero_optimization"));

  json deep = 1;  // built by moves: a copy would recurse once per level
  for (int i = 0; i < 100000; ++i) {
    json outer = json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  EXPECT_TRUE(contains(error_of(deep), "the config: the JSON " + limit));

  // The file's root object is level 1, so a --set value under "model" may nest n - 1 levels.
  EXPECT_FALSE(contains(error_of(kMinimal, {"model=" + nested(n - 1)}), limit));
  EXPECT_TRUE(contains(error_of(kMinimal, {"model=" + nested(n)}),
                       "the config with its --set overrides: the JSON " + limit));
}

TEST(Config, UnknownKeySuggestions) {
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"stage", 2}})),
                       "unknown key 'stage'; did you mean 'zero_optimization.stage'?"));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"Bf16", {{"enabled", true}}}})), "did you mean 'bf16'?"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"pipeline", {{"stages", 2}}}})),
                       "'pipeline' is a DeepSpeed key that strata does not implement; strata sets "
                       "pipeline parallelism in parallelism.pipeline"));
  EXPECT_TRUE(contains(
      error_of(with(kMinimal, {{"activation_checkpointing", {{"partition_activation", true}}}})),
      "did you mean 'activation_checkpointing.partition_activations'?"));
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"data", {{"pth", "x"}}}})),
                       "unknown key 'data.pth'; did you mean 'data.path'?"));
}

// The README's "A complete config" is one to copy: it must load, and resolve for its layout.
TEST(Config, ReadmeConfigLoads) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const size_t heading = readme.find("## A complete config");
  ASSERT_NE(heading, std::string::npos);
  const size_t open = readme.find("```json\n", heading);
  ASSERT_NE(open, std::string::npos);
  const size_t begin = open + 8, end = readme.find("```", begin);
  ASSERT_NE(end, std::string::npos);
  Config c = parse_config(parse_json_strict(readme.substr(begin, end - begin), "README.md"));
  EXPECT_EQ(c.model.preset, "gpt2-124M");
  EXPECT_EQ(c.train.eval_interval, 100);
  resolve_batch(c, 2);  // 4 ranks at tensor 2
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
}

TEST(Config, PackingAndDocumentMaskingWithMegatronsFlagsAsAliases) {
  const Config plain = parse_config(kMinimal);
  EXPECT_EQ(plain.data.packing, "auto");
  EXPECT_FALSE(plain.data.document_mask);
  EXPECT_FALSE(plain.data.pack(false));
  EXPECT_TRUE(plain.data.pack(true));  // a loss mask: conversations are packed
  for (const char* alias : {"reset_attention_mask", "reset_position_ids"}) {
    const Config c = parse_config(with(kMinimal, {{"data", {{alias, true}}}}));
    EXPECT_TRUE(c.data.document_mask) << alias;
    EXPECT_TRUE(c.data.pack(false)) << alias;
  }
  const Config none =
      parse_config(with(kMinimal, {{"data", {{"packing", "none"}, {"document_mask", true}}}}));
  EXPECT_FALSE(none.data.pack(true));
  EXPECT_TRUE(
      parse_config(with(kMinimal, {{"data", {{"eod_mask_loss", true}}}})).data.eod_mask_loss);
  EXPECT_TRUE(contains(error_of(with(kMinimal, {{"data", {{"packing", "best_fit"}}}})), "packing"));
  EXPECT_TRUE(
      contains(error_of(with(kMinimal, {{"data", {{"document_mask", "yes"}}}})), "document_mask"));
}

}  // namespace
}  // namespace strata
