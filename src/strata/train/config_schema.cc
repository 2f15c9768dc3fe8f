// The schema of the config (every block's keys, and DeepSpeed keys strata does not implement) and
// the messages built from it: nearest-key suggestions for unknown keys.
#include <algorithm>
#include <cctype>

#include "strata/core/check.h"
#include "strata/train/config_internal.h"

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
const Keys kOptimizer = {"type", "params"};
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
                    "stage3_model_persistence_threshold",
                    "model_persistence_threshold",
                    "stage3_gather_16bit_weights_on_model_save",
                    "gather_16bit_weights_on_model_save",
                    "stage3_gather_fp16_weights_on_model_save",
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
const Keys kWandb = {"enabled", "group", "team", "project"};
const Keys kModel = {"preset",   "family",     "layers",  "hidden",  "heads",
                     "kv_heads", "ffn_hidden", "vocab",   "seq_len", "tied_embeddings",
                     "norm_eps", "rope_theta", "init_std"};
const Keys kParallelism = {"tensor",    "pipeline",          "virtual_stages",
                           "schedule",  "sequence_parallel", "order",
                           "timeout_s", "partition",         "partition_blocks"};
const Keys kData = {"path", "format", "val_path"};
const Keys kTrain = {"steps", "seed", "run_dir", "eval_interval", "eval_iters"};

// DeepSpeed keys strata does not implement, by block, with what to do instead.
struct Unsupported {
  std::string_view path, key, hint;
};
constexpr Unsupported kUnsupported[] = {
    {"", "amp", "use bf16 or fp16"},
    {"", "pipeline", "strata sets pipeline parallelism in parallelism.pipeline and .schedule"},
    {"", "tensor_parallel", "strata sets tensor parallelism in parallelism.tensor"},
    {"", "sequence_parallel_size",
     "strata shards sequences over the tensor group: parallelism.sequence_parallel"},
    {"", "fp32_allreduce", "use communication_data_type"},
    {"", "vocabulary_size", "the vocabulary is model.vocab"},
    {"", "comet", "strata's monitors are tensorboard, csv_monitor and wandb"},
    {"", "flops_profiler", "strata reports achieved FLOP/s in its metrics"},
    {"", "comms_logger", "remove it"},
    {"", "autotuning", "remove it"},
    {"", "sparse_attention", "remove it"},
    {"", "sparse_gradients", "remove it"},
    {"", "compression_training", "remove it"},
    {"", "curriculum_learning", "remove it"},
    {"", "data_efficiency", "remove it"},
    {"", "memory_breakdown", "strata reports memory per category in its metrics"},
    {"", "dump_state", "remove it"},
    {"", "disable_allgather", "remove it"},
    {"", "zero_force_ds_cpu_optimizer", "remove it"},
    {"", "gradient_allreduce_op", "gradients are averaged over data-parallel ranks"},
    {"", "dataloader_drop_last", "remove it"},
    {"", "torch_autocast", "use bf16 or fp16"},
    {"", "compile", "remove it"},
    {"", "aio", "remove it"},
    {"", "seq_parallel_communication_data_type", "use communication_data_type"},
    {"zero_optimization", "cpu_offload", "use offload_optimizer: {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_param", "use offload_param: {\"device\": \"cpu\"}"},
    {"zero_optimization", "cpu_offload_use_pin_memory", "use offload_*.pin_memory"},
    {"zero_optimization", "grad_hooks", "DeepSpeed documents it but has no such field"},
    {"zero_optimization", "elastic_checkpoint", "strata's checkpoints load under any layout"},
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

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return r;
}

size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lower(a_in), b = lower(b_in);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string nearest(std::string_view word, const Keys& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

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

void fail_unknown_key(std::string_view path, std::string_view key, const Keys& valid) {
  const std::string full = join_path(path, key);
  for (const Unsupported& u : kUnsupported) {
    if (u.path == path && u.key == key) {
      STRATA_INPUT_FAIL("'", full, "' is a DeepSpeed key that strata does not implement; ",
                        std::string(u.hint));
    }
  }
  const std::string near = nearest(key, valid);
  const size_t near_d = near.empty() ? SIZE_MAX : edit_distance(key, near);
  // The same key in another block ("seed" -> "train.seed") beats a distant neighbour.
  if (near_d > 1) {
    Keys elsewhere;
    for (const BlockSchema& b : schema()) {
      if (b.path == path || b.path == "bfloat16") continue;
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
      STRATA_INPUT_FAIL("unknown key '", full, "'; did you mean ", alternatives, "?");
    }
  }
  STRATA_INPUT_FAIL("unknown key '", full, "'; did you mean '", join_path(path, near), "'?");
}

}  // namespace strata::config_detail
