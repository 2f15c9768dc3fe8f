// parse_config / load_config (the order in which blocks are read) and the batch triangle.
#include "strata/config/config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "strata/config/internal.h"
#include "strata/core/check.h"

namespace strata {

Config parse_config(const nlohmann::json& j, const std::vector<std::string>& overrides) {
  using namespace config_detail;
  check_json_depth(j, "the config");  // before anything copies or prints the tree
  if (!j.is_object() && !j.is_null()) {
    STRATA_INPUT_FAIL("the config must be a JSON object, got ", show(j));
  }
  json root = j.is_null() ? json::object() : j;
  for (const std::string& o : overrides) apply_override(root, o);
  if (!overrides.empty()) check_json_depth(root, "the config with its --set overrides");
  // Every block is read, and every bad key or value listed, before the one InputError is thrown.
  ConfigErrors errors;
  Block top(&root, "", keys_of(""), false, &errors);
  top.nullable({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "steps_per_print", "communication_data_type", "optimizer", "scheduler"});
  Config c;
  for (void (*parse)(const Block&, Config&) :
       {parse_batch_and_top, parse_precision, parse_optimizer, parse_scheduler, parse_zero,
        parse_deepspeed_extras, parse_runtime_blocks, parse_model, parse_layout_blocks}) {
    errors.collect([&] { parse(top, c); });
  }
  // An enabled elasticity block sets the batch itself (apply_elastic_batch).
  // A batch key given with a bad value is already listed.
  if (c.given_train_batch_size == 0 && c.given_micro_batch == 0 && !c.elasticity.enabled &&
      !top.has("train_batch_size") && !top.has("train_micro_batch_size_per_gpu")) {
    errors.add(
        "either train_batch_size or train_micro_batch_size_per_gpu must be given (as in "
        "DeepSpeed; gradient_accumulation_steps alone does not fix the batch), e.g. "
        "\"train_micro_batch_size_per_gpu\": 1");
  }
  if (!errors.empty()) errors.raise();
  check_cross_block(c);
  return c;
}

nlohmann::json apply_overrides(nlohmann::json j, const std::vector<std::string>& overrides) {
  if (j.is_null()) j = nlohmann::json::object();
  for (const std::string& o : overrides) config_detail::apply_override(j, o);
  return j;
}

nlohmann::json read_config_json(const std::string& path) {
  std::error_code ec;
  STRATA_INPUT_CHECK(!std::filesystem::is_directory(path, ec), "the config file ", path,
                     " is a directory; give the path of a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    STRATA_INPUT_FAIL("cannot read the config file ", path, ": ", std::strerror(errno),
                      "; check the path and its permissions");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    STRATA_INPUT_FAIL("cannot read the config file ", path, ": ", std::strerror(errno));
  }
  return parse_json_strict(text.str(), path);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_config(read_config_json(path), overrides);
}

void check_expert_grid(const Config& c, int dp_cp) {
  const int ep = c.parallelism.expert;
  const bool whole = c.parallelism.whole_experts() && c.model.moe.experts > 0;
  if (ep <= 1 && !whole) return;
  const int ranks = c.parallelism.expert_ranks(dp_cp);
  STRATA_INPUT_CHECK(ranks % ep == 0, "parallelism.expert=", ep,
                     whole ? " must divide the tensor x data x context-parallel ranks of a stage ("
                           : " must divide the data x context-parallel ranks of a stage (",
                     ranks,
                     whole ? " here: world / pipeline)" : " here: world / (tensor x pipeline))",
                     "; the experts are placed over a group of them. Choose a divisor of ", ranks,
                     " or launch more ranks");
  STRATA_INPUT_CHECK(c.zero.mics_shard_size < 0 || c.zero.mics_shard_size == dp_cp,
                     "zero_optimization.mics_shard_size with ",
                     ep > 1 ? "parallelism.expert=" + std::to_string(ep)
                            : std::string("parallelism.expert_tensor=1"),
                     " is not built: remove one of them");
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
    config_detail::check_tensor_split(c, mb);  // sequence parallelism splits mb's token rows
    const ParallelismConfig& p = c.parallelism;
    STRATA_INPUT_CHECK(p.pipeline == 1 || p.schedule != "interleaved" || gas % p.pipeline == 0,
                       "parallelism.schedule \"interleaved\" runs the micro-batches in groups of "
                       "parallelism.pipeline=",
                       p.pipeline, ": gradient_accumulation_steps=", gas,
                       " (micro-batches per step) must be a multiple of it; change "
                       "gradient_accumulation_steps (or train_batch_size) or the schedule");
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

ZeroOptions zero_options(const Config& c) {
  const ZeroConfig& z = c.zero;
  ZeroOptions o;
  o.stage = z.stage;
  o.param_dtype = c.param_dtype(), o.grad_dtype = c.grad_dtype(), o.wire = c.comm_dtype();
  o.overlap = z.overlap_comm;
  o.bucket_elems = z.reduce_bucket_size;
  o.prefetch_elems = z.stage3_prefetch_bucket_size;
  o.persistence_threshold = z.stage3_param_persistence_threshold;
  o.max_live = z.stage3_max_live_parameters;
  o.max_reuse_distance = z.stage3_max_reuse_distance;
  o.reshard_after_forward = z.stage3_reshard_after_forward;
  o.recompute_full = recompute_options(c).full;
  return o;
}

}  // namespace strata
