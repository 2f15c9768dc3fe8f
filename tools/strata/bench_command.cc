// strata bench: the flags, then one call (train/bench.h, or planner/calibrate.h).
#include <memory>
#include <optional>
#include <string>

#include "strata/config/config.h"
#include "strata/cost/device_profile.h"
#include "strata/planner/calibrate.h"
#include "strata/train/bench.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct BenchArgs : BenchOptions {
  bool calibrate = false;  // measure the machine into a device profile instead
  std::string output;      // the profile's path (--calibrate)
};

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time training steps of a model preset on random tokens (median of --steps)");
  CLI::Option* model =
      cmd->add_option("--model", args->model, "model preset")->capture_default_str();
  cmd->add_option("--dtype", args->dtypes, "fp32, bf16 and/or fp16")->capture_default_str();
  cmd->add_option("--micro-batch,-b", args->micro_batch, "micro-batch size")->capture_default_str();
  cmd->add_option("--seq-len,-t", args->seq_len, "sequence length (default: the preset's)");
  cmd->add_option("--layers", args->layers, "Transformer blocks (default: the preset's)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--device", args->device, "cpu or cuda: where each rank computes (train.device)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--config", args->config,
                  "take the model, batch and layout from this config file (strata plan "
                  "--emit-config writes one); bench's model and layout options are then unused");
  cmd->add_option("--report", args->report,
                  "write the median step time and each memory category's peak (of the rank with "
                  "the most) to this JSON file");
  cmd->add_option("--set", args->overrides,
                  "override a config key: --set a.b.c=value (repeatable), e.g. "
                  "--set activation_checkpointing.number_checkpoints=4");
  cmd->add_option("--steps", args->steps, "timed steps")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--overlap", args->overlap, "data parallel: overlap_comm on|off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--bucket", args->bucket, "data parallel: reduce_bucket_size (elements)")
      ->capture_default_str();
  cmd->add_option("--tensor", args->tensor, "tensor-parallel size (dp = ranks / tensor)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--pipeline", args->pipeline, "pipeline stages (dp = ranks / tensor / pipeline)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--schedule", args->schedule, "gpipe | 1f1b | interleaved | zero_bubble")
      ->capture_default_str();
  cmd->add_option("--micro", args->micro, "micro-batches per step (gradient accumulation)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--partition", args->partition, "pipeline partition: uniform | parameters | time")
      ->capture_default_str();
  cmd->add_option("--virtual", args->virtual_stages, "virtual stages (interleaved)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--context", args->context,
                  "context-parallel size: each sequence split over this many ranks (dp = ranks / "
                  "tensor / pipeline / context)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--context-impl", args->context_impl, "context parallelism: ulysses | ring")
      ->check(CLI::IsMember({"ulysses", "ring"}))
      ->capture_default_str();
  cmd->add_flag("--sequence-parallel", args->sequence_parallel,
                "with --tensor > 1: split activations outside the tensor-parallel regions");
  cmd->add_flag("--calibrate", args->calibrate,
                "measure this machine (GEMM peak and efficiency, the block's other kernels and "
                "attention at --config's or --model's shapes, memory bandwidth, links) into the "
                "device profile strata plan --device cpu reads, instead of timing steps");
  args->output = cost::default_calibration_path();
  cmd->add_option("--output", args->output, "with --calibrate: the profile's path")
      ->capture_default_str();
  cmd->callback([args, model] {
    if (args->calibrate) {
      // The shapes the calibration times: a --config's model, a --model preset's, or none.
      std::optional<ModelConfig> shapes;
      if (!args->config.empty()) {
        shapes = load_config(args->config, args->overrides).model;
      } else if (model->count() > 0) {
        shapes = parse_config(
                     {{"train_micro_batch_size_per_gpu", 1}, {"model", {{"preset", args->model}}}})
                     .model;
      }
      planner::run_calibrate(args->output, shapes, args->device);
    } else {
      run_bench(*args);
    }
  });
}

}  // namespace strata::cli
