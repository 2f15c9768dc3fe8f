// The schema of the config (every block's keys, and DeepSpeed keys strata does not implement) and
// the messages built from it: nearest-key suggestions for unknown keys.
#include <algorithm>
#include <cctype>

#include "strata/config/internal.h"
#include "strata/core/check.h"
#include "strata/core/text.h"

namespace strata::config_detail {

namespace {

// ---- the schema ----

const Keys kTop = {"train_batch_size",
                   "train_micro_batch_size_per_gpu",
                   "gradient_accumulation_steps",
                   "gradient_clipping",
                   "steps_per_print",
                   "wall_clock_breakdown",
                   "communication_data_type",
                   "prescale_gradients",
                   "gradient_predivide_factor",
                   "zero_allow_untested_optimizer",
                   "sequence_parallel_size",
                   "bf16",
                   "bfloat16",
                   "fp16",
                   "optimizer",
                   "scheduler",
                   "zero_optimization",
                   "activation_checkpointing",
                   "checkpoint",
                   "data_types",
                   "elasticity",
                   "tensorboard",
                   "csv_monitor",
                   "wandb",
                   "comet",
                   "flops_profiler",
                   "comms_logger",
                   "torch_autocast",
                   "aio",
                   "data_efficiency",
                   "dataloader_drop_last",
                   "zero_force_ds_cpu_optimizer",
                   "model",
                   "parallelism",
                   "data",
                   "train"};
const Keys kBf16 = {"enabled", "immediate_grad_update", "check_grad_overflow",
                    "bf16_master_weights_and_grads", "bf16_optimizer_states"};
const Keys kFp16 = {"enabled",
                    "auto_cast",
                    "loss_scale",
                    "initial_scale_power",
                    "loss_scale_window",
                    "hysteresis",
                    "consecutive_hysteresis",
                    "min_loss_scale",
                    "fp16_master_weights_and_grads"};
const Keys kOptimizer = {"type", "params", "weight_decay_exclude"};
const Keys kOptimizerParams = {"lr",          "betas",      "eps",      "weight_decay",
                               "adam_w_mode", "torch_adam", "momentum", "nesterov"};
const Keys kScheduler = {"type", "params"};
const Keys kSchedulerParams = {"warmup_min_lr", "warmup_max_lr",   "warmup_num_steps",
                               "warmup_type",   "total_num_steps", "warmup_min_ratio",
                               "cos_min_ratio"};
// DeepSpeed's pydantic model accepts both a field's name and its stage3_ alias.
const Keys kZero = {"stage",
                    "overlap_comm",
                    "contiguous_gradients",
                    "reduce_bucket_size",
                    "allgather_bucket_size",
                    "reduce_scatter",
                    "allgather_partitions",
                    "stage3_prefetch_bucket_size",
                    "prefetch_bucket_size",
                    "stage3_param_persistence_threshold",
                    "param_persistence_threshold",
                    "stage3_max_live_parameters",
                    "max_live_parameters",
                    "stage3_max_reuse_distance",
                    "max_reuse_distance",
                    "stage3_reshard_after_forward",
                    "stage3_model_persistence_threshold",
                    "model_persistence_threshold",
                    "stage3_gather_16bit_weights_on_model_save",
                    "gather_16bit_weights_on_model_save",
                    "stage3_gather_fp16_weights_on_model_save",
                    "elastic_checkpoint",
                    "cpu_offload",
                    "cpu_offload_param",
                    "cpu_offload_use_pin_memory",
                    "sub_group_size",
                    "round_robin_gradients",
                    "mics_shard_size",
                    "mics_hierarchical_params_gather",
                    "offload_param",
                    "offload_optimizer"};
const Keys kOffloadParam = {"device",      "nvme_path",  "buffer_count",
                            "buffer_size", "max_in_cpu", "pin_memory"};
const Keys kOffloadOptimizer = {"device",        "nvme_path",      "buffer_count", "pin_memory",
                                "pipeline_read", "pipeline_write", "fast_init",    "ratio"};
// DeepSpeed's keys, then strata's two from Megatron (recompute_granularity, recompute_method).
const Keys kActivationCheckpointing = {"partition_activations",           "cpu_checkpointing",
                                       "contiguous_memory_optimization",  "number_checkpoints",
                                       "synchronize_checkpoint_boundary", "profile",
                                       "recompute_granularity",           "recompute_method"};
const Keys kCheckpoint = {
    "dir",           "interval", "tag_validation", "load_universal", "use_node_local_storage",
    "parallel_write"};
const Keys kParallelWrite = {"pipeline_stage"};
const Keys kDataTypes = {"grad_accum_dtype", "param_dtype"};
const Keys kElasticity = {"enabled",
                          "max_train_batch_size",
                          "micro_batch_sizes",
                          "min_gpus",
                          "max_gpus",
                          "min_time",
                          "version",
                          "ignore_non_elastic_batch_info",
                          "prefer_larger_batch",
                          "num_gpus_per_node",
                          "model_parallel_size"};
const Keys kMonitor = {"enabled", "output_path", "job_name"};
// DeepSpeed's profiling and logging blocks, its NVMe I/O block (thread_count: the name before
// intra_op_parallelism) and torch_autocast: read to be checked and noted (DeepSpeedExtrasConfig).
const Keys kFlopsProfiler = {"enabled",      "recompute_fwd_factor", "profile_step",
                             "module_depth", "top_modules",          "detailed",
                             "output_file"};
const Keys kCommsLogger = {"enabled", "verbose", "prof_all", "debug", "prof_ops"};
const Keys kTorchAutocast = {"enabled", "dtype", "lower_precision_safe_modules"};
const Keys kAio = {"block_size",   "queue_depth",   "intra_op_parallelism",
                   "thread_count", "single_submit", "overlap_events",
                   "use_gds"};
// data_efficiency: only the switches are read; the settings under them (curriculum metrics,
// random-LTD schedules) are DeepSpeed's to interpret and are taken as given.
const Keys kDataEfficiency = {"enabled", "seed", "data_sampling", "data_routing"};
const Keys kWandb = {"enabled", "group", "team", "project"};
const Keys kComet = {"enabled",         "samples_log_interval", "project", "workspace", "api_key",
                     "experiment_name", "experiment_key",       "online",  "mode"};
const Keys kModel = {"preset",
                     "family",
                     "layers",
                     "hidden",
                     "heads",
                     "kv_heads",
                     "ffn_hidden",
                     "vocab",
                     "seq_len",
                     "head_dim",
                     "tied_embeddings",
                     "norm_eps",
                     "rope_theta",
                     "init_std",
                     "qkv_bias",
                     "qk_norm",
                     "sliding_window",
                     "layer_types",
                     "rope_layers",
                     "rope_scaling",
                     "norm_placement",
                     "norm_offset",
                     "mlp_act",
                     "embed_scale",
                     "query_pre_attn_scalar",
                     "attn_logit_softcapping",
                     "final_logit_softcapping",
                     "rope_local_theta",
                     "moe"};
const Keys kParallelism = {
    "tensor",       "pipeline",  "virtual_stages", "schedule",         "sequence_parallel",
    "order",        "timeout_s", "partition",      "partition_blocks", "context",
    "context_impl", "expert",    "expert_tensor",  "expert_dispatch",  "expert_overlap"};
const Keys kData = {"path",
                    "format",
                    "val_path",
                    "packing",
                    "document_mask",
                    "eod_mask_loss",
                    "reset_attention_mask",
                    "reset_position_ids"};
const Keys kTrain = {"steps",
                     "seed",
                     "run_dir",
                     "eval_interval",
                     "eval_iters",
                     "device",
                     "straggler_interval",
                     "straggler_threshold",
                     "straggler_patience"};

// DeepSpeed keys strata does not implement, by block, with what to do instead.
struct Unsupported {
  std::string_view path, key, hint;
};
constexpr Unsupported kUnsupported[] = {
    {"", "amp", "use bf16 or fp16"},
    {"", "pipeline", "strata sets pipeline parallelism in parallelism.pipeline and .schedule"},
    {"", "tensor_parallel", "strata sets tensor parallelism in parallelism.tensor"},
    {"", "fp32_allreduce", "use communication_data_type"},
    {"", "vocabulary_size", "the vocabulary is model.vocab"},
    {"", "autotuning", "remove it"},
    {"", "sparse_attention", "remove it"},
    {"", "sparse_gradients", "remove it"},
    {"", "compression_training", "remove it"},
    {"", "curriculum_learning", "remove it"},
    {"", "memory_breakdown", "strata reports memory per category in its metrics"},
    {"", "dump_state", "remove it"},
    {"", "disable_allgather", "remove it"},
    {"", "gradient_allreduce_op", "gradients are averaged over data-parallel ranks"},
    {"", "compile", "remove it"},
    {"", "seq_parallel_communication_data_type", "use communication_data_type"},
    {"zero_optimization", "grad_hooks", "DeepSpeed documents it but has no such field"},
    {"zero_optimization", "load_from_fp32_weights", "strata always loads the fp32 master"},
    {"zero_optimization", "use_multi_rank_bucket_allreduce", "remove it"},
    {"zero_optimization", "ignore_unused_parameters", "remove it"},
    {"zero_optimization", "legacy_stage1", "remove it"},
    {"zero_optimization", "zero_hpz_partition_size", "remove it"},
    {"zero_optimization", "zero_quantized_weights", "remove it"},
    {"zero_optimization", "zero_quantized_nontrainable_weights", "remove it"},
    {"zero_optimization", "zero_quantized_gradients", "remove it"},
    {"zero_optimization", "zeropp_loco_param", "remove it"},
    {"zero_optimization", "mics_shard_size", "remove it"},
    {"zero_optimization", "mics_hierarchical_params_gather", "remove it"},
    {"zero_optimization", "memory_efficient_linear", "remove it"},
    {"zero_optimization", "pipeline_loading_checkpoint", "remove it"},
    {"zero_optimization", "override_module_apply", "remove it"},
    {"zero_optimization", "log_trace_cache_warnings",
     "strata's ZeRO-3 fetch order is static, there is no trace cache"},
    {"zero_optimization", "stage3_module_granularity_threshold", "remove it"},
    {"zero_optimization", "stage3_use_all_reduce_for_fetch_params", "remove it"},
    {"zero_optimization", "stage3_allgather_sequential", "remove it"},
    {"zero_optimization", "zenflow", "remove it"},
    {"zero_optimization", "leaf_module", "a unit is one Transformer block"},
    {"zero_optimization.offload_optimizer", "super_offload", "remove it"},
    {"zero_optimization.offload_optimizer", "cpuadam_cores_perc", "remove it"},
    {"optimizer", "legacy_fusion", "remove it"},
    {"optimizer.params", "bias_correction", "strata's Adam always corrects the bias"},
    {"optimizer.params", "amsgrad", "DeepSpeed's FusedAdam has no AMSGrad either"},
    {"optimizer.params", "dampening", "strata's SGD has no dampening"},
    {"scheduler.params", "last_batch_iteration",
     "a resumed run takes the step from its checkpoint"},
};

}  // namespace

const std::vector<BlockSchema>& schema() {
  static const std::vector<BlockSchema> s = {
      {"", &kTop},
      {"bf16", &kBf16},
      {"bfloat16", &kBf16},
      {"fp16", &kFp16},
      {"optimizer", &kOptimizer},
      {"optimizer.params", &kOptimizerParams},
      {"scheduler", &kScheduler},
      {"scheduler.params", &kSchedulerParams},
      {"zero_optimization", &kZero},
      {"zero_optimization.offload_param", &kOffloadParam},
      {"zero_optimization.offload_optimizer", &kOffloadOptimizer},
      {"activation_checkpointing", &kActivationCheckpointing},
      {"checkpoint", &kCheckpoint},
      {"checkpoint.parallel_write", &kParallelWrite},
      {"data_types", &kDataTypes},
      {"elasticity", &kElasticity},
      {"tensorboard", &kMonitor},
      {"csv_monitor", &kMonitor},
      {"wandb", &kWandb},
      {"comet", &kComet},
      {"flops_profiler", &kFlopsProfiler},
      {"comms_logger", &kCommsLogger},
      {"torch_autocast", &kTorchAutocast},
      {"aio", &kAio},
      {"data_efficiency", &kDataEfficiency},
      {"model", &kModel},
      {"parallelism", &kParallelism},
      {"data", &kData},
      {"train", &kTrain},
  };
  return s;
}

const Keys& keys_of(std::string_view path) {
  for (const BlockSchema& b : schema()) {
    if (b.path == path) return *b.keys;
  }
  STRATA_FAIL("no config block '", std::string(path), "' in the schema");
}

}  // namespace strata::config_detail

namespace strata {

std::vector<std::string> config_schema_keys() {
  using namespace config_detail;
  const auto is_block = [](const std::string& path) {
    for (const BlockSchema& b : schema()) {
      if (b.path == path) return true;
    }
    return false;
  };
  std::vector<std::string> out;
  for (const BlockSchema& b : schema()) {
    for (const std::string& key : *b.keys) {
      const std::string path = join_path(b.path, key);
      if (!is_block(path)) out.push_back(path);
    }
  }
  return out;
}

}  // namespace strata

namespace strata::config_detail {

// ---- messages ----

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string join_path(std::string_view parent, std::string_view key) {
  std::string r(parent);
  if (!r.empty()) r += '.';
  r += key;
  return r;
}

std::string list(const Keys& items, bool quote) {
  std::string r;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) r += ", ";
    r += quote ? "\"" + items[i] + "\"" : items[i];
  }
  return r;
}

std::string unknown_key_message(std::string_view path, std::string_view key, const Keys& valid) {
  const std::string full = join_path(path, key);
  for (const Unsupported& u : kUnsupported) {
    if (u.path == path && u.key == key) {
      return "'" + full + "' is a DeepSpeed key that strata does not implement; " +
             std::string(u.hint);
    }
  }
  const std::string near = nearest(key, valid);
  const size_t near_d = near.empty() ? SIZE_MAX : edit_distance(key, near);
  // The same key in another block ("seed" -> "train.seed") beats a distant neighbour.
  if (near_d > 1) {
    Keys elsewhere;
    for (const BlockSchema& b : schema()) {
      // Not the legacy alias, nor the DeepSpeed blocks strata only checks.
      const bool quiet = b.path == "bfloat16" || b.path == "flops_profiler" ||
                         b.path == "comms_logger" || b.path == "torch_autocast" ||
                         b.path == "aio" || b.path == "data_efficiency";
      if (b.path == path || quiet) continue;
      if (std::find(b.keys->begin(), b.keys->end(), key) != b.keys->end()) {
        elsewhere.push_back(join_path(b.path, key));
      }
    }
    if (!elsewhere.empty()) {
      if (elsewhere.size() > 3) elsewhere.resize(3);
      std::string alternatives;
      for (size_t i = 0; i < elsewhere.size(); ++i) {
        alternatives.append(i == 0 ? "'" : " or '").append(elsewhere[i]).append("'");
      }
      return "unknown key '" + full + "'; did you mean " + alternatives + "?";
    }
  }
  return "unknown key '" + full + "'; did you mean '" + join_path(path, near) + "'?";
}

}  // namespace strata::config_detail
