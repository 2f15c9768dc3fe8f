// DeepSpeed's blocks, with DeepSpeed's defaults and checks (deepspeed/runtime/config.py,
// precision_config.py, zero/config.py, zero/offload_config.py, lr_schedules.py, engine.py).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "strata/config/elasticity.h"
#include "strata/config/internal.h"
#include "strata/core/check.h"

namespace strata::config_detail {

namespace {

// "torch.float16" and "BF16" as DeepSpeed's DtypeEnum and get_communication_data_type take them.
DType parse_dtype_key(const Block& b, std::string_view key) {
  const json& v = b.at(key);
  if (!v.is_string()) b.fail(key, "one of \"fp32\", \"fp16\", \"bf16\"");
  std::string s = lower(v.get_ref<const std::string&>());
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return parse_dtype(s, b.key_path(key));
}

// A pydantic field given by name or by alias (stage3_prefetch_bucket_size / prefetch_bucket_size).
std::string_view alias_given(const Block& z, std::initializer_list<std::string_view> names) {
  std::string_view given;
  for (std::string_view n : names) {
    if (!z.has(n)) continue;
    if (!given.empty()) {
      STRATA_INPUT_FAIL(z.key_path(given), " and ", z.key_path(n),
                        " are two names of one setting; give only one");
    }
    given = n;
  }
  return given;
}

void parse_offload(const Block& z, std::string_view key, const Keys& keys, OffloadConfig& o,
                   bool param_block) {
  Block b = z.child(key, keys, true);
  b.nullable({"nvme_path"});
  b.get_choice("device", o.device, {"none", "cpu", "nvme"});
  b.get_string("nvme_path", o.nvme_path);
  b.get_int("buffer_count", o.buffer_count, 0);
  b.get_bool("pin_memory", o.pin_memory);
  if (param_block) {
    b.get_int("buffer_size", o.buffer_size, 0);
    b.get_int("max_in_cpu", o.max_in_cpu, 0);
  } else {
    b.get_bool("pipeline_read", o.pipeline_read);
    b.get_bool("pipeline_write", o.pipeline_write);
    b.get_bool("fast_init", o.fast_init);
    b.get_number("ratio", o.ratio, 0.0, 1.0);
  }
  if (o.device == "nvme" && o.nvme_path.empty()) {
    STRATA_INPUT_FAIL(b.key_path("device"), "=\"nvme\" needs ", b.key_path("nvme_path"),
                      ", the directory to swap to");
  }
}

// Keys of `params` that belong to another type of the same block: a clearer error than
// "unknown key" ("betas is not a parameter of SGD").
void check_params_of_type(const json* params, const std::string& path, const std::string& type,
                          const Keys& valid) {
  if (params == nullptr || !params->is_object()) return;
  const Keys& all = keys_of(path);
  for (const auto& [key, v] : params->items()) {
    if (std::find(valid.begin(), valid.end(), key) == valid.end() &&
        std::find(all.begin(), all.end(), key) != all.end()) {
      STRATA_INPUT_FAIL(join_path(path, key), " is not a parameter of ", type, "; ", type,
                        " takes ", list(valid, false));
    }
  }
}

}  // namespace

void parse_batch_and_top(const Block& top, Config& c) {
  top.get_int("train_batch_size", c.given_train_batch_size, 1);
  top.get_int("train_micro_batch_size_per_gpu", c.given_micro_batch, 1);
  top.get_int("gradient_accumulation_steps", c.given_grad_accum, 1);
  top.get_number("gradient_clipping", c.gradient_clipping, 0.0, HUGE_VAL);
  top.get_int("sequence_parallel_size", c.ds_sequence_parallel_size, 1);
  if (top.is_null("steps_per_print")) {
    c.steps_per_print = 0;  // DeepSpeed's None: no progress line
  } else {
    top.get_int("steps_per_print", c.steps_per_print, 0);
  }
  top.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  if (top.has("communication_data_type")) {
    const json& v = top.at("communication_data_type");
    if (v.is_string() && lower(v.get_ref<const std::string&>()) == "bfp16") {
      // DeepSpeed's spelling of bf16 here until it became "bf16" (Megatron-DeepSpeed's configs
      // carry it); the pinned release refuses it, strata reads it as bf16 with a note.
      c.communication_data_type = DType::BF16;
      c.extras.communication_data_type_bfp16 = true;
    } else {
      c.communication_data_type = parse_dtype_key(top, "communication_data_type");
    }
  }
  top.get_bool("prescale_gradients", c.prescale_gradients);
  top.get_number("gradient_predivide_factor", c.gradient_predivide_factor, 0.0, HUGE_VAL, true);
  top.get_bool("zero_allow_untested_optimizer", c.zero_allow_untested_optimizer);
}

void parse_precision(const Block& top, Config& c) {
  Block fp16 = top.child("fp16", keys_of("fp16"), true);
  Fp16Config& f = c.fp16;
  fp16.get_bool("enabled", f.enabled);
  fp16.get_bool("auto_cast", c.fp16_auto_cast);
  if (fp16.has("loss_scale")) {
    const json& v = fp16.at("loss_scale");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
      fp16.fail("loss_scale", "a finite number >= 0 (0 enables dynamic loss scaling)");
    }
    fp16.get_number("loss_scale", f.loss_scale, 0.0, HUGE_VAL);
  }
  fp16.get_int("initial_scale_power", f.initial_scale_power, 0, 127);
  fp16.get_int("loss_scale_window", f.loss_scale_window, INT_MIN);
  fp16.get_int("hysteresis", f.hysteresis, 1);
  fp16.get_bool("consecutive_hysteresis", f.consecutive_hysteresis);
  int64_t min_scale = 0;
  if (fp16.get_int("min_loss_scale", min_scale, INT64_MIN)) f.min_loss_scale = float(min_scale);
  fp16.get_bool("fp16_master_weights_and_grads", c.fp16_master_weights_and_grads);
  if (f.enabled && f.loss_scale == 0.0f) {  // dynamic scaling: DeepSpeed's checks
    if (f.loss_scale_window <= 0) {
      STRATA_INPUT_FAIL(
          "fp16.loss_scale_window must be > 0 when dynamic loss scaling is enabled "
          "(loss_scale=0), got ",
          f.loss_scale_window);
    }
    if (f.min_loss_scale <= 0) {
      STRATA_INPUT_FAIL(
          "fp16.min_loss_scale must be > 0 when dynamic loss scaling is enabled "
          "(loss_scale=0), got ",
          min_scale);
    }
  }

  if (top.has("bf16") && top.has("bfloat16")) {
    STRATA_INPUT_FAIL(
        "bf16 and bfloat16 are both given; bfloat16 is the legacy name of bf16: "
        "keep only bf16");
  }
  const char* bf16_key = top.has("bfloat16") ? "bfloat16" : "bf16";
  Block bf16 = top.child(bf16_key, keys_of("bf16"), true);
  Bf16Config& b = c.bf16;
  bf16.get_bool("enabled", b.enabled);
  bf16.get_bool("immediate_grad_update", b.immediate_grad_update);
  bf16.get_bool("check_grad_overflow", b.check_grad_overflow);
  bf16.get_bool("bf16_master_weights_and_grads", b.bf16_master_weights_and_grads);
  bf16.get_bool("bf16_optimizer_states", b.bf16_optimizer_states);
  if (f.enabled && b.enabled) {
    STRATA_INPUT_FAIL("fp16.enabled and ", bf16_key,
                      ".enabled are both true; one mixed-precision mode at a time (as DeepSpeed): "
                      "disable one of them");
  }

  Block dt = top.child("data_types", keys_of("data_types"));
  dt.nullable({"grad_accum_dtype", "param_dtype"});
  const DType pt = c.param_dtype();
  if (dt.has("param_dtype") && parse_dtype_key(dt, "param_dtype") != pt) {
    STRATA_INPUT_FAIL("data_types.param_dtype=", show(dt.at("param_dtype")),
                      " conflicts with the fp16/bf16 enabled flags, which make the parameters ",
                      dtype_name(pt), "; set the flag or remove data_types.param_dtype");
  }
  if (dt.has("grad_accum_dtype")) {
    const DType g = parse_dtype_key(dt, "grad_accum_dtype");
    if (g != DType::F32 && g != pt) {
      STRATA_INPUT_FAIL(
          "data_types.grad_accum_dtype=", show(dt.at("grad_accum_dtype")), " with ", dtype_name(pt),
          " parameters is not supported (DeepSpeed: unsupported mix); use \"fp32\" or "
          "the parameter dtype \"",
          dtype_name(pt), "\"");
    }
    c.grad_accum_dtype = g;
  }
}

void parse_optimizer(const Block& top, Config& c) {
  Block ob = top.child("optimizer", keys_of("optimizer"));
  if (!ob.present()) return;  // no block: strata's default AdamW (OptimizerConfig)
  OptimizerConfig& o = c.optimizer;
  std::string type;
  if (!ob.get_choice("type", type, {"Adam", "AdamW", "SGD"}, true)) {
    if (ob.has("type")) return;  // a bad type is listed already
    STRATA_INPUT_FAIL(
        "optimizer.type is required in an optimizer block: \"Adam\", \"AdamW\" or "
        "\"SGD\"");
  }
  // strata's key beside type and params (DeepSpeed passes params to the optimizer as keyword
  // arguments, where an unknown name is an error).
  if (ob.has("weight_decay_exclude")) {
    const json& x = ob.at("weight_decay_exclude");
    const Keys groups = {"bias", "norm", "embedding"};
    std::vector<std::string> out;
    const bool ok = x.is_array() && std::all_of(x.begin(), x.end(), [&](const json& g) {
                      return g.is_string() && std::find(groups.begin(), groups.end(),
                                                        g.get<std::string>()) != groups.end();
                    });
    if (!ok) {
      ob.fail("weight_decay_exclude",
              "a list of \"bias\", \"norm\", \"embedding\" (the parameters weight decay "
              "does not apply to; [] decays every parameter)");
    }
    for (const json& g : x) out.push_back(g.get<std::string>());
    o.weight_decay_exclude = out;
  }
  const json* params = ob.has("params") ? &ob.at("params") : nullptr;
  if (params != nullptr && params->is_object() && params->contains("max_grad_norm")) {
    STRATA_INPUT_FAIL(
        "optimizer.params.max_grad_norm is not supported as an optimizer parameter "
        "(as in DeepSpeed); use the top-level \"gradient_clipping\"");
  }
  const bool sgd = type == "SGD";
  const Keys adam_keys = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"};
  const Keys sgd_keys = {"lr", "momentum", "nesterov", "weight_decay"};
  const Keys& valid = sgd ? sgd_keys : adam_keys;
  check_params_of_type(params, "optimizer.params", type, valid);
  Block p = ob.child("params", valid);

  o.type = sgd ? "sgd" : type == "Adam" ? "adam" : "adamw";
  o.weight_decay = 0.0f;  // FusedAdam, DeepSpeedCPUAdam and torch SGD default to 0
  p.get_number("lr", o.lr, 0.0, HUGE_VAL);
  if (sgd) {
    p.get_number("momentum", o.momentum, 0.0, HUGE_VAL);
    p.get_bool("nesterov", o.nesterov);
    if (o.nesterov && o.momentum <= 0.0f) {
      STRATA_INPUT_FAIL(
          "optimizer.params.nesterov=true needs optimizer.params.momentum > 0 (as "
          "torch.optim.SGD); set momentum, e.g. 0.9");
    }
    p.get_number("weight_decay", o.weight_decay, 0.0, HUGE_VAL);
    return;
  }
  if (p.has("betas")) {
    const json& b = p.at("betas");
    const auto beta_ok = [](const json& x) {
      return x.is_number() && x.get<double>() >= 0.0 && x.get<double>() < 1.0;
    };
    if (!b.is_array() || b.size() != 2 || !beta_ok(b[0]) || !beta_ok(b[1])) {
      p.fail("betas", "two numbers in [0, 1), e.g. [0.9, 0.999]");
    }
    o.beta1 = b[0].get<float>();
    o.beta2 = b[1].get<float>();
  }
  p.get_number("eps", o.eps, 0.0, HUGE_VAL);
  bool adam_w_mode = true;  // DeepSpeed's ADAM_W_MODE_DEFAULT
  const bool w_given = p.get_bool("adam_w_mode", adam_w_mode);
  if (o.type == "adamw" && w_given && !adam_w_mode) {
    STRATA_INPUT_FAIL(
        "optimizer.params.adam_w_mode=false does nothing with type AdamW (DeepSpeed "
        "still decouples the weight decay); use type \"Adam\" for L2 weight decay");
  }
  o.adam_w_mode = o.type == "adamw" || adam_w_mode;
  p.get_bool("torch_adam", c.optimizer_torch_adam);
  // torch.optim.AdamW is the one implementation DeepSpeed may pick whose default decay is 0.01.
  if (c.optimizer_torch_adam && o.adam_w_mode) o.weight_decay = 0.01f;
  p.get_number("weight_decay", o.weight_decay, 0.0, HUGE_VAL);
}

void parse_scheduler(const Block& top, Config& c) {
  Block sb = top.child("scheduler", keys_of("scheduler"));
  if (!sb.present()) return;
  SchedulerConfig& s = c.scheduler;
  if (!sb.get_choice("type", s.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})) {
    if (sb.has("type")) return;  // a bad type is listed already
    STRATA_INPUT_FAIL(
        "scheduler.type is required in a scheduler block: \"WarmupLR\", "
        "\"WarmupDecayLR\" or \"WarmupCosineLR\"");
  }
  const Keys warmup_keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  const Keys decay_keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                           "total_num_steps"};
  const Keys cosine_keys = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                            "cos_min_ratio", "warmup_type"};
  const Keys& valid = s.type == "WarmupLR"        ? warmup_keys
                      : s.type == "WarmupDecayLR" ? decay_keys
                                                  : cosine_keys;
  check_params_of_type(sb.has("params") ? &sb.at("params") : nullptr, "scheduler.params", s.type,
                       valid);
  Block p = sb.child("params", valid);
  // DeepSpeed's schedulers take any warmup_num_steps >= 0 and warm up over max(2, it).
  const bool warmup_given = p.get_int("warmup_num_steps", s.warmup_num_steps, 0);
  p.get_choice("warmup_type", s.warmup_type, {"log", "linear"});
  if (s.type != "WarmupCosineLR") {
    p.get_number("warmup_min_lr", s.warmup_min_lr, 0.0, HUGE_VAL);
    // DeepSpeed: WarmupLR's warmup_max_lr defaults to None (the optimizer's lr), WarmupDecayLR's
    // to 0.001.
    if (s.type == "WarmupLR") s.warmup_max_lr = c.optimizer.lr;
    p.get_number("warmup_max_lr", s.warmup_max_lr, 0.0, HUGE_VAL);
  } else {
    p.get_number("warmup_min_ratio", s.warmup_min_ratio, 0.0, 1.0);
    p.get_number("cos_min_ratio", s.cos_min_ratio, 0.0, 1.0);
  }
  if (s.type == "WarmupLR") return;
  if (!p.has("total_num_steps")) {
    STRATA_INPUT_FAIL("scheduler.params.total_num_steps is required by ", s.type,
                      " (the step where the schedule ends), e.g. the run's train.steps");
  }
  if (!p.get_int("total_num_steps", s.total_num_steps, 1)) return;
  // WarmupDecayLR decays over max(1, total - warmup) steps: DeepSpeed only warns when total is
  // below warmup (noted by config_notices). WarmupCosineLR divides by total - warmup.
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);  // DeepSpeed's floor
  if (s.type == "WarmupCosineLR" && s.total_num_steps <= warmup) {
    STRATA_INPUT_FAIL(
        "scheduler.params.total_num_steps=", s.total_num_steps,
        " must be greater than scheduler.params.warmup_num_steps=", s.warmup_num_steps,
        warmup_given ? (s.warmup_num_steps < 2 ? " (2 in effect)" : "") : " (default)",
        " for WarmupCosineLR, whose cosine spans the steps between them; raise total_num_steps "
        "or lower warmup_num_steps");
  }
}

void parse_zero(const Block& top, Config& c) {
  if (top.has("zero_optimization") && top.at("zero_optimization").is_boolean()) {
    STRATA_INPUT_FAIL(
        "zero_optimization must be a block such as {\"stage\": 1}; DeepSpeed's legacy "
        "boolean form is not supported");
  }
  Block z = top.child("zero_optimization", keys_of("zero_optimization"), true);
  z.nullable({"overlap_comm", "offload_param", "offload_optimizer"});
  ZeroConfig& zc = c.zero;
  int64_t stage = 0;
  if (z.get_int("stage", stage, INT64_MIN)) {
    if (stage < 0 || stage > 3) {
      z.bad("stage", "one of 0, 1, 2, 3");
    } else {
      zc.stage = int(stage);
    }
  }
  zc.overlap_comm = zc.stage == 3;  // DeepSpeed: unset means true iff stage 3
  z.get_bool("overlap_comm", zc.overlap_comm);
  z.get_bool("contiguous_gradients", zc.contiguous_gradients);
  // DeepSpeed's bucket and sub-group sizes are pydantic ge=0 fields. reduce_bucket_size 0 flushes
  // the bucket before every gradient (each reduced alone): strata reduces unit by unit.
  z.get_int("reduce_bucket_size", zc.reduce_bucket_size, 0);
  if (z.get_int("allgather_bucket_size", zc.allgather_bucket_size, 0) &&
      zc.allgather_bucket_size % 2 != 0) {
    z.bad("allgather_bucket_size", "an even integer >= 0 (DeepSpeed's alignment)");
  }
  z.get_bool("reduce_scatter", zc.reduce_scatter);
  z.get_bool("allgather_partitions", zc.allgather_partitions);
  z.get_bool("round_robin_gradients", zc.round_robin_gradients);
  z.get_int("sub_group_size", zc.sub_group_size, 0);
  z.get_bool("elastic_checkpoint", c.extras.elastic_checkpoint);
  // DeepSpeed's MiCS: -1 (the default) shards over the whole data-parallel group.
  if (z.get_int("mics_shard_size", zc.mics_shard_size, -1) && zc.mics_shard_size == 0) {
    z.fail("mics_shard_size", "-1 (shard over all data-parallel ranks) or a group size >= 1");
  }
  z.get_bool("mics_hierarchical_params_gather", zc.mics_hierarchical_params_gather);

  const auto aliased = [&](std::initializer_list<std::string_view> names, int64_t& out,
                           int64_t lo) {
    std::string_view k = alias_given(z, names);
    if (!k.empty()) z.get_int(k, out, lo);
  };
  // 0: no prefetch (each unit is gathered when it is acquired). max_live_parameters 0 and
  // max_reuse_distance 0 keep nothing resident past its use.
  aliased({"stage3_prefetch_bucket_size", "prefetch_bucket_size"}, zc.stage3_prefetch_bucket_size,
          0);
  aliased({"stage3_param_persistence_threshold", "param_persistence_threshold"},
          zc.stage3_param_persistence_threshold, 0);
  aliased({"stage3_max_live_parameters", "max_live_parameters"}, zc.stage3_max_live_parameters, 0);
  aliased({"stage3_max_reuse_distance", "max_reuse_distance"}, zc.stage3_max_reuse_distance, 0);
  aliased({"stage3_model_persistence_threshold", "model_persistence_threshold"},
          zc.stage3_model_persistence_threshold, 0);
  z.get_bool("stage3_reshard_after_forward", zc.stage3_reshard_after_forward);
  std::string_view gather = alias_given(
      z, {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
          "stage3_gather_fp16_weights_on_model_save"});
  if (!gather.empty()) z.get_bool(gather, zc.stage3_gather_16bit_weights_on_model_save);

  parse_offload(z, "offload_param", keys_of("zero_optimization.offload_param"), zc.offload_param,
                true);
  parse_offload(z, "offload_optimizer", keys_of("zero_optimization.offload_optimizer"),
                zc.offload_optimizer, false);
  // DeepSpeed's deprecated switches, remapped as its pydantic model does;
  // cpu_offload_use_pin_memory is deprecated without a new parameter to set (DeepSpeed reads it
  // nowhere).
  for (const auto& [legacy, block, o] :
       {std::tuple{"cpu_offload", "offload_optimizer", &zc.offload_optimizer},
        std::tuple{"cpu_offload_param", "offload_param", &zc.offload_param}}) {
    bool on = false;
    if (!z.get_bool(legacy, on)) continue;
    if (z.has(block)) {
      z.report(z.key_path(legacy) + " is the deprecated form of " + z.key_path(block) +
               "; give only " + z.key_path(block) + " (DeepSpeed refuses both together)");
    } else if (on) {
      o->device = "cpu";
    }
  }
  z.get_bool("cpu_offload_use_pin_memory", c.extras.cpu_offload_use_pin_memory);
  if (zc.offload_optimizer.ratio < 1.0 && zc.stage != 3) {
    STRATA_INPUT_FAIL("zero_optimization.offload_optimizer.ratio=", zc.offload_optimizer.ratio,
                      " (partial offload) needs zero_optimization.stage 3, got stage ", zc.stage);
  }
}

namespace {

// The keys of `b` other than "enabled" that are given, in schema order.
std::vector<std::string> given_keys(const Block& b, const Keys& keys) {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    if (k != "enabled" && b.has(k)) out.push_back(k);
  }
  return out;
}

// A list of strings at `key` (DeepSpeed's prof_ops, lower_precision_safe_modules).
void check_string_list(const Block& b, std::string_view key) {
  if (!b.has(key)) return;
  const json& v = b.at(key);
  const auto is_string = [](const json& x) { return x.is_string(); };
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), is_string)) {
    b.bad(key, "a list of strings");
  }
}

// A switch inside data_efficiency's free-form settings: true, false or absent.
bool switch_on(const Block& de, const json* block, const std::string& path) {
  if (block == nullptr || !block->is_object() || !block->contains("enabled")) return false;
  const json& v = block->at("enabled");
  if (!v.is_boolean()) {
    de.report(path + ".enabled must be true or false, got " + show(v));
    return false;
  }
  return v.get<bool>();
}

const json* member(const json* block, const char* key) {
  if (block == nullptr || !block->is_object() || !block->contains(key)) return nullptr;
  return &block->at(key);
}

}  // namespace

void parse_deepspeed_extras(const Block& top, Config& c) {
  DeepSpeedExtrasConfig& x = c.extras;
  top.get_bool("dataloader_drop_last", x.dataloader_drop_last);
  top.get_bool("zero_force_ds_cpu_optimizer", x.zero_force_ds_cpu_optimizer);

  Block fp = top.child("flops_profiler", keys_of("flops_profiler"));
  fp.nullable({"output_file"});
  fp.get_bool("enabled", x.flops_profiler);
  double factor = 0;
  fp.get_number("recompute_fwd_factor", factor, 0.0, HUGE_VAL);
  int64_t n = 0;  // DeepSpeed's profiler fields are plain ints (profile_step -1: never)
  for (const char* key : {"profile_step", "module_depth", "top_modules"}) {
    fp.get_int(key, n, INT64_MIN);
  }
  bool flag = false;
  fp.get_bool("detailed", flag);
  std::string text;
  fp.get_string("output_file", text);
  x.flops_profiler_keys = given_keys(fp, keys_of("flops_profiler"));

  Block cl = top.child("comms_logger", keys_of("comms_logger"));
  cl.get_bool("enabled", x.comms_logger);
  for (const char* key : {"verbose", "prof_all", "debug"}) cl.get_bool(key, flag);
  check_string_list(cl, "prof_ops");
  x.comms_logger_keys = given_keys(cl, keys_of("comms_logger"));

  Block ta = top.child("torch_autocast", keys_of("torch_autocast"));
  ta.get_bool("enabled", x.torch_autocast);
  DType autocast = DType::BF16;  // DeepSpeed's default autocast dtype
  if (ta.has("dtype")) {
    const json& v = ta.at("dtype");
    std::string d = v.is_string() ? lower(v.get_ref<const std::string&>()) : "";
    if (d.rfind("torch.", 0) == 0) d = d.substr(6);
    if (d == "bfloat16" || d == "bf16") {
      autocast = DType::BF16;
    } else if (d == "float16" || d == "fp16" || d == "half") {
      autocast = DType::F16;
    } else {
      ta.bad("dtype", "\"torch.bfloat16\" or \"torch.float16\"");
    }
  }
  check_string_list(ta, "lower_precision_safe_modules");
  x.torch_autocast_keys = given_keys(ta, keys_of("torch_autocast"));
  // Autocast over fp32 parameters would run the matmuls in 16 bits: strata runs the model in its
  // parameter dtype only, so that is refused; over parameters already in that dtype it is moot.
  if (x.torch_autocast && autocast != c.param_dtype()) {
    const char* flag_key = autocast == DType::BF16 ? "bf16.enabled" : "fp16.enabled";
    ta.report(detail::concat(
        "torch_autocast.enabled=true computes in ", dtype_name(autocast), " over ",
        dtype_name(c.param_dtype()),
        " parameters; strata has no autocast and runs the model in its parameter dtype: set ",
        flag_key, "=true to train in ", dtype_name(autocast), ", or torch_autocast.enabled=false"));
  }

  Block aio = top.child("aio", keys_of("aio"));
  for (const char* key : {"block_size", "queue_depth", "intra_op_parallelism", "thread_count"}) {
    aio.get_int(key, n, 1);
  }
  if (aio.has("intra_op_parallelism") && aio.has("thread_count")) {
    aio.report(
        "aio.thread_count is the former name of aio.intra_op_parallelism; give only one of them");
  }
  for (const char* key : {"single_submit", "overlap_events", "use_gds"}) aio.get_bool(key, flag);
  x.aio_keys = given_keys(aio, keys_of("aio"));

  // Only the switches are read: with every feature off, DeepSpeed's data pipeline is untouched.
  Block de = top.child("data_efficiency", keys_of("data_efficiency"));
  de.get_bool("enabled", x.data_efficiency);
  uint64_t seed = 0;
  de.get_uint64("seed", seed);
  const json* sampling = de.has("data_sampling") ? &de.at("data_sampling") : nullptr;
  const json* routing = de.has("data_routing") ? &de.at("data_routing") : nullptr;
  if (sampling != nullptr && !sampling->is_object()) de.bad("data_sampling", "a block");
  if (routing != nullptr && !routing->is_object()) de.bad("data_routing", "a block");
  struct Feature {
    const json* block;
    std::string path, what;
  };
  const Feature features[] = {
      {sampling, "data_efficiency.data_sampling",
       "DeepSpeed's data sampler chooses which samples each step reads"},
      {member(sampling, "curriculum_learning"), "data_efficiency.data_sampling.curriculum_learning",
       "curriculum learning changes which samples (and sequence lengths) each step trains on"},
      {routing, "data_efficiency.data_routing",
       "data routing changes which tokens each layer computes"},
      {member(routing, "random_ltd"), "data_efficiency.data_routing.random_ltd",
       "random-LTD drops tokens from the middle layers"}};
  x.data_efficiency_keys = given_keys(de, keys_of("data_efficiency"));
  for (const Feature& f : features) {
    if (switch_on(de, f.block, f.path)) {
      de.report(f.path + ".enabled=true: " + f.what +
                ", which strata does not implement; ignoring it would change training, so set " +
                f.path + ".enabled=false (or remove data_efficiency)");
    }
  }
}

void parse_runtime_blocks(const Block& top, Config& c) {
  Block ac = top.child("activation_checkpointing", keys_of("activation_checkpointing"));
  ac.nullable({"number_checkpoints"});
  ActivationCheckpointingConfig& a = c.activation_checkpointing;
  a.enabled = ac.present();  // unlike DeepSpeed, the block alone turns checkpointing on
  ac.get_choice("recompute_granularity", a.recompute_granularity, {"full", "selective", "none"});
  ac.get_choice("recompute_method", a.recompute_method, {"uniform", "block"});
  ac.get_bool("partition_activations", a.partition_activations);
  ac.get_bool("cpu_checkpointing", a.cpu_checkpointing);
  bool contiguous = false;
  if (ac.get_bool("contiguous_memory_optimization", contiguous)) {
    a.contiguous_memory_optimization = contiguous;
  }
  int n = 0;
  if (ac.get_int("number_checkpoints", n, 1)) a.number_checkpoints = n;
  ac.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
  ac.get_bool("profile", a.profile);

  Block ck = top.child("checkpoint", keys_of("checkpoint"));
  CheckpointConfig& k = c.checkpoint;
  ck.get_string("dir", k.dir);
  ck.get_int("interval", k.interval, 0);
  ck.get_choice("tag_validation", k.tag_validation, {"Ignore", "Warn", "Fail"}, true);
  ck.get_bool("load_universal", k.load_universal);
  ck.get_bool("use_node_local_storage", k.use_node_local_storage);
  Block pw = ck.child("parallel_write", keys_of("checkpoint.parallel_write"));
  pw.get_bool("pipeline_stage", k.parallel_write_pipeline_stage);
  if (k.interval > 0 && k.dir.empty()) {
    STRATA_INPUT_FAIL("checkpoint.interval=", k.interval,
                      " needs checkpoint.dir, the directory to save to; set checkpoint.dir");
  }

  Block el = top.child("elasticity", keys_of("elasticity"));
  ElasticityConfig& e = c.elasticity;
  el.get_bool("enabled", e.enabled);
  el.get_int("max_train_batch_size", e.max_train_batch_size, 1);
  if (el.has("micro_batch_sizes")) {
    const json& mb = el.at("micro_batch_sizes");
    const auto positive_int = [](const json& x) {
      return x.is_number_integer() && x.get<int64_t>() > 0;
    };
    if (!mb.is_array() || mb.empty() || !std::all_of(mb.begin(), mb.end(), positive_int)) {
      el.fail("micro_batch_sizes", "a list of positive integers, e.g. [2, 4, 6]");
    }
    e.micro_batch_sizes = mb.get<std::vector<int64_t>>();
  }
  el.get_int("min_gpus", e.min_gpus, 1);
  el.get_int("max_gpus", e.max_gpus, 1);
  el.get_int("min_time", e.min_time, 0);
  el.get_number("version", e.version, 0.0, 0.2, true);
  el.get_bool("ignore_non_elastic_batch_info", e.ignore_non_elastic_batch_info);
  el.get_bool("prefer_larger_batch", e.prefer_larger_batch);
  el.get_int("num_gpus_per_node", e.num_gpus_per_node, 1);
  el.get_int("model_parallel_size", e.model_parallel_size, 1);
  if (e.max_gpus < e.min_gpus) {
    STRATA_INPUT_FAIL("elasticity.min_gpus=", e.min_gpus,
                      " cannot be greater than max_gpus=", e.max_gpus);
  }
  if (e.enabled) {
    for (const char* key : {"max_train_batch_size", "micro_batch_sizes"}) {
      if (!el.has(key)) {
        STRATA_INPUT_FAIL("elasticity.", key, " is required when elasticity.enabled is true");
      }
    }
  }
  if (e.model_parallel_size > 1 && e.version < 0.2) {
    STRATA_INPUT_FAIL("elasticity.model_parallel_size=", e.model_parallel_size,
                      " needs elasticity.version 0.2");
  }
  if (e.enabled) compute_elastic(e);  // DeepSpeed's errors at load (no valid batch, mp per node)

  for (const char* name : {"tensorboard", "csv_monitor"}) {
    Block m = top.child(name, keys_of(name), true);
    MonitorConfig& mc = std::string_view(name) == "tensorboard" ? c.tensorboard : c.csv_monitor;
    m.get_bool("enabled", mc.enabled);
    m.get_string("output_path", mc.output_path);
    m.get_string("job_name", mc.job_name);
  }
  Block w = top.child("wandb", keys_of("wandb"), true);
  w.nullable({"group", "team"});
  w.get_bool("enabled", c.wandb.enabled);
  w.get_string("group", c.wandb.group);
  w.get_string("team", c.wandb.team);
  w.get_string("project", c.wandb.project);
  Block cm = top.child("comet", keys_of("comet"), true);
  cm.nullable(
      {"project", "workspace", "api_key", "experiment_name", "experiment_key", "online", "mode"});
  CometConfig& co = c.comet;
  cm.get_bool("enabled", co.enabled);
  cm.get_int("samples_log_interval", co.samples_log_interval, 1);
  for (const auto& [key, out] :
       {std::pair{"project", &co.project}, std::pair{"workspace", &co.workspace},
        std::pair{"api_key", &co.api_key}, std::pair{"experiment_name", &co.experiment_name},
        std::pair{"experiment_key", &co.experiment_key}, std::pair{"mode", &co.mode}}) {
    cm.get_string(key, *out);
  }
  bool online = false;
  co.online_set = cm.get_bool("online", online);
}

void check_cross_block(Config& c) {
  const int stage = c.zero.stage;
  if (c.fp16_master_weights_and_grads && stage == 0) {
    STRATA_INPUT_FAIL(
        "fp16.fp16_master_weights_and_grads needs zero_optimization.stage 1, 2 or 3 "
        "(as in DeepSpeed)");
  }
  if (c.bf16.bf16_master_weights_and_grads && stage == 0) {
    STRATA_INPUT_FAIL(
        "bf16.bf16_master_weights_and_grads needs zero_optimization.stage 1, 2 or 3 "
        "(as in DeepSpeed)");
  }
  if (c.bf16.bf16_optimizer_states && !c.bf16.bf16_master_weights_and_grads) {
    STRATA_INPUT_FAIL(
        "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads=true "
        "(as in DeepSpeed)");
  }
  const std::optional<int> checkpoints = c.activation_checkpointing.number_checkpoints;
  if (checkpoints && *checkpoints > c.model.layers) {
    STRATA_INPUT_FAIL("activation_checkpointing.number_checkpoints=", *checkpoints,
                      " exceeds the model's ", c.model.layers, " blocks; set 1..", c.model.layers,
                      " or remove it to checkpoint every block");
  }
  if (c.optimizer.type == "sgd" && stage > 0 && !c.zero_allow_untested_optimizer) {
    STRATA_INPUT_FAIL(
        "optimizer.type SGD is not one of ZeRO's tested optimizers (Adam, AdamW); "
        "as DeepSpeed, zero_optimization.stage=",
        stage, " needs \"zero_allow_untested_optimizer\": true to use it");
  }
}

}  // namespace strata::config_detail
