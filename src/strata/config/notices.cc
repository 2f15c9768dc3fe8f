// The start-up notes for settings the config accepts that are not in effect: features of later
// releases, DeepSpeed keys strata has no use for, and keys whose effect depends on the layout
// (one process, the ZeRO stage). A key set to its default says nothing; any other value is never
// silently ignored (tests/config/keys_test.cc walks the schema to keep it so).
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/check.h"

namespace strata {

namespace {

// "block.a/b/c" for the keys of `block` that are set (not at their default); "" when none.
std::string keys_set(std::string_view block,
                     std::initializer_list<std::pair<const char*, bool>> keys) {
  std::string r;
  for (const auto& [key, set] : keys) {
    if (!set) continue;
    r += r.empty() ? std::string(block) + "." : "/";
    r += key;
  }
  return r;
}

// " has" or " have" for a keys_set() list.
const char* has(const std::string& keys) {
  return keys.find('/') == std::string::npos ? " has" : " have";
}

// The offload keys besides `device` that differ from their defaults.
std::string offload_keys_set(std::string_view block, const OffloadConfig& o,
                             const OffloadConfig& d) {
  return keys_set(block, {{"nvme_path", o.nvme_path != d.nvme_path},
                          {"buffer_count", o.buffer_count != d.buffer_count},
                          {"buffer_size", o.buffer_size != d.buffer_size},
                          {"max_in_cpu", o.max_in_cpu != d.max_in_cpu},
                          {"pin_memory", o.pin_memory != d.pin_memory},
                          {"pipeline_read", o.pipeline_read != d.pipeline_read},
                          {"pipeline_write", o.pipeline_write != d.pipeline_write},
                          {"fast_init", o.fast_init != d.fast_init},
                          {"ratio", o.ratio != d.ratio}});
}

// The notices' lines, each made of parts as detail::concat joins them.
struct Notes {
  std::vector<std::string> lines;
  template <typename... Parts>
  void add(Parts&&... parts) {
    lines.push_back(detail::concat(std::forward<Parts>(parts)...));
  }
};

// Zero_optimization.
void zero_notices(const Config& c, int world_size, Notes& n) {
  const bool one = world_size == 1;
  const ZeroConfig& z = c.zero;
  const ZeroConfig dz;
  if (z.stage > 0 && one) {
    n.add("zero_optimization.stage=", z.stage,
          " is honoured trivially at 1 process: partitioning over one rank changes nothing");
  }
  if (z.mics_shard_size > 0 && z.stage == 0) {
    n.add("zero_optimization.mics_shard_size=", z.mics_shard_size,
          " has no effect at stage 0: nothing is sharded");
  }
  if (z.mics_shard_size > 0 && (z.stage == 1 || z.stage == 2) && !one) {
    n.add("zero_optimization.mics_shard_size=", z.mics_shard_size, " at stage ", z.stage,
          ": strata shards the stage-", z.stage, " states within groups of ", z.mics_shard_size,
          " ranks and replicates them across groups (DeepSpeed applies MiCS at stage 3 only)");
  }
  if (z.stage >= 1 && !one) {
    n.add(
        "zero_optimization.reduce_bucket_size: at stage ", z.stage,
        " each unit (a vocabulary piece, a sublayer, the final norm) is one reduce-scatter and one "
        "all-gather; the "
        "bucket size applies at stage 0");
  }
  if (z.allgather_bucket_size != dz.allgather_bucket_size) {
    n.add(
        "zero_optimization.allgather_bucket_size has no effect: stage 0 all-gathers nothing and "
        "stages 1-3 all-gather one unit (a vocabulary piece, a sublayer, the final norm) at a "
        "time");
  }
  if (!z.contiguous_gradients) {
    n.add(
        "zero_optimization.contiguous_gradients=false has no effect: strata's gradients are "
        "always contiguous (one buffer at stages 0-1; at stages 2-3 each unit accumulates into a "
        "buffer of the largest unit's size that is reduce-scattered from there)");
  }
  if (!z.allgather_partitions) {
    n.add(
        "zero_optimization.allgather_partitions=false has no effect: updated partitions are "
        "always all-gathered (DeepSpeed's false broadcasts them from each owner instead)");
  }
  if (!z.reduce_scatter) {
    n.add(
        "zero_optimization.reduce_scatter=false has no effect: at stages 1-3 gradients are always "
        "reduce-scattered (all-reduced at stage 0)");
  }
  if (z.sub_group_size != dz.sub_group_size) {
    n.add(
        "zero_optimization.sub_group_size has no effect: the optimizer steps the whole partition "
        "at once");
  }
  if (z.round_robin_gradients) {
    n.add(
        "zero_optimization.round_robin_gradients has no effect: it spreads gradient copies for "
        "CPU offload, which is not in effect");
  }
  if (z.stage3_model_persistence_threshold != dz.stage3_model_persistence_threshold) {
    n.add(
        "zero_optimization.stage3_model_persistence_threshold has no effect: units stay whole by "
        "stage3_param_persistence_threshold alone");
  }
  if (z.mics_hierarchical_params_gather) {
    n.add(
        "zero_optimization.mics_hierarchical_params_gather has no effect: stage-3 gathers stay "
        "inside a shard group");
  }
  const std::string stage3_only = keys_set(
      "zero_optimization",
      {{"stage3_prefetch_bucket_size",
        z.stage3_prefetch_bucket_size != dz.stage3_prefetch_bucket_size},
       {"stage3_param_persistence_threshold",
        z.stage3_param_persistence_threshold != dz.stage3_param_persistence_threshold},
       {"stage3_max_live_parameters",
        z.stage3_max_live_parameters != dz.stage3_max_live_parameters},
       {"stage3_max_reuse_distance", z.stage3_max_reuse_distance != dz.stage3_max_reuse_distance},
       {"stage3_reshard_after_forward",
        z.stage3_reshard_after_forward != dz.stage3_reshard_after_forward}});
  if (!stage3_only.empty() && z.stage != 3) {
    n.add(stage3_only, has(stage3_only), " no effect at zero_optimization.stage=", z.stage,
          ": stage 3 only");
  }
  const bool bucket_set = z.reduce_bucket_size != dz.reduce_bucket_size;
  if (one && (z.stage > 0 || z.overlap_comm || bucket_set)) {
    n.add(
        "zero_optimization.overlap_comm/contiguous_gradients/reduce_bucket_size: nothing to "
        "communicate at 1 process");
  }
  if (z.offload_param.device != "none") {
    n.add("zero_optimization.offload_param.device=", z.offload_param.device,
          " has no effect: strata does not offload; parameters stay in the device's memory (the "
          "math is the same)");
  }
  if (z.offload_optimizer.device != "none") {
    n.add("zero_optimization.offload_optimizer.device=", z.offload_optimizer.device,
          " has no effect: strata does not offload; optimizer states stay in the device's memory "
          "(the math is the same)");
  }
  for (const auto& [name, o, d] :
       {std::tuple{"zero_optimization.offload_param", &z.offload_param, &dz.offload_param},
        std::tuple{"zero_optimization.offload_optimizer", &z.offload_optimizer,
                   &dz.offload_optimizer}}) {
    const std::string keys = offload_keys_set(name, *o, *d);
    if (!keys.empty()) n.add(keys, has(keys), " no effect: strata does not offload");
  }
  if (z.stage3_gather_16bit_weights_on_model_save) {
    n.add(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save has no effect: a strata "
        "checkpoint holds every tensor whole (fp32 master weights, any layout), and `strata ckpt "
        "export --format hf [--dtype bf16]` writes the consolidated weights");
  }
}

// Communication.
void communication_notices(const Config& c, int world_size, Notes& n) {
  const bool one = world_size == 1;
  if (one && c.communication_data_type) {
    n.add("communication_data_type=", dtype_name(*c.communication_data_type),
          ": nothing is communicated at 1 process");
  }
  if (c.prescale_gradients || c.gradient_predivide_factor != 1.0f) {
    n.add(
        one ? "prescale_gradients/gradient_predivide_factor: no gradients are averaged over ranks "
              "at 1 process"
            : "prescale_gradients/gradient_predivide_factor are not needed: each rank's loss "
              "gradient is already scaled by 1/(tokens of the global batch), so the sum over "
              "ranks is the mean");
  }
}

// Parallelism.
void parallelism_notices(const Config& c, int world_size, Notes& n) {
  const bool one = world_size == 1;
  const ParallelismConfig& p = c.parallelism;
  const ParallelismConfig dp;
  if (p.pipeline == 1 && p.schedule != dp.schedule) {
    n.add("parallelism.schedule=", p.schedule, " has no effect with parallelism.pipeline=1");
  }
  if (p.pipeline == 1 && p.partition != dp.partition) {
    n.add("parallelism.partition=", p.partition, " has no effect with parallelism.pipeline=1");
  }
  if (p.context_impl != dp.context_impl && p.context == 1) {
    n.add("parallelism.context_impl has no effect with parallelism.context=1");
  }
  if (p.sequence_parallel && p.tensor == 1) {
    n.add("parallelism.sequence_parallel has no effect with parallelism.tensor=1");
  }
  if (p.order != dp.order && p.tensor == 1 && p.pipeline == 1 && p.context == 1) {
    n.add("parallelism.order=", p.order,
          " has no effect with parallelism.tensor=1 and parallelism.pipeline=1: every rank is a "
          "data-parallel rank");
  }
  if (one && p.timeout_s != dp.timeout_s) {
    n.add("parallelism.timeout_s: no collectives to watch at 1 process");
  }
}

// Activation checkpointing.
void recompute_notices(const Config& c, Notes& n) {
  const ParallelismConfig& p = c.parallelism;
  const ActivationCheckpointingConfig& a = c.activation_checkpointing;
  const ActivationCheckpointingConfig da;
  const bool method_set = a.recompute_method != da.recompute_method;
  if (a.recompute_granularity == "none") {
    const std::string off =
        keys_set("activation_checkpointing",
                 {{"partition_activations", a.partition_activations},
                  {"cpu_checkpointing", a.cpu_checkpointing},
                  {"contiguous_memory_optimization", a.contiguous_memory_optimization.has_value()},
                  {"number_checkpoints", a.number_checkpoints.has_value()},
                  {"recompute_method", method_set},
                  {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
                  {"profile", a.profile}});
    if (!off.empty()) {
      n.add(off, has(off),
            " no effect: activation_checkpointing.recompute_granularity=none turns checkpointing "
            "off");
    }
  } else if (a.recompute_granularity == "selective") {
    const std::string which = keys_set("activation_checkpointing",
                                       {{"number_checkpoints", a.number_checkpoints.has_value()},
                                        {"recompute_method", method_set}});
    if (!which.empty()) {
      n.add(which, has(which),
            " no effect with activation_checkpointing.recompute_granularity=selective: every block "
            "recomputes its attention core and none is fully recomputed");
    }
    const std::string kept = keys_set(
        "activation_checkpointing",
        {{"partition_activations", a.partition_activations},
         {"cpu_checkpointing", a.cpu_checkpointing},
         {"contiguous_memory_optimization", a.contiguous_memory_optimization.has_value()}});
    if (!kept.empty()) {
      n.add(kept, has(kept),
            " no effect with activation_checkpointing.recompute_granularity=selective: selective "
            "recompute keeps no checkpoints");
    }
  } else if (a.enabled) {
    if (a.partition_activations && p.tensor == 1) {
      n.add(
          "activation_checkpointing.partition_activations has no effect at parallelism.tensor=1: "
          "nothing to shard a checkpoint across (tensor-parallel size 1)");
    } else if (a.partition_activations && p.sequence_parallel) {
      n.add(
          "activation_checkpointing.partition_activations has no effect with "
          "parallelism.sequence_parallel: each rank's checkpoints are already its own block of "
          "rows");
    }
    if (a.contiguous_memory_optimization == false) {
      n.add(
          "activation_checkpointing.contiguous_memory_optimization=false has no effect: strata "
          "always keeps all checkpoints in one preallocated buffer");
    }
    if (method_set && !a.number_checkpoints) {
      n.add("activation_checkpointing.recompute_method=", a.recompute_method,
            " has no effect without activation_checkpointing.number_checkpoints: every block is "
            "fully recomputed");
    }
  }
}

// Precision and optimizer.
void precision_notices(const Config& c, Notes& n) {
  const Bf16Config& b = c.bf16;
  if (b.immediate_grad_update) {
    n.add(
        "bf16.immediate_grad_update has no effect: gradients are applied at the "
        "accumulation boundary");
  }
  if (c.fp16_auto_cast) {
    n.add("fp16.auto_cast has no effect: the model runs in its parameter dtype");
  }
  const std::pair<const char*, bool> master[] = {
      {"bf16.bf16_master_weights_and_grads", b.bf16_master_weights_and_grads},
      {"bf16.bf16_optimizer_states", b.bf16_optimizer_states},
      {"fp16.fp16_master_weights_and_grads", c.fp16_master_weights_and_grads}};
  for (const auto& [name, on] : master) {
    if (on) n.add(name, " has no effect: the optimizer keeps an fp32 master copy");
  }
  if (!b.enabled && !b.check_grad_overflow) {
    n.add("bf16.check_grad_overflow has no effect: bf16.enabled is false");
  }
  const Fp16Config& f = c.fp16;
  const Fp16Config df;
  const std::string scaling = keys_set(
      "fp16", {{"loss_scale", f.loss_scale != df.loss_scale},
               {"initial_scale_power", f.initial_scale_power != df.initial_scale_power},
               {"loss_scale_window", f.loss_scale_window != df.loss_scale_window},
               {"hysteresis", f.hysteresis != df.hysteresis},
               {"consecutive_hysteresis", f.consecutive_hysteresis != df.consecutive_hysteresis},
               {"min_loss_scale", f.min_loss_scale != df.min_loss_scale}});
  if (!f.enabled && !scaling.empty()) {
    n.add(scaling, has(scaling), " no effect: fp16.enabled is false");
  }
  const SchedulerConfig& sc = c.scheduler;
  if (sc.type == "WarmupDecayLR" && sc.total_num_steps < sc.warmup_num_steps) {
    n.add("scheduler.params.total_num_steps=", sc.total_num_steps,
          " is below scheduler.params.warmup_num_steps=", sc.warmup_num_steps,
          ": after the warm-up the learning rate is warmup_min_lr (as in DeepSpeed, which warns)");
  }
  if (c.optimizer_torch_adam) {
    n.add(
        "optimizer.params.torch_adam selects no other implementation: strata's Adam is the same "
        "math as torch.optim's; it only makes AdamW's default weight_decay torch's 0.01");
  }
}

// Elasticity, checkpoints, monitors.
void runtime_notices(const Config& c, Notes& n) {
  const ElasticityConfig& e = c.elasticity;
  const ElasticityConfig de;
  // Enabled, the block sets the batch at the job's world size (apply_elastic_batch).
  const std::string elastic = keys_set(
      "elasticity", {{"max_train_batch_size", e.max_train_batch_size != de.max_train_batch_size},
                     {"micro_batch_sizes", e.micro_batch_sizes != de.micro_batch_sizes},
                     {"min_gpus", e.min_gpus != de.min_gpus},
                     {"max_gpus", e.max_gpus != de.max_gpus},
                     {"version", e.version != de.version},
                     {"ignore_non_elastic_batch_info",
                      e.ignore_non_elastic_batch_info != de.ignore_non_elastic_batch_info},
                     {"prefer_larger_batch", e.prefer_larger_batch != de.prefer_larger_batch},
                     {"num_gpus_per_node", e.num_gpus_per_node != de.num_gpus_per_node},
                     {"model_parallel_size", e.model_parallel_size != de.model_parallel_size}});
  if (!e.enabled && !elastic.empty()) {
    n.add(elastic, has(elastic), " no effect while elasticity.enabled is false");
  }
  if (e.min_time != de.min_time) {
    n.add("elasticity.min_time has no effect (as in DeepSpeed, whose elasticity does not read it)");
  }

  const CheckpointConfig& k = c.checkpoint;
  const CheckpointConfig dk;
  if (k.load_universal) {
    n.add(
        "checkpoint.load_universal has no effect: every strata checkpoint is universal (it "
        "loads into any layout)");
  }
  if (k.tag_validation != dk.tag_validation) {
    n.add("checkpoint.tag_validation=", k.tag_validation,
          " has no effect: checkpoints are named by step, and a load checks the model and every "
          "tensor's shape instead");
  }
  if (k.use_node_local_storage) {
    n.add(
        "checkpoint.use_node_local_storage has no effect: checkpoints go to checkpoint.dir, "
        "which every rank must be able to read");
  }
  if (k.parallel_write_pipeline_stage) {
    n.add(
        "checkpoint.parallel_write.pipeline_stage has no effect: every writing rank already "
        "writes its own file in parallel");
  }

  const WandbConfig dw;
  if (c.wandb.enabled)
    n.add(
        "wandb.enabled has no effect: it needs a network service; metrics go to "
        "train.run_dir, and to TensorBoard event files with tensorboard.enabled");
  const std::string wandb = keys_set("wandb", {{"group", c.wandb.group != dw.group},
                                               {"team", c.wandb.team != dw.team},
                                               {"project", c.wandb.project != dw.project}});
  if (!wandb.empty()) n.add(wandb, has(wandb), " no effect: metrics go to train.run_dir only");
  const CometConfig dc;
  const CometConfig& co = c.comet;
  if (co.enabled) {
    n.add(
        "comet.enabled has no effect: it needs a network service; metrics go to "
        "train.run_dir, and to TensorBoard event files with tensorboard.enabled");
  }
  const std::string comet = keys_set(
      "comet", {{"samples_log_interval", co.samples_log_interval != dc.samples_log_interval},
                {"project", !co.project.empty()},
                {"workspace", !co.workspace.empty()},
                {"api_key", !co.api_key.empty()},
                {"experiment_name", !co.experiment_name.empty()},
                {"experiment_key", !co.experiment_key.empty()},
                {"online", co.online_set},
                {"mode", !co.mode.empty()}});
  if (!comet.empty()) n.add(comet, has(comet), " no effect: metrics go to train.run_dir only");
}

// DeepSpeed's printouts, its data loader, NVMe tuning.
void deepspeed_extras_notices(const Config& c, Notes& n) {
  const DeepSpeedExtrasConfig& x = c.extras;
  // "block.enabled/a/b" for a block's switch (when on) and its other given keys.
  const auto block_keys = [](std::string_view block, bool on, const std::vector<std::string>& k) {
    std::string r = on ? std::string(block) + ".enabled" : "";
    for (const std::string& key : k) r += (r.empty() ? std::string(block) + "." : "/") + key;
    return r;
  };
  const std::string profiler =
      block_keys("flops_profiler", x.flops_profiler, x.flops_profiler_keys);
  if (!profiler.empty()) {
    n.add(profiler, has(profiler),
          x.flops_profiler ? " no effect: no FLOPs profile is printed (DeepSpeed's profiler only "
                             "prints one at profile_step); strata's metrics report each step's "
                             "achieved FLOP/s"
                           : " no effect: flops_profiler.enabled is false");
  }
  const std::string comms = block_keys("comms_logger", x.comms_logger, x.comms_logger_keys);
  if (!comms.empty()) {
    n.add(comms, has(comms),
          x.comms_logger ? " no effect: no communication log is printed (DeepSpeed's comms_logger "
                           "only logs each collective's size and time)"
                         : " no effect: comms_logger.enabled is false");
  }
  const std::string autocast =
      block_keys("torch_autocast", x.torch_autocast, x.torch_autocast_keys);
  if (!autocast.empty()) {
    if (x.torch_autocast) {
      n.add(autocast, has(autocast), " no effect: the model already runs in ",
            dtype_name(c.param_dtype()), ", its parameter dtype");
    } else {
      n.add(autocast, has(autocast), " no effect: torch_autocast.enabled is false");
    }
  }
  const std::string aio = block_keys("aio", false, x.aio_keys);
  if (!aio.empty()) {
    n.add(aio, has(aio), " no effect: it tunes DeepSpeed's NVMe swapping, and nothing is swapped");
  }
  const std::string efficiency =
      block_keys("data_efficiency", x.data_efficiency, x.data_efficiency_keys);
  if (!efficiency.empty()) {  // an enabled feature is refused by the parser
    n.add(efficiency, has(efficiency),
          " no effect: none of data_efficiency's features (data_sampling, curriculum_learning, "
          "data_routing, random_ltd) is enabled");
  }
  if (x.dataloader_drop_last) {
    n.add(
        "dataloader_drop_last has no effect: it configures DeepSpeed's own data loader; strata's "
        "sampler always reads whole micro-batches");
  }
  if (!x.zero_force_ds_cpu_optimizer) {
    n.add(
        "zero_force_ds_cpu_optimizer=false has no effect: it lets DeepSpeed offload with a "
        "client optimizer, and strata has no client optimizer (its own Adam/AdamW/SGD runs)");
  }
  if (x.elastic_checkpoint) {
    n.add(
        "zero_optimization.elastic_checkpoint has no effect: every strata checkpoint loads into "
        "any layout already");
  }
  if (x.communication_data_type_bfp16) {
    n.add(
        "communication_data_type \"bfp16\" is read as \"bf16\": it is older DeepSpeed's "
        "spelling, which DeepSpeed 0.19 refuses (\"Invalid communication_data_type\"); write "
        "\"bf16\" for both");
  }
  if (x.cpu_offload_use_pin_memory) {
    n.add(
        "zero_optimization.cpu_offload_use_pin_memory has no effect: it is deprecated in "
        "DeepSpeed, which reads offload_param/offload_optimizer.pin_memory instead");
  }
}

}  // namespace

std::vector<std::string> config_notices(const Config& c, int world_size) {
  Notes n;
  zero_notices(c, world_size, n);
  communication_notices(c, world_size, n);
  parallelism_notices(c, world_size, n);
  recompute_notices(c, n);
  precision_notices(c, n);
  runtime_notices(c, n);
  deepspeed_extras_notices(c, n);
  return n.lines;
}

}  // namespace strata
