#include "strata/train/run_record.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "strata/core/atomic_file.h"
#include "strata/data/sampler.h"

namespace strata {

std::string list_files(const std::vector<std::string>& files) {
  std::string out;
  const size_t n = files.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 6 && i == 3) {
      out += ", ...";
      i = n - 3;
      continue;
    }
    out += (i == 0 ? "" : ", ") + files[i];
  }
  if (n > 6) out += " (" + std::to_string(n) + " files)";
  return out;
}

void print_data(const data::DataSplits& d, const Config& cfg, const Engine& engine) {
  std::printf("data: train on %s\n", list_files(d.train_files).c_str());
  const data::Sampler& s = *engine.sampler();
  const int64_t n = s.num_windows(), T = s.seq_len();
  int64_t trained = 0;
  for (int64_t w = 0; w < n; ++w) trained += s.window_trained(w);
  if (s.options().pack) {
    std::printf(
        "data: packed %lld documents (pieces) first-fit into %lld windows of %lld: "
        "packing efficiency %.1f%%\n",
        static_cast<long long>(s.packed_pieces()), static_cast<long long>(n),
        static_cast<long long>(T), 100.0 * s.packing_efficiency());
  }
  if (trained != n * T) {
    std::printf("data: %lld of the windows' %lld targets are trained (%.1f%%)%s\n",
                static_cast<long long>(trained), static_cast<long long>(n * T),
                100.0 * double(trained) / double(n * T),
                d.train->has_loss_mask() ? ", as the loss mask says" : "");
  }
  if (cfg.data.document_mask) {
    std::printf(
        "data: document masking: documents in a window do not see each other, positions "
        "restart at each\n");
  }
  if (!d.ignored_files.empty()) {
    std::printf("data: ignored (named neither train nor val): %s\n",
                list_files(d.ignored_files).c_str());
  }
  if (!d.val) {
    std::printf("data: no validation data (no val split beside data.path; set data.val_path)\n");
    return;
  }
  std::printf("data: validate on %s (%s)\n", list_files(d.val_files).c_str(), d.val_origin.c_str());
  const TrainConfig& t = cfg.train;
  if (t.eval_iters == 0) {
    std::printf("note: train.eval_iters=0: no validation\n");
    return;
  }
  const int64_t windows = engine.val_windows(), used = t.eval_iters * cfg.train_batch_size;
  std::printf("validation: %lld batches of %lld sequences (its first windows in order) ",
              static_cast<long long>(t.eval_iters), static_cast<long long>(cfg.train_batch_size));
  if (t.eval_interval > 0) {
    std::printf("every %lld steps and at the last\n", static_cast<long long>(t.eval_interval));
  } else {
    std::printf("at the last step\n");
  }
  if (used > windows) {
    std::printf(
        "note: the validation data holds %lld windows of seq_len+1 tokens, fewer than "
        "train.eval_iters x train_batch_size = %lld: windows repeat; lower "
        "train.eval_iters to %lld for each once\n",
        static_cast<long long>(windows), static_cast<long long>(used),
        static_cast<long long>(std::max<int64_t>(1, windows / cfg.train_batch_size)));
  }
}

void write_run_json(const RunRecord& r) {
  const Config& c = r.cfg;
  const ActivationCheckpointingConfig& ac = c.activation_checkpointing;
  std::string recompute = ac.enabled ? ac.recompute_granularity : "none";
  if (recompute == "full" && ac.number_checkpoints) {
    recompute += " (" + std::to_string(*ac.number_checkpoints) + " of " +
                 std::to_string(c.model.layers) + " blocks, " + ac.recompute_method + ")";
  }
  if (recompute != "none" && ac.cpu_checkpointing) recompute += ", checkpoints in host memory";
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json j;
  j["strata_version"] = r.version;
  j["command"] = r.command_line;
  j["started"] = r.started;
  j["host"] = host;
  if (!r.resumed.is_null()) j["resumed"] = r.resumed;
  j["config_file"] = r.config_path;
  j["config_origin"] =
      "The config file " + r.config_path +
      " with the command line's overrides applied (--set, --steps, --run-dir, --data, --device, "
      "and a checkpoint's model where the file has none), as given: keys it leaves out take "
      "their defaults (\"layout\" and \"model\" hold what was resolved from it).";
  j["config"] = r.config;
  j["steps"] = c.train.steps;
  j["layout"] = {{"world_size", r.grid.world()},
                 {"dp", r.grid.dp()},
                 {"tp", r.grid.tp()},
                 {"pp", r.grid.pp()},
                 {"virtual_stages", c.parallelism.virtual_stages},
                 {"schedule", c.parallelism.schedule},
                 {"order", c.parallelism.order},
                 {"zero_stage", c.zero.stage},
                 {"mics_shard_size", c.zero.mics_shard_size},
                 {"train_batch_size", c.train_batch_size},
                 {"micro_batch", c.train_micro_batch_size_per_gpu},
                 {"gradient_accumulation", c.gradient_accumulation_steps},
                 {"sequence_parallel", c.parallelism.sequence_parallel},
                 {"recompute", recompute},
                 {"device", c.train.device}};
  const ModelConfig& m = c.model;
  j["model"] = {{"name", m.preset.empty() ? m.family : m.preset},
                {"family", m.family},
                {"parameters", r.engine.spec().global_param_numel},
                {"layers", m.layers},
                {"hidden", m.hidden},
                {"heads", m.heads},
                {"kv_heads", m.kv_heads},
                {"ffn_hidden", m.ffn_hidden},
                {"vocab", m.vocab},
                {"seq_len", m.seq_len},
                {"dtype", dtype_name(c.param_dtype())}};
  j["data"] = r.data;
  j["cpu"] = r.cpu;
  j["peak"] = r.peak;
  j["model_line"] = r.model_line;  // as train printed it
  if (!r.rank_names.empty()) j["ranks"] = r.rank_names;
  const std::string path = (std::filesystem::path(c.train.run_dir) / "run.json").string();
  atomic_write(path, j.dump(2) + "\n", IoError::input);
}

}  // namespace strata
