// strata bench: step time of a model on synthetic tokens, in the units the peers report.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/train/config.h"
#include "strata/train/engine.h"
#include "strata/train/metrics.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

// Uniform random tokens, generated on demand: a dataset of any size without files.
class RandomTokens final : public data::TokenDataset {
 public:
  RandomTokens(int64_t n, int vocab) : n_(n), vocab_(vocab), key_(rng_key(0, "bench.tokens")) {}
  int64_t num_tokens() const override { return n_; }
  void read(int64_t begin, int64_t count, int32_t* out) const override {
    for (int64_t i = 0; i < count; ++i) {
      out[i] = int32_t(rng_uniform(key_, uint64_t(begin + i)) * float(vocab_)) % vocab_;
    }
  }
  int64_t vocab_bound() const override { return vocab_; }
  const std::string& source() const override { return name_; }

 private:
  int64_t n_;
  int vocab_;
  uint64_t key_;
  std::string name_ = "random tokens";
};

struct BenchArgs {
  std::string model = "bench-23M";
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  int64_t micro_batch = 8;
  int seq_len = 0;  // 0: the preset's
  int steps = 5;
  int warmup = 1;
  // Data parallelism, when launched on several ranks (strata launch -n N -- bench ...).
  std::string overlap = "on";
  int64_t bucket = 500000000;  // reduce_bucket_size, elements
  // Tensor parallelism over groups of this many ranks (dp = ranks / tensor).
  int tensor = 1;
  bool sequence_parallel = false;
};

void run_bench(const BenchArgs& a) {
  const int world = comm::initialized() ? comm::world_size() : 1;
  const bool rank0 = world == 1 || comm::world_rank() == 0;
  const comm::RankGrid grid(world, a.tensor, 1);
  std::unique_ptr<comm::ProcessGroups> groups;
  if (world > 1) groups = std::make_unique<comm::ProcessGroups>(grid, MPI_COMM_WORLD);
  const MachinePeak machine = measure_machine_peak(world > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL);
  if (rank0) {
    std::printf("cpu: %s\nMFU against the machine's %s\n", kernels::describe_cpu().c_str(),
                machine.describe().c_str());
  }
  for (const std::string& dt : a.dtypes) {
    DType dtype = parse_dtype(dt, "--dtype");
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", a.micro_batch},
                        {"gradient_accumulation_steps", 1},
                        {"gradient_clipping", 1.0},
                        {"steps_per_print", 0},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                        {"model", {{"preset", a.model}}},
                        {"zero_optimization",
                         {{"overlap_comm", a.overlap == "on"}, {"reduce_bucket_size", a.bucket}}}};
    if (a.seq_len > 0) j["model"]["seq_len"] = a.seq_len;
    j["parallelism"] = {{"tensor", a.tensor}, {"sequence_parallel", a.sequence_parallel}};
    if (dtype == DType::BF16) j["bf16"] = {{"enabled", true}};
    if (dtype == DType::F16) j["fp16"] = {{"enabled", true}};
    Config cfg = parse_config(j);
    resolve_batch(cfg, grid.dp());
    RandomTokens tokens(int64_t(1) << 30, cfg.model.vocab);
    Engine engine(cfg, &tokens, groups ? &groups->dp() : nullptr, groups ? &groups->tp() : nullptr);
    const double peak = machine.gflops();
    for (int i = 0; i < a.warmup; ++i) engine.train_batch();
    std::vector<StepMetrics> runs;
    for (int i = 0; i < a.steps; ++i) runs.push_back(engine.train_batch());
    if (!rank0) continue;
    std::sort(runs.begin(), runs.end(),
              [](const StepMetrics& x, const StepMetrics& y) { return x.seconds < y.seconds; });
    const StepMetrics& med = runs[runs.size() / 2];
    size_t mem = 0;
    for (size_t v : med.peak_bytes) mem += v;
    std::printf(
        "bench model=%s dtype=%s params=%lld B=%lld T=%d threads=%d | step_s=%.3f "
        "tokens_per_s=%.0f achieved_gflops=%.1f peak_gflops=%.1f mfu=%.1f%% peak_mem=%s "
        "loss=%.3f ranks=%d comm_exposed_s=%.3f\n",
        a.model.c_str(), dtype_name(dtype),
        static_cast<long long>(engine.spec().global_param_numel),
        static_cast<long long>(a.micro_batch), cfg.model.seq_len, omp_get_max_threads(),
        med.seconds, med.tokens_per_s, med.flops / med.seconds / 1e9, peak,
        100.0 * med.flops / med.seconds / 1e9 / peak, format_bytes(mem).c_str(), med.loss, world,
        med.comm_exposed_s);
    if (a.tensor > 1) {
      // Tensor parallelism: every collective blocks, so all of its time is exposed. Per block
      // the formula moves 8·f·X·b bytes (10 with sequence parallelism), f = (tp-1)/tp,
      // X = B·T·hidden elements of b bytes; the step adds the embedding, head and loss.
      const double layers = double(cfg.model.layers);
      const double X = double(a.micro_batch) * cfg.model.seq_len * cfg.model.hidden;
      const double per_block = (a.sequence_parallel ? 10.0 : 8.0) * (a.tensor - 1) / a.tensor * X *
                               double(dtype_size(dtype));
      std::printf(
          "bench tp=%d sp=%d | tp_comm_s=%.4f (%.2f ms per block, embedding and head included) "
          "tp_bytes=%llu predicted=%llu (per block %.0f KiB, %.1f%% of the step's) "
          "activations=%s\n",
          a.tensor, int(a.sequence_parallel), med.tp_comm_s, 1e3 * med.tp_comm_s / layers,
          static_cast<unsigned long long>(med.tp_bytes),
          static_cast<unsigned long long>(predict_tp_bytes(cfg, engine.spec())), per_block / 1024.0,
          100.0 * per_block * layers / double(med.tp_bytes),
          format_bytes(med.peak_bytes[size_t(MemCategory::Activations)]).c_str());
    } else {
      std::printf("bench activations=%s\n",
                  format_bytes(med.peak_bytes[size_t(MemCategory::Activations)]).c_str());
    }
    std::fflush(stdout);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time training steps of a model preset on random tokens (median of --steps)");
  cmd->add_option("--model", args->model, "model preset")->capture_default_str();
  cmd->add_option("--dtype", args->dtypes, "fp32, bf16 and/or fp16")->capture_default_str();
  cmd->add_option("--micro-batch,-b", args->micro_batch, "micro-batch size")->capture_default_str();
  cmd->add_option("--seq-len,-t", args->seq_len, "sequence length (default: the preset's)");
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
  cmd->add_flag("--sequence-parallel", args->sequence_parallel,
                "with --tensor > 1: split activations outside the tensor-parallel regions");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace strata::cli
