// parse_config / load_config (the order in which blocks are read), the batch triangle, and the
// notices for settings that are parsed but not in effect in this release.
#include "strata/train/config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "strata/core/check.h"
#include "strata/train/config_internal.h"

namespace strata {

Config parse_config(const nlohmann::json& j, const std::vector<std::string>& overrides) {
  using namespace config_detail;
  if (!j.is_object() && !j.is_null()) {
    STRATA_INPUT_FAIL("the config must be a JSON object, got ", show(j));
  }
  json root = j.is_null() ? json::object() : j;
  for (const std::string& o : overrides) apply_override(root, o);
  Block top(&root, "", keys_of(""));
  top.nullable({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "steps_per_print", "communication_data_type", "optimizer", "scheduler"});
  Config c;
  parse_batch_and_top(top, c);
  parse_precision(top, c);
  parse_optimizer(top, c);
  parse_scheduler(top, c);
  parse_zero(top, c);
  parse_runtime_blocks(top, c);
  parse_model(top, c);
  parse_layout_blocks(top, c);
  check_cross_block(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) STRATA_INPUT_FAIL("cannot read the config file ", path, ": ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(parse_json_strict(text.str(), path), overrides);
}

void resolve_batch(Config& c, int dp) {
  STRATA_INPUT_CHECK(dp >= 1, "the data-parallel size must be >= 1, got ", dp,
                     " (world size / (parallelism.tensor x parallelism.pipeline))");
  const int64_t tb_in = c.given_train_batch_size, mb_in = c.given_micro_batch,
                gas_in = c.given_grad_accum;
  int64_t tb = tb_in, mb = mb_in, gas = gas_in;
  // DeepSpeed's _set_batch_related_parameters, floor division included; all three given: as is.
  if (tb > 0 && mb > 0 && gas > 0) {
    // nothing to derive
  } else if (tb > 0 && mb > 0) {
    gas = tb / mb / dp;
  } else if (tb > 0 && gas > 0) {
    mb = tb / dp / gas;
  } else if (mb > 0 && gas > 0) {
    tb = mb * gas * dp;
  } else if (tb > 0) {
    gas = 1;
    mb = tb / dp;
  } else if (mb > 0) {
    gas = 1;
    tb = mb * dp;
  } else {
    STRATA_INPUT_FAIL(
        "either train_batch_size or train_micro_batch_size_per_gpu must be given "
        "(as in DeepSpeed), e.g. \"train_micro_batch_size_per_gpu\": 1");
  }
  int64_t product = 0;
  const bool overflow = __builtin_mul_overflow(mb, gas, &product) ||
                        __builtin_mul_overflow(product, int64_t(dp), &product);
  if (tb > 0 && mb > 0 && gas > 0 && !overflow && tb == product) {
    c.train_batch_size = tb, c.train_micro_batch_size_per_gpu = mb;
    c.gradient_accumulation_steps = gas;
    return;
  }
  // Consistent triples close to what was given: keep the given micro batch and accumulation
  // (the batch follows), or keep the given train_batch_size (the micro batch follows).
  const int64_t mb1 =
      mb_in > 0 ? mb_in : std::max<int64_t>(1, tb_in / dp / std::max<int64_t>(1, gas_in));
  const int64_t gas1 = gas_in > 0 ? gas_in : std::max<int64_t>(1, tb_in / mb1 / dp);
  std::string choice = "train_batch_size=" + std::to_string(mb1 * gas1 * dp) +
                       ", train_micro_batch_size_per_gpu=" + std::to_string(mb1) +
                       ", gradient_accumulation_steps=" + std::to_string(gas1);
  if (tb_in > 0 && tb_in % dp == 0 && tb_in != mb1 * gas1 * dp) {
    const int64_t gas2 = gas_in > 0 && (tb_in / dp) % gas_in == 0 ? gas_in : 1;
    choice += "; or keep train_batch_size=" + std::to_string(tb_in) +
              " with train_micro_batch_size_per_gpu=" + std::to_string(tb_in / dp / gas2) +
              ", gradient_accumulation_steps=" + std::to_string(gas2);
  }
  const auto shown = [](int64_t v, int64_t given) {
    return std::to_string(v) + (given > 0 ? "" : " (derived)");
  };
  STRATA_INPUT_FAIL("inconsistent batch for data-parallel size ", dp,
                    ": train_batch_size=", shown(tb, tb_in),
                    ", train_micro_batch_size_per_gpu=", shown(mb, mb_in),
                    ", gradient_accumulation_steps=", shown(gas, gas_in),
                    "; DeepSpeed needs all three > 0 and train_batch_size = micro batch x "
                    "accumulation x data-parallel size. Consistent: ",
                    choice);
}

std::vector<std::string> config_notices(const Config& c, int world_size) {
  std::vector<std::string> out;
  const auto add = [&](auto&&... parts) { out.push_back(detail::concat(parts...)); };
  const bool one = world_size == 1;

  const ZeroConfig& z = c.zero;
  if (z.stage > 0) {
    if (one) {
      add("zero_optimization.stage=", z.stage,
          " is honoured trivially at 1 process: partitioning over one rank changes nothing");
    }
  }
  if (z.mics_shard_size > 0 && z.stage == 0) {
    add("zero_optimization.mics_shard_size=", z.mics_shard_size,
        " has no effect at stage 0: nothing is sharded");
  }
  if (z.mics_shard_size > 0 && (z.stage == 1 || z.stage == 2) && !one) {
    add("zero_optimization.mics_shard_size=", z.mics_shard_size, " at stage ", z.stage,
        ": strata shards the stage-", z.stage, " states within groups of ", z.mics_shard_size,
        " ranks and replicates them across groups (DeepSpeed applies MiCS at stage 3 only)");
  }
  if (z.stage >= 1 && !one) {
    add("zero_optimization.reduce_bucket_size/allgather_bucket_size: at stage ", z.stage,
        " each unit (embedding, block, head) is one reduce-scatter and one all-gather; the "
        "bucket sizes apply at stage 0");
  }
  const ZeroConfig dz;
  if (z.sub_group_size != dz.sub_group_size || z.round_robin_gradients || !z.reduce_scatter ||
      z.stage3_model_persistence_threshold != dz.stage3_model_persistence_threshold ||
      z.mics_hierarchical_params_gather) {
    add("zero_optimization.sub_group_size/round_robin_gradients/reduce_scatter/"
        "stage3_model_persistence_threshold/mics_hierarchical_params_gather have no effect in "
        "strata: the optimizer steps the whole partition at once, gradients are always "
        "reduce-scattered and stage-3 gathers stay inside a shard group");
  }
  if (one && (z.stage > 0 || z.overlap_comm)) {
    add("zero_optimization.overlap_comm/contiguous_gradients/reduce_bucket_size: nothing to "
        "communicate at 1 process");
  }
  if (z.offload_param.device != "none") {
    add("zero_optimization.offload_param.device=", z.offload_param.device,
        " is not yet in effect: parameters stay in memory");
  }
  if (z.offload_optimizer.device != "none") {
    add("zero_optimization.offload_optimizer.device=", z.offload_optimizer.device,
        " is not yet in effect: optimizer states stay in memory");
  }
  if (z.stage3_gather_16bit_weights_on_model_save) {
    add("zero_optimization.stage3_gather_16bit_weights_on_model_save is not yet in effect: no "
        "checkpoints are written");
  }
  if (one && c.communication_data_type) {
    add("communication_data_type=", dtype_name(*c.communication_data_type),
        ": nothing is communicated at 1 process");
  }
  if (c.prescale_gradients || c.gradient_predivide_factor != 1.0f) {
    add(one ? "prescale_gradients/gradient_predivide_factor: no gradients are averaged over ranks "
              "at 1 process"
            : "prescale_gradients/gradient_predivide_factor are not needed: each rank's loss "
              "gradient is already scaled by 1/(tokens of the global batch), so the sum over "
              "ranks is the mean");
  }

  const ParallelismConfig& p = c.parallelism;
  if (p.tensor > 1) {
    add("parallelism.tensor=", p.tensor,
        " is not yet in effect: every process holds and runs whole layers");
  }
  if (p.pipeline > 1) {
    add("parallelism.pipeline=", p.pipeline, " (schedule ", p.schedule,
        ") is not yet in effect: one stage runs every layer");
  }
  if (p.virtual_stages > 1) {
    add("parallelism.virtual_stages=", p.virtual_stages, " is not yet in effect");
  }
  if (p.sequence_parallel) {
    add("parallelism.sequence_parallel",
        p.tensor == 1 ? " has no effect with parallelism.tensor=1" : " is not yet in effect");
  }

  const ActivationCheckpointingConfig& a = c.activation_checkpointing;
  std::string flags;
  const std::pair<const char*, bool> ac[] = {
      {"partition_activations", a.partition_activations},
      {"cpu_checkpointing", a.cpu_checkpointing},
      {"contiguous_memory_optimization", a.contiguous_memory_optimization},
      {"number_checkpoints", a.number_checkpoints.has_value()},
      {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
      {"profile", a.profile}};
  for (const auto& [name, on] : ac) {
    if (on) flags += (flags.empty() ? "activation_checkpointing." : ", ") + std::string(name);
  }
  if (!flags.empty()) add(flags, ": not yet in effect: activations are kept");

  const Bf16Config& b = c.bf16;
  const std::pair<const char*, bool> precision[] = {
      {"bf16.immediate_grad_update", b.immediate_grad_update},
      {"bf16.bf16_master_weights_and_grads", b.bf16_master_weights_and_grads},
      {"bf16.bf16_optimizer_states", b.bf16_optimizer_states},
      {"fp16.auto_cast", c.fp16_auto_cast},
      {"fp16.fp16_master_weights_and_grads", c.fp16_master_weights_and_grads}};
  for (const auto& [name, on] : precision) {
    if (on) add(name, " is not yet in effect: the optimizer keeps an fp32 master copy");
  }

  if (c.elasticity.enabled) {
    add("elasticity.enabled is not yet in effect: the batch comes from train_batch_size, "
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps");
  }
  const CheckpointConfig& k = c.checkpoint;
  if (!k.dir.empty())
    add("checkpoint.dir=", k.dir, " is not yet in effect: no checkpoints are saved");
  if (k.load_universal) add("checkpoint.load_universal is not yet in effect: nothing is loaded");
  if (c.tensorboard.enabled) {
    add("tensorboard.enabled is not yet in effect: metrics go to train.run_dir only");
  }
  if (c.csv_monitor.enabled) {
    add("csv_monitor.enabled is not yet in effect: metrics go to train.run_dir only");
  }
  if (c.wandb.enabled) add("wandb.enabled is not yet in effect: metrics go to train.run_dir only");
  return out;
}

}  // namespace strata
