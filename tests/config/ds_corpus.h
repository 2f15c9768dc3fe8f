// The real DeepSpeed configs of tests/config/ds_configs (SOURCES.md there names each one's
// repository, path and commit), what strata must do with each, and the Hugging Face Trainer's
// filling of "auto" values. Shared by the parser test and the CLI test.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/config/config.h"

namespace strata::testing {

struct DsConfig {
  std::string name;  // file stem in tests/config/ds_configs
  // Empty: the config trains. Else it is refused, each message naming all of `refused`; with the
  // keys of `remove` taken out (JSON pointers), it trains.
  std::vector<std::string> refused;
  std::vector<std::string> remove;
};

// SOURCES.md's expectations, one row per file.
inline const std::vector<DsConfig>& ds_configs() {
  static const std::vector<DsConfig> v = {
      {"hf_zero2", {}, {}},
      {"hf_zero3", {}, {}},
      {"llamafactory_z3_partial_offload",
       {"'comms_config'", "'monitor_config'"},
       {"/comms_config", "/monitor_config"}},
      {"axolotl_zero1", {}, {}},
      {"axolotl_zero3_bf16", {}, {}},
      {"fastchat_s2", {}, {}},
      {"fastchat_s3", {"'micro_batch_size_per_gpu'"}, {"/micro_batch_size_per_gpu"}},
      {"alpaca_offload_opt_param", {}, {}},
      {"megatron_ds_examples", {}, {}},
      // Its communication_data_type "bfp16" is read as bf16 (older DeepSpeed's spelling).
      {"megatron_ds_zero2_bf16", {"bfloat16.loss_scale"}, {"/bfloat16/loss_scale"}},
      // The batch triangle: train_batch_size 16 = 1 x 1 x 16 GPUs (resolve_batch refuses it).
      {"megatron_ds_root_zero3", {"train_batch_size=16"}, {"/train_batch_size"}},
      {"bigscience_flops_profiler", {}, {}},
      {"ds_test_gpt2_zero2_actckpt", {}, {}},
      {"dse_zero_infinity_nvme",
       {"'zero_optimization.stage3_param_persitance_threshold'"},
       {"/zero_optimization/stage3_param_persitance_threshold"}},
      {"dse_bf16_master_weights", {}, {}},
  };
  return v;
}

inline std::string ds_config_path(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/config/ds_configs/" + name + ".json";
}

inline nlohmann::json read_ds_config(const std::string& name) {
  std::ifstream in(ds_config_path(name), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return parse_json_strict(text.str(), ds_config_path(name));
}

// The TrainingArguments the "auto" values come from (the Trainer's defaults, a micro batch of 2
// and `max_steps`), and the model's hidden size for the bucket sizes.
struct HfArgs {
  int64_t per_device_train_batch_size = 2;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double weight_decay = 0.0, max_grad_norm = 1.0;
  int64_t warmup_steps = 0, max_steps = 2;
  bool fp16 = false, bf16 = false;
  int64_t hidden_size = 32;  // gpt2-tiny
};

// What transformers' HfTrainerDeepSpeedConfig does (trainer_config_process, then
// trainer_config_finalize): each of these keys that is "auto" gets the Trainer's value; an "auto"
// elsewhere stays for DeepSpeed (its pydantic blocks drop it, so the default applies).
inline void hf_fill_auto(nlohmann::json& j, const HfArgs& a, int world_size) {
  using nlohmann::json;
  const auto fill = [&](const std::string& pointer, const json& value) {
    const json::json_pointer p(pointer);
    if (j.contains(p) && j[p] == "auto") j[p] = value;
  };
  const int64_t h = a.hidden_size;
  fill("/train_micro_batch_size_per_gpu", a.per_device_train_batch_size);
  fill("/gradient_accumulation_steps", a.gradient_accumulation_steps);
  fill("/train_batch_size",
       world_size * a.per_device_train_batch_size * a.gradient_accumulation_steps);
  fill("/gradient_clipping", a.max_grad_norm);
  fill("/optimizer/params/lr", a.learning_rate);
  fill("/optimizer/params/betas", json::array({a.adam_beta1, a.adam_beta2}));
  fill("/optimizer/params/eps", a.adam_epsilon);
  fill("/optimizer/params/weight_decay", a.weight_decay);
  fill("/scheduler/params/warmup_min_lr", 0);
  fill("/scheduler/params/warmup_max_lr", a.learning_rate);
  fill("/fp16/enabled", a.fp16);
  fill("/bf16/enabled", a.bf16);
  fill("/zero_optimization/reduce_bucket_size", h * h);
  fill("/zero_optimization/stage3_prefetch_bucket_size", int64_t(0.9 * double(h * h)));
  fill("/zero_optimization/stage3_param_persistence_threshold", 10 * h);
  fill("/scheduler/params/total_num_steps", a.max_steps);
  fill("/scheduler/params/warmup_num_steps", a.warmup_steps);
}

// The config as a run takes it: "auto" filled for `world_size` ranks, the named keys removed,
// then the only additions SOURCES.md allows: a model block, and (by the caller) data and steps.
inline nlohmann::json ds_config_for_run(const DsConfig& d, int world_size, bool remove_keys) {
  nlohmann::json j = read_ds_config(d.name);
  hf_fill_auto(j, HfArgs{}, world_size);
  if (remove_keys) {
    for (const std::string& p : d.remove) {
      const nlohmann::json::json_pointer ptr(p);
      j[ptr.parent_pointer()].erase(ptr.back());
    }
  }
  j["model"] = {{"preset", "gpt2-tiny"}};
  return j;
}

inline std::string ds_config_name(const ::testing::TestParamInfo<DsConfig>& info) {
  return info.param.name;
}

}  // namespace strata::testing
