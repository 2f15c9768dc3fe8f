// The run configuration: DeepSpeed's JSON keys (with DeepSpeed's meaning and defaults) plus
// strata's own blocks (model, parallelism, data, train). Parsing is strict: an unknown key
// anywhere is an InputError naming the nearest valid key; a wrong type or value names the key
// and what is allowed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/dtype.h"

namespace strata {

struct ModelConfig {
  std::string preset;            // "" when given by fields; else the preset's name
  std::string family = "gpt2";   // "gpt2" | "llama"
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn_hidden = 0, vocab = 0, seq_len = 0;
  bool tied_embeddings = true;   // gpt2 default true, llama default false
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;   // llama only
  float init_std = 0.02f;
};

struct ParallelismConfig {
  int tensor = 1, pipeline = 1, virtual_stages = 1;
  std::string schedule = "1f1b";  // "gpipe" | "1f1b" | "interleaved" | "zero_bubble"
  bool sequence_parallel = false;
  std::string order = "tp-dp-pp";  // a permutation of tp, dp, pp
};

struct DataConfig {
  std::string path;              // "" = the built-in demo corpus
  std::string format = "auto";   // "auto" | "llmc" | "megatron"
};

struct TrainConfig {
  int64_t steps = 0;             // 0 = the default of the run (demo: 200)
  uint64_t seed = 1234;
  std::string run_dir = "runs/default";
};

struct OptimizerConfig {
  std::string type = "adamw";    // "adam" | "adamw" | "sgd" (lower-cased)
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;    // adamw: decoupled; adam: L2 added to the gradient
  bool adam_w_mode = true;       // DeepSpeed's "adam" with adam_w_mode true behaves as AdamW
  float momentum = 0.0f;         // sgd
  bool nesterov = false;         // sgd
};

struct SchedulerConfig {
  std::string type;              // "" (constant lr) | "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"
  float warmup_min_lr = 0.0f, warmup_max_lr = 1e-3f;  // WarmupLR / WarmupDecayLR
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR (required there)
  float cos_min_ratio = 1e-4f, warmup_min_ratio = 0.0f;  // WarmupCosineLR
};

struct Fp16Config {
  bool enabled = false;
  float loss_scale = 0.0f;       // 0 = dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  float min_loss_scale = 1.0f;
};

struct Bf16Config {
  bool enabled = false;
  bool check_grad_overflow = true;
};

struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = false;     // DeepSpeed: unset means true iff stage 3
  bool contiguous_gradients = true;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool reduce_scatter = true;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct CheckpointConfig {
  std::string dir;               // "" = no checkpoints
  int64_t interval = 0;          // steps between saves; 0 = only when asked
  std::string tag_validation = "Warn";  // "Ignore" | "Warn" | "Fail"
  bool load_universal = false;
  bool use_node_local_storage = false;
};

struct ElasticityConfig {
  bool enabled = false;
  int64_t max_train_batch_size = 0;
  std::vector<int64_t> micro_batch_sizes;
  int min_gpus = 1, max_gpus = 10000;
  int64_t min_time = 0;
  double version = 0.2;
  bool ignore_non_elastic_batch_info = false;
  bool prefer_larger_batch = true;
};

struct Config {
  // The batch triangle, resolved for a data-parallel size (see resolve_batch).
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;

  float gradient_clipping = 1.0f;  // 0 disables
  int64_t steps_per_print = 10;    // 0 = never
  bool wall_clock_breakdown = false;
  std::optional<DType> communication_data_type;  // unset: fp16/bf16/fp32 from precision
  DType grad_accum_dtype = DType::F32;           // data_types.grad_accum_dtype

  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  ElasticityConfig elasticity;

  ModelConfig model;
  ParallelismConfig parallelism;
  DataConfig data;
  TrainConfig train;

  // Which of the three batch keys the user gave (0 = not given), before resolution.
  int64_t given_train_batch_size = 0, given_micro_batch = 0, given_grad_accum = 0;

  DType param_dtype() const {
    return bf16.enabled ? DType::BF16 : fp16.enabled ? DType::F16 : DType::F32;
  }
  DType comm_dtype() const { return communication_data_type.value_or(param_dtype()); }
};

// Parses and validates a whole config. `overrides` are "a.b.c=value" strings applied to the JSON
// before validation (value parsed as JSON, else taken as a string). Throws InputError.
Config parse_config(const nlohmann::json& j, const std::vector<std::string>& overrides = {});
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Resolves the batch triangle for a data-parallel size as DeepSpeed does (floor division when
// one key is missing; gradient_accumulation_steps=1 when two are); throws InputError naming all
// three values when they are inconsistent.
void resolve_batch(Config& c, int dp_size);

// Model presets: "gpt2-124M", "gpt2-350M", "bench-23M", "llama-tiny", "gpt2-tiny", "llama-1B"...
ModelConfig model_preset(const std::string& name);  // throws InputError listing the presets
std::vector<std::string> model_preset_names();
// Fills derived fields (kv_heads = heads, ffn_hidden = 4*hidden or Llama's 8/3 rounded) and
// checks consistency (hidden % heads, heads % kv_heads, even head dim for RoPE, ...).
void finalize_model(ModelConfig& m);

// Features that exist in the config but are not in effect at this layout/version: one line each,
// printed at startup ("zero_optimization.stage=3 is honoured trivially at 1 process", ...).
std::vector<std::string> config_notices(const Config& c, int world_size);

}  // namespace strata
