// Nothing in the config is silently ignored: every key the schema accepts is either implemented
// (read by strata, and it changes what a run does: the reviewed list below says where) or, set to
// a value other than its default, makes config_notices print a line naming it. The test walks the
// schema itself, so a key added to it without a note and without an entry here fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"

namespace strata {
namespace {

using nlohmann::json;

const json kMinimal = {{"train_micro_batch_size_per_gpu", 1}};

// Implemented keys and where they take effect. Reviewed by grepping each Config field's readers
// (src/strata/train/engine.cc, src/strata/zero/, src/strata/optim/, src/strata/model/,
// tools/strata/). "noted ..." marks the layouts where a key has no effect and a note says so.
struct Implemented {
  const char* key;
  const char* where;
};
const Implemented kImplemented[] = {
    {"train_batch_size", "resolve_batch: the global batch of Engine::train_batch"},
    {"train_micro_batch_size_per_gpu", "resolve_batch: the micro-batch of Engine::train_batch"},
    {"gradient_accumulation_steps", "resolve_batch: micro-steps per step in Engine"},
    {"gradient_clipping", "Engine::train_batch_on clips the global gradient norm"},
    {"steps_per_print", "train_command: progress lines"},
    {"wall_clock_breakdown", "train_command: progress_line adds the phase times"},
    {"communication_data_type",
     "Config::comm_dtype: the wire dtype of GradSync and ZeroSync (noted at 1 process)"},
    {"zero_allow_untested_optimizer", "check_cross_block: lets SGD run under ZeRO"},
    {"bf16.enabled", "Config::param_dtype: bf16 parameters and activations"},
    {"bf16.check_grad_overflow",
     "Engine::train_batch_on checks bf16 gradients for inf/nan (noted without bf16.enabled)"},
    {"fp16.enabled", "Config::param_dtype and Engine's LossScaler"},
    {"fp16.loss_scale", "LossScaler (noted without fp16.enabled, as the five below)"},
    {"fp16.initial_scale_power", "LossScaler"},
    {"fp16.loss_scale_window", "LossScaler"},
    {"fp16.hysteresis", "LossScaler"},
    {"fp16.consecutive_hysteresis", "LossScaler"},
    {"fp16.min_loss_scale", "LossScaler"},
    {"optimizer.type", "Optimizer: adam_step or sgd_step"},
    {"optimizer.params.lr", "Optimizer and lr_at"},
    {"optimizer.weight_decay_exclude", "set_weight_decay: each parameter's ParamRange::decay"},
    {"optimizer.params.betas", "kernels::adam_step"},
    {"optimizer.params.eps", "kernels::adam_step"},
    {"optimizer.params.weight_decay", "kernels::adam_step / sgd_step on decayed ranges"},
    {"optimizer.params.adam_w_mode", "Optimizer: decoupled or L2 weight decay for Adam"},
    {"optimizer.params.momentum", "kernels::sgd_step; momentum 0 allocates no state"},
    {"optimizer.params.nesterov", "kernels::sgd_step"},
    {"tensorboard.enabled", "RunMonitors: TensorBoard event files of each step"},
    {"tensorboard.output_path", "RunMonitors: the event files' directory (run_dir when empty)"},
    {"tensorboard.job_name", "RunMonitors: the subdirectory of output_path"},
    {"csv_monitor.enabled", "RunMonitors: DeepSpeed's CSV files of each step"},
    {"csv_monitor.output_path", "RunMonitors: the CSV files' directory (run_dir when empty)"},
    {"csv_monitor.job_name", "RunMonitors: the subdirectory of output_path"},
    {"scheduler.type", "lr_at"},
    {"scheduler.params.warmup_min_lr", "lr_at"},
    {"scheduler.params.warmup_max_lr", "lr_at"},
    {"scheduler.params.warmup_num_steps", "lr_at"},
    {"scheduler.params.warmup_type", "lr_at"},
    {"scheduler.params.total_num_steps", "lr_at"},
    {"scheduler.params.warmup_min_ratio", "lr_at"},
    {"scheduler.params.cos_min_ratio", "lr_at"},
    {"zero_optimization.stage", "Engine: ZeroSync at stages 1-3 (noted at 1 process)"},
    {"zero_optimization.overlap_comm",
     "GradSync and ZeroSync overlap reductions with backward (noted at 1 process)"},
    {"zero_optimization.reduce_bucket_size",
     "GradSync's bucket size at stage 0 (noted at 1 process and at stages 1-3)"},
    {"zero_optimization.stage3_prefetch_bucket_size",
     "zero_options -> ZeroSync at stage 3 (noted at stages 0-2, as the eight below)"},
    {"zero_optimization.prefetch_bucket_size", "alias of stage3_prefetch_bucket_size"},
    {"zero_optimization.stage3_param_persistence_threshold", "ZeroSync at stage 3"},
    {"zero_optimization.param_persistence_threshold", "alias"},
    {"zero_optimization.stage3_max_live_parameters", "ZeroSync at stage 3"},
    {"zero_optimization.max_live_parameters", "alias"},
    {"zero_optimization.stage3_max_reuse_distance", "ZeroSync at stage 3"},
    {"zero_optimization.max_reuse_distance", "alias"},
    {"zero_optimization.stage3_reshard_after_forward",
     "ZeroSync at stage 3: units released after each use or kept for the step"},
    {"zero_optimization.mics_shard_size",
     "Engine's shard_size: MiCS groups at stages 1-3 on several ranks (noted at stage 0)"},
    {"activation_checkpointing.recompute_granularity",
     "recompute_options: full or selective recompute, or none (the block alone turns on full)"},
    {"activation_checkpointing.recompute_method",
     "recompute_options: which number_checkpoints blocks (noted without number_checkpoints, "
     "under selective and none)"},
    {"activation_checkpointing.number_checkpoints",
     "recompute_options: how many blocks are fully recomputed (noted under selective and none)"},
    {"activation_checkpointing.partition_activations",
     "recompute_options -> the Transformer shards checkpoints over tp (noted at tensor=1, with "
     "sequence_parallel, under selective and none)"},
    {"activation_checkpointing.cpu_checkpointing",
     "recompute_options -> checkpoints in host memory (noted under selective and none)"},
    {"activation_checkpointing.synchronize_checkpoint_boundary",
     "recompute_options -> the Transformer synchronises around recomputed blocks (noted under "
     "none)"},
    {"activation_checkpointing.profile", "Engine: recompute times per block (noted under none)"},
    {"checkpoint.dir",
     "strata train: Engine::save_checkpoint every checkpoint.interval steps and "
     "at the end; --resume auto reads its latest"},
    {"checkpoint.interval", "strata train: the steps between saves (needs checkpoint.dir)"},
    {"data_types.grad_accum_dtype", "Engine: the gradient dtype under bf16/fp16"},
    {"data_types.param_dtype",
     "checked against fp16/bf16.enabled: a conflicting value is refused, an agreeing one "
     "restates them"},
    {"model.preset", "build_model_spec"},
    {"model.family", "build_model_spec and the Transformer"},
    {"model.layers", "build_model_spec"},
    {"model.hidden", "build_model_spec"},
    {"model.heads", "the Transformer's attention"},
    {"model.kv_heads", "the Transformer's attention (Llama)"},
    {"model.ffn_hidden", "build_model_spec"},
    {"model.vocab", "build_model_spec; Sampler::check_vocab"},
    {"model.seq_len", "build_model_spec; the Sampler's windows"},
    {"model.tied_embeddings", "build_model_spec: lm_head.weight or the embedding"},
    {"model.norm_eps", "the Transformer's norms"},
    {"model.rope_theta", "rope_forward / rope_backward (Llama)"},
    {"model.init_std", "init_param_slice"},
    {"model.head_dim", "build_model_spec and the attention's shape"},
    {"model.qkv_bias", "build_model_spec: the q, k and v biases (Qwen2)"},
    {"model.qk_norm", "build_model_spec and the Transformer's q/k norms (Qwen3)"},
    {"model.sliding_window", "the attention kernels' window (AttentionShape::window)"},
    {"model.layer_types", "the layers the window applies to"},
    {"model.rope_layers", "the layers that apply RoPE (SmolLM3)"},
    {"model.rope_scaling", "rope_table: RoPE's frequencies (linear, llama3, yarn)"},
    {"model.moe",
     "transformer_moe.cc: a mixture of experts in the MLPs (router, experts, balancing)"},
    {"model.norm_placement", "the Transformer: pre, sandwich (Gemma) or post (OLMo 2) norms"},
    {"model.norm_offset", "the RMSNorms' gain (offset + w): Gemma's 1 + w"},
    {"model.mlp_act", "the gated MLP's activation: swiglu or geglu"},
    {"model.embed_scale", "the embeddings times sqrt(hidden) (Gemma)"},
    {"model.query_pre_attn_scalar", "the attention scores' scale (AttentionShape::scale)"},
    {"model.rope_local_theta", "the sliding layers' RoPE base (Gemma 3)"},
    {"model.attn_logit_softcapping", "the attention kernels' soft-cap (Gemma 2)"},
    {"model.final_logit_softcapping", "the head's soft-cap: softcap_inplace, ce_dlogits (Gemma 2)"},
    {"parallelism.tensor",
     "RankGrid's tp axis; build_model_spec's TpLayout splits heads, MLP and vocabulary over it"},
    {"parallelism.sequence_parallel",
     "the Transformer's sequence-parallel regions over the tp group (noted with tensor=1)"},
    {"parallelism.order", "RankGrid: rank -> (dp, tp, pp) (noted with tensor=1 and pipeline=1)"},
    {"parallelism.timeout_s", "train_command: every communicator's watchdog (noted at 1 process)"},
    {"parallelism.pipeline", "RankGrid's pp axis; Engine's stages (pipeline/schedule.h)"},
    {"parallelism.virtual_stages", "Engine: model chunks per stage (interleaved schedule)"},
    {"parallelism.partition_blocks", "pipeline::partition, explicit method"},
    {"sequence_parallel_size", "parallelism.context with context_impl ulysses (DeepSpeed's key)"},
    {"parallelism.context",
     "RankGrid's cp axis; the Transformer's ContextOptions split every sequence over it"},
    {"parallelism.expert",
     "Engine's ep and edp groups; the spec's ExpertLayout, the MoE layers' all-to-all dispatch"},
    {"parallelism.expert_tensor", "checked against parallelism.tensor (only tensor is built)"},
    {"parallelism.expert_dispatch",
     "the MoE layers' dispatch: all-to-all or all-gather (transformer_moe.cc)"},
    {"parallelism.expert_overlap",
     "the shared expert computed while the dispatch is in flight (transformer_moe.cc)"},
    {"data.path", "open_dataset"},
    {"data.format", "open_dataset"},
    {"train.steps", "train_command: steps run"},
    {"data.val_path", "open_splits: the validation data"},
    {"data.packing", "sampler_options: Sampler's packed or contiguous windows"},
    {"data.document_mask", "Sampler's doc_begin, Transformer::forward's document masking"},
    {"data.eod_mask_loss", "sampler_options: document-opening targets not trained"},
    {"data.reset_attention_mask", "DataConfig::document_mask (Megatron's flag as an alias)"},
    {"data.reset_position_ids", "DataConfig::document_mask (Megatron's flag as an alias)"},
    {"train.eval_interval", "train_command: when Engine::evaluate runs"},
    {"train.straggler_interval", "StragglerWatch: the steps between gathers of phase times"},
    {"train.straggler_threshold", "StragglerWatch: how much slower than the median is slow"},
    {"train.straggler_patience", "StragglerWatch: windows in a row before a rank is named"},
    {"train.eval_iters", "Engine::evaluate: batches per evaluation"},
    {"elasticity.enabled",
     "apply_elastic_batch: the batch from the block; strata launch --elastic"},
    {"elasticity.max_train_batch_size", "compute_elastic (noted while elasticity is disabled)"},
    {"elasticity.micro_batch_sizes", "compute_elastic, elastic_step"},
    {"elasticity.min_gpus", "compute_elastic"},
    {"elasticity.max_gpus", "compute_elastic"},
    {"elasticity.version", "compute_elastic"},
    {"elasticity.ignore_non_elastic_batch_info", "apply_elastic_batch"},
    {"elasticity.prefer_larger_batch", "compute_elastic"},
    {"elasticity.num_gpus_per_node", "compute_elastic (version 0.2)"},
    {"elasticity.model_parallel_size", "apply_elastic_batch, compute_elastic"},
    {"train.seed", "Sampler and init_param_slice"},
    {"train.run_dir", "MetricsLog and the demo corpus"},
    {"train.device", "train_command select_device: the backend every tensor lives on"},
};

// Implemented keys that act on several ranks only: at 1 process the note must name them.
struct OneProcess {
  const char* key;
  json value;
};
const std::vector<OneProcess>& one_process_only() {
  static const std::vector<OneProcess> v = {
      {"communication_data_type", "fp16"},
      {"zero_optimization.stage", 2},
      {"zero_optimization.overlap_comm", true},
      {"zero_optimization.reduce_bucket_size", 1000},
      {"parallelism.timeout_s", 30},
  };
  return v;
}

// Keys without effect: a value other than the default, the settings it needs to parse, and the
// name the note gives it (an alias is noted under the name it aliases).
struct Noted {
  std::string key;
  json value;
  json context = json::object();
  std::string named_as = "";
};
const std::vector<Noted>& noted() {
  const json stage1 = {{"zero_optimization", {{"stage", 1}}}};
  const json tiny = {{"model", {{"preset", "gpt2-tiny"}}}};
  static const std::vector<Noted> v = {
      {"prescale_gradients", true},
      {"gradient_predivide_factor", 2.0},
      {"bf16.immediate_grad_update", true},
      {"bf16.bf16_master_weights_and_grads", true, stage1},
      {"bf16.bf16_optimizer_states",
       true,
       {{"zero_optimization", {{"stage", 1}}},
        {"bf16", {{"bf16_master_weights_and_grads", true}}}}},
      {"fp16.auto_cast", true},
      {"fp16.fp16_master_weights_and_grads", true, stage1},
      {"optimizer.params.torch_adam", true, {{"optimizer", {{"type", "AdamW"}}}}},
      {"zero_optimization.contiguous_gradients", false},
      {"zero_optimization.allgather_bucket_size", 1000},
      {"zero_optimization.reduce_scatter", false},
      {"zero_optimization.allgather_partitions", false},
      {"zero_optimization.stage3_model_persistence_threshold", 1000},
      {"zero_optimization.model_persistence_threshold", 1000, json::object(),
       "zero_optimization.stage3_model_persistence_threshold"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", true},
      {"zero_optimization.gather_16bit_weights_on_model_save", true, json::object(),
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", true, json::object(),
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {"zero_optimization.sub_group_size", 1000},
      {"zero_optimization.round_robin_gradients", true},
      {"zero_optimization.mics_hierarchical_params_gather", true},
      {"zero_optimization.offload_param.device", "cpu"},
      {"zero_optimization.offload_param.nvme_path", "/nvme"},
      {"zero_optimization.offload_param.buffer_count", 3},
      {"zero_optimization.offload_param.buffer_size", 1000},
      {"zero_optimization.offload_param.max_in_cpu", 1000},
      {"zero_optimization.offload_param.pin_memory", false},
      {"zero_optimization.offload_optimizer.device", "cpu"},
      {"zero_optimization.offload_optimizer.nvme_path", "/nvme"},
      {"zero_optimization.offload_optimizer.buffer_count", 3},
      {"zero_optimization.offload_optimizer.pin_memory", false},
      {"zero_optimization.offload_optimizer.pipeline_read", true},
      {"zero_optimization.offload_optimizer.pipeline_write", true},
      {"zero_optimization.offload_optimizer.fast_init", true},
      {"zero_optimization.offload_optimizer.ratio", 0.5, {{"zero_optimization", {{"stage", 3}}}}},
      {"activation_checkpointing.contiguous_memory_optimization", false},
      {"checkpoint.tag_validation", "Fail"},
      {"checkpoint.load_universal", true},
      {"checkpoint.use_node_local_storage", true},
      {"checkpoint.parallel_write.pipeline_stage", true},
      {"elasticity.min_time", 5},
      {"wandb.enabled", true},
      {"wandb.group", "g"},
      {"wandb.team", "t"},
      {"wandb.project", "p"},
      {"comet.enabled", true},
      {"comet.samples_log_interval", 10},
      {"comet.project", "p"},
      {"comet.workspace", "w"},
      {"comet.api_key", "k"},
      {"comet.experiment_name", "e"},
      {"comet.experiment_key", "x"},
      {"comet.online", false},
      {"comet.mode", "get"},
      {"parallelism.schedule", "gpipe"},
      {"parallelism.partition", "time"},
      {"parallelism.context_impl", "ring"},
      {"zero_optimization.elastic_checkpoint", true},
      {"zero_optimization.cpu_offload", true, json::object(),
       "zero_optimization.offload_optimizer.device"},
      {"zero_optimization.cpu_offload_param", true, json::object(),
       "zero_optimization.offload_param.device"},
      {"zero_optimization.cpu_offload_use_pin_memory", true},
      {"flops_profiler.enabled", true},
      {"flops_profiler.recompute_fwd_factor", 1.0},
      {"flops_profiler.profile_step", 3},
      {"flops_profiler.module_depth", 2},
      {"flops_profiler.top_modules", 2},
      {"flops_profiler.detailed", false},
      {"flops_profiler.output_file", "profile.txt"},
      {"comms_logger.enabled", true},
      {"comms_logger.verbose", true},
      {"comms_logger.prof_all", false},
      {"comms_logger.debug", true},
      {"comms_logger.prof_ops", json::array({"all_reduce"})},
      {"torch_autocast.enabled", true, {{"bf16", {{"enabled", true}}}}},
      {"torch_autocast.dtype", "torch.float16"},
      {"torch_autocast.lower_precision_safe_modules", json::array({"torch.nn.Linear"})},
      {"aio.block_size", 1048576},
      {"aio.queue_depth", 8},
      {"aio.intra_op_parallelism", 2},
      {"aio.thread_count", 2},
      {"aio.single_submit", true},
      {"aio.overlap_events", false},
      {"aio.use_gds", true},
      {"data_efficiency.enabled", true},
      {"data_efficiency.seed", 7},
      {"data_efficiency.data_sampling", {{"enabled", false}}},
      {"data_efficiency.data_routing", {{"enabled", false}}},
      {"dataloader_drop_last", true},
      {"zero_force_ds_cpu_optimizer", false},
  };
  return v;
}

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Whether `word` occurs in `s` not inside a longer identifier.
bool has_word(const std::string& s, const std::string& word) {
  for (size_t at = s.find(word); at != std::string::npos; at = s.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !is_word_char(s[at - 1])) && (end == s.size() || !is_word_char(s[end]))) {
      return true;
    }
  }
  return false;
}

// Whether a note names `key`: by its whole path, or in a group "block.a/b/c" (block split off the
// path after its first or its last dot).
bool names(const std::string& note, const std::string& key) {
  if (has_word(note, key)) return true;
  for (const size_t dot : {key.find('.'), key.rfind('.')}) {
    if (dot == std::string::npos) continue;
    const std::string block = key.substr(0, dot + 1), rest = key.substr(dot + 1);
    for (size_t at = note.find(block); at != std::string::npos; at = note.find(block, at + 1)) {
      if (at > 0 && is_word_char(note[at - 1])) continue;
      size_t end = at + block.size();
      while (end < note.size() &&
             (is_word_char(note[end]) || note[end] == '.' || note[end] == '/')) {
        ++end;
      }
      std::string group = "/";  // appended, not "/" + s + "/": GCC 12's -Wrestrict misfires
      group.append(note, at + block.size(), end - at - block.size()).append("/");
      if (group.find("/" + rest + "/") != std::string::npos) return true;
    }
  }
  return false;
}

bool any_names(const std::vector<std::string>& notes, const std::string& key) {
  return std::any_of(notes.begin(), notes.end(),
                     [&](const std::string& n) { return names(n, key); });
}

void set_path(json& j, const std::string& path, const json& value) {
  json* cur = &j;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    cur = &(*cur)[path.substr(start, dot - start)];
    start = dot + 1;
  }
  (*cur)[path.substr(start)] = value;
}

std::string lines(const std::vector<std::string>& notes) {
  std::string r;
  for (const std::string& n : notes) r += "\n    note: " + n;
  return r.empty() ? " (none)" : r;
}

// "" when setting n.key to n.value adds a note naming it at `world` processes; else what is wrong.
std::string check_noted(const Noted& n, int world) {
  json base = kMinimal;
  base.update(n.context, true);
  json keyed = base;
  set_path(keyed, n.key, n.value);
  const std::string named = n.named_as.empty() ? n.key : n.named_as;
  const std::string at = " at " + std::to_string(world) + " process(es)";
  std::vector<std::string> before, after;
  try {
    before = config_notices(parse_config(base), world);
    after = config_notices(parse_config(keyed), world);
  } catch (const InputError& e) {
    return n.key + ": the test's value does not parse: " + e.what();
  }
  if (any_names(before, named)) return n.key + ": noted without being set" + at + lines(before);
  if (!any_names(after, named)) {
    return n.key + "=" + n.value.dump() + " changes nothing in strata but no note names " + named +
           at + lines(after) + "\n  add a line to config_notices (src/strata/config/notices.cc)";
  }
  return "";
}

// The alias block "bfloat16" shares bf16's keys and classification.
std::string canonical(const std::string& key) {
  return key.rfind("bfloat16.", 0) == 0 ? "bf16." + key.substr(9) : key;
}

const Implemented* find_implemented(const std::string& key) {
  for (const Implemented& i : kImplemented) {
    if (key == i.key) return &i;
  }
  return nullptr;
}

const Noted* find_noted(const std::string& key) {
  for (const Noted& n : noted()) {
    if (key == n.key) return &n;
  }
  return nullptr;
}

// "" when `key` is implemented or noted at 1 and 4 processes; else what is wrong.
std::string classify(const std::string& key) {
  const std::string c = canonical(key);
  if (find_implemented(c) != nullptr) return "";
  const Noted* n = find_noted(c);
  if (n == nullptr) {
    return key +
           " is accepted by the schema but is neither in kImplemented (read by strata and it "
           "changes a run: say where) nor noted by config_notices when set (add the note and a "
           "noted() entry here)";
  }
  Noted entry = *n;
  if (c != key) {  // the legacy block: the same settings under its name
    entry.key = key;
    entry.named_as = n->named_as.empty() ? c : n->named_as;
    if (entry.context.contains("bf16")) {
      entry.context["bfloat16"] = entry.context["bf16"];
      entry.context.erase("bf16");
    }
  }
  for (int world : {1, 4}) {
    const std::string wrong = check_noted(entry, world);
    if (!wrong.empty()) return wrong;
  }
  return "";
}

TEST(ConfigKeys, EveryKeyIsImplementedOrNotedWhenSet) {
  const std::vector<std::string> keys = config_schema_keys();
  ASSERT_GT(keys.size(), 100u);
  for (const std::string& key : keys) {
    const std::string wrong = classify(key);
    EXPECT_TRUE(wrong.empty()) << wrong;
  }
}

TEST(ConfigKeys, KeysActingOnSeveralRanksOnlyAreNotedAtOneProcess) {
  for (const OneProcess& k : one_process_only()) {
    ASSERT_NE(find_implemented(k.key), nullptr) << k.key;
    json j = kMinimal;
    set_path(j, k.key, k.value);
    const std::vector<std::string> notes = config_notices(parse_config(j), 1);
    EXPECT_TRUE(any_names(notes, k.key)) << k.key << " at 1 process:" << lines(notes);
    EXPECT_FALSE(any_names(config_notices(parse_config(j), 4), k.key)) << k.key;
  }
}

// recompute_granularity "none" turns checkpointing off: every other key of the block, set, is
// noted. Walks the schema, so a key added to the block needs a value here and a note.
TEST(ConfigKeys, EveryActivationCheckpointingKeyIsNotedUnderGranularityNone) {
  const std::string block = "activation_checkpointing.";
  const std::vector<std::pair<std::string, json>> values = {
      {"partition_activations", true},
      {"cpu_checkpointing", true},
      {"contiguous_memory_optimization", true},
      {"number_checkpoints", 2},
      {"recompute_method", "block"},
      {"synchronize_checkpoint_boundary", true},
      {"profile", true}};
  for (const std::string& key : config_schema_keys()) {
    if (key.rfind(block, 0) != 0 || key == block + "recompute_granularity") continue;
    const std::string name = key.substr(block.size());
    const auto v = std::find_if(values.begin(), values.end(),
                                [&](const auto& kv) { return kv.first == name; });
    ASSERT_NE(v, values.end()) << key << ": give it a non-default value in this test";
    const json off = {{"activation_checkpointing", {{"recompute_granularity", "none"}}}};
    for (int world : {1, 4}) {
      EXPECT_EQ(check_noted({key, v->second, off}, world), "") << key;
    }
  }
}

// The lists name schema keys only, each once, in one list: they cannot drift from the schema.
TEST(ConfigKeys, TheListsHoldSchemaKeysOnly) {
  const std::vector<std::string> keys = config_schema_keys();
  const auto in_schema = [&](const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) != keys.end();
  };
  std::vector<std::string> listed;
  for (const Implemented& i : kImplemented) listed.push_back(i.key);
  for (const Noted& n : noted()) listed.push_back(n.key);
  for (const std::string& k : listed) EXPECT_TRUE(in_schema(k)) << k << " is not a schema key";
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(std::adjacent_find(listed.begin(), listed.end()), listed.end())
      << "a key is listed twice";
  EXPECT_TRUE(in_schema("bfloat16.enabled"));
  EXPECT_TRUE(in_schema("checkpoint.parallel_write.pipeline_stage"));
  EXPECT_FALSE(in_schema("checkpoint.parallel_write")) << "blocks are expanded into their keys";
}

// The test bites: a key in neither list, or a "noted" value that is the default, fails it.
TEST(ConfigKeys, TheCheckFailsAnUnclassifiedOrSilentKey) {
  EXPECT_FALSE(classify("zero_optimization.a_new_knob").empty());
  EXPECT_FALSE(check_noted({"zero_optimization.reduce_scatter", true}, 4).empty());
  EXPECT_FALSE(check_noted({"checkpoint.tag_validation", "Warn"}, 1).empty());
  EXPECT_TRUE(check_noted({"checkpoint.tag_validation", "Ignore"}, 1).empty());
}

}  // namespace
}  // namespace strata
