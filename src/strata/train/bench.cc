#include "strata/train/bench.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/cost/predict.h"
#include "strata/data/token_dataset.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/monitor/metrics.h"
#include "strata/pipeline/schedule.h"
#include "strata/pipeline/schedule_check.h"
#include "strata/train/engine.h"
#include "strata/train/run.h"

namespace strata {

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

// The pipeline bubble of the last step, measured: 1 - (compute time of every rank's forward and
// backward actions) / (ranks × the step's span, first action to last over all ranks); and the
// checker's figure
// for the same schedule with the measured mean forward, input- and weight-gradient times, each
// stage's scaled so that its simulated compute equals its measured compute (stages differ: the
// embedding on the first, the logits on the last).
struct Bubble {
  double measured = 0, predicted = 0;
};
Bubble pipeline_bubble(const Engine& engine, const Config& cfg) {
  using pipeline::Op;
  double f = 0, b = 0, w = 0, busy = 0, first = 1e300, last = 0;
  int nf = 0, nb = 0, nw = 0;
  for (const Engine::ActionSpan& e : engine.last_trace()) {
    const double d = e.end_s - e.start_s;
    first = std::min(first, e.start_s), last = std::max(last, e.end_s);
    if (e.action.op == Op::Forward) f += d, ++nf, busy += d;
    if (e.action.op == Op::Backward || e.action.op == Op::BackwardInput) b += d, ++nb, busy += d;
    if (e.action.op == Op::BackwardWeight) w += d, ++nw, busy += d;
  }
  // Over the world: busy time, per-kind totals and counts; the longest span.
  double v[7] = {busy, f, b, w, double(nf), double(nb), double(nw)};
  MPI_Allreduce(MPI_IN_PLACE, v, 7, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  // The step's span over every rank (one host: one steady clock).
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &last, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double span = last - first;
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Bubble r;
  r.measured = 1.0 - v[0] / (double(ranks) * span);
  const ParallelismConfig& p = cfg.parallelism;
  pipeline::ScheduleSpec s{pipeline::parse_schedule(p.schedule), p.pipeline,
                           int(cfg.gradient_accumulation_steps), p.virtual_stages};
  pipeline::Costs c;
  c.forward = v[1] / std::max(1.0, v[4]);
  c.backward_input = v[2] / std::max(1.0, v[5]);
  c.backward_weight = v[6] > 0 ? v[3] / v[6] : 0.0;  // a fused Backward's time is all in B
  // Per stage: measured compute over what the mean costs give it.
  std::vector<double> busy_of(size_t(p.pipeline), 0.0), model_of(size_t(p.pipeline), 0.0);
  busy_of[size_t(engine.stage())] = busy;
  model_of[size_t(engine.stage())] =
      nf * c.forward + nb * c.backward_input + nw * c.backward_weight;
  MPI_Allreduce(MPI_IN_PLACE, busy_of.data(), p.pipeline, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, model_of.data(), p.pipeline, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  std::vector<double> scale;
  for (int st = 0; st < p.pipeline; ++st)
    scale.push_back(busy_of[size_t(st)] / model_of[size_t(st)]);
  r.predicted = pipeline::check(s, pipeline::generate(s), c, 0, scale).bubble_fraction;
  return r;
}

// --config: the file's model, batch and layout replace bench's own options; one run in its dtype.
BenchOptions from_config(const BenchOptions& given) {
  BenchOptions a = given;
  const nlohmann::json j = read_config_json(a.config);
  const Config cfg = parse_config(j, a.overrides);
  a.model = cfg.model.family + " (" + a.config + ")";
  a.dtypes = {dtype_name(cfg.param_dtype())};
  a.tensor = cfg.parallelism.tensor, a.pipeline = cfg.parallelism.pipeline;
  a.schedule = cfg.parallelism.schedule, a.virtual_stages = cfg.parallelism.virtual_stages;
  a.sequence_parallel = cfg.parallelism.sequence_parallel;
  a.context = cfg.parallelism.context, a.context_impl = cfg.parallelism.context_impl;
  return a;
}

// --report: rank 0 writes the median step and every rank's peak per memory category over the
// step, with the rank's pipeline stage and tensor-parallel rank (every rank takes part).
void write_report(const BenchOptions& a, const StepMetrics& med, int stage, int tp_rank,
                  bool rank0) {
  const size_t n = kNumMemCategories + 2;
  std::vector<double> mine(n, 0.0);
  for (int k = 0; k < kNumMemCategories; ++k) mine[size_t(k)] = double(med.peak_bytes[size_t(k)]);
  mine[kNumMemCategories] = stage, mine[kNumMemCategories + 1] = tp_rank;
  std::vector<double> all = mine;
  int world = 1;
  if (comm::initialized()) {
    world = comm::world_size();
    all.resize(n * size_t(world));
    MPI_Gather(mine.data(), int(n), MPI_DOUBLE, all.data(), int(n), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  if (!rank0) return;
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < size_t(world); ++r) {
    nlohmann::json peaks = nlohmann::json::object();
    for (int k = 0; k < kNumMemCategories; ++k) {
      peaks[mem_category_name(MemCategory(k))] = size_t(all[r * n + size_t(k)]);
    }
    ranks.push_back({{"rank", r},
                     {"stage", int(all[r * n + kNumMemCategories])},
                     {"tp_rank", int(all[r * n + kNumMemCategories + 1])},
                     {"peak_bytes", peaks}});
  }
  const nlohmann::json j = {
      {"step_s", med.seconds}, {"tokens_per_s", med.tokens_per_s}, {"ranks", ranks}};
  atomic_write(a.report, j.dump(2) + "\n", IoError::input);
}

}  // namespace

void run_bench(const BenchOptions& given) {
  const BenchOptions a = given.config.empty() ? given : from_config(given);
  const int world = comm::initialized() ? comm::world_size() : 1;
  const bool rank0 = world == 1 || comm::world_rank() == 0;
  // A bad STRATA_BF16_MATMUL is an input error on every rank before anything is built.
  kernels::bf16_matmul_path();
  select_device(a.device, rank0);
  const comm::RankGrid grid(world, a.tensor, a.pipeline, "tp-dp-pp", a.context);
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
                        {"gradient_accumulation_steps", a.micro},
                        {"gradient_clipping", 1.0},
                        {"steps_per_print", 0},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                        {"model", {{"preset", a.model}}},
                        {"zero_optimization",
                         {{"overlap_comm", a.overlap == "on"}, {"reduce_bucket_size", a.bucket}}}};
    if (a.seq_len > 0) j["model"]["seq_len"] = a.seq_len;
    if (a.layers > 0) j["model"]["layers"] = a.layers;
    j["parallelism"] = {{"tensor", a.tensor},
                        {"sequence_parallel", a.sequence_parallel},
                        {"pipeline", a.pipeline},
                        {"schedule", a.schedule},
                        {"virtual_stages", a.virtual_stages},
                        {"partition", a.partition},
                        {"context", a.context},
                        {"context_impl", a.context_impl}};
    j["train"] = {{"device", a.device}};
    if (dtype == DType::BF16) j["bf16"] = {{"enabled", true}};
    if (dtype == DType::F16) j["fp16"] = {{"enabled", true}};
    if (!a.config.empty()) {
      j = read_config_json(a.config);
      j["steps_per_print"] = 0;
      j["train"]["device"] = a.device;
    }
    Config cfg = parse_config(j, a.overrides);
    STRATA_INPUT_CHECK(cfg.train.device == a.device,
                       "strata bench: --set train.device=", cfg.train.device,
                       " differs from --device ", a.device, "; choose the device with --device");
    resolve_batch(cfg, grid.dp());
    RandomTokens tokens(int64_t(1) << 30, cfg.model.vocab);
    Engine engine(cfg, &tokens, groups ? &groups->dp_cp() : nullptr,
                  groups ? &groups->tp() : nullptr, groups ? &groups->pp() : nullptr,
                  groups ? &groups->cp() : nullptr);
    engine.set_tracing(a.pipeline > 1);
    const double peak = machine.gflops();
    for (int i = 0; i < a.warmup; ++i) engine.train_batch();
    std::vector<StepMetrics> runs;
    std::vector<Bubble> bubbles;
    for (int i = 0; i < a.steps; ++i) {
      runs.push_back(engine.train_batch());
      if (a.pipeline > 1) bubbles.push_back(pipeline_bubble(engine, cfg));
    }
    // Activation peak of every stage (its largest over the stage's ranks).
    std::vector<double> stage_acts(size_t(a.pipeline), 0.0);
    if (a.pipeline > 1) {
      stage_acts[size_t(engine.stage())] =
          double(runs.back().peak_bytes[size_t(MemCategory::Activations)]);
      MPI_Allreduce(MPI_IN_PLACE, stage_acts.data(), a.pipeline, MPI_DOUBLE, MPI_MAX,
                    MPI_COMM_WORLD);
    }
    if (!a.report.empty()) {  // a collective: every rank's median step
      std::vector<StepMetrics> sorted = runs;
      std::sort(sorted.begin(), sorted.end(),
                [](const StepMetrics& x, const StepMetrics& y) { return x.seconds < y.seconds; });
      write_report(a, sorted[sorted.size() / 2], engine.stage(), groups ? groups->coord().tp : 0,
                   rank0);
    }
    if (!rank0) continue;
    if (a.pipeline > 1) {
      std::sort(bubbles.begin(), bubbles.end(),
                [](const Bubble& x, const Bubble& y) { return x.measured < y.measured; });
      const Bubble& m = bubbles[bubbles.size() / 2];
      std::printf(
          "bench pp=%d schedule=%s micro=%d virtual=%d | bubble measured %.4f, checker %.4f "
          "(with the measured action times), ratio %.3f\n",
          a.pipeline, a.schedule.c_str(), a.micro, a.virtual_stages, m.measured, m.predicted,
          m.measured / m.predicted);
      std::string per_stage;
      for (double b : stage_acts) per_stage.append(" ").append(format_bytes(size_t(b)));
      std::printf("bench activations per stage:%s\n", per_stage.c_str());
    }
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
          static_cast<unsigned long long>(
              cost::predict_tp_bytes(cost::layout_of(cfg), engine.spec())),
          per_block / 1024.0, 100.0 * per_block * layers / double(med.tp_bytes),
          format_bytes(med.peak_bytes[size_t(MemCategory::Activations)]).c_str());
    } else {
      std::printf("bench activations=%s\n",
                  format_bytes(med.peak_bytes[size_t(MemCategory::Activations)]).c_str());
    }
    // Activation checkpointing: what is kept between forward and backward, where, and the time
    // spent recomputing (part of the backward).
    const auto peak_of = [&](MemCategory c) { return med.peak_bytes[size_t(c)]; };
    const size_t kept = peak_of(MemCategory::Activations) +
                        peak_of(MemCategory::CheckpointedActivations) +
                        peak_of(MemCategory::HostCheckpoints);
    std::printf(
        "bench recompute | activations+checkpoints=%s (activations %s, device checkpoints %s, host "
        "checkpoints %s) recompute_s=%.4f (%.1f%% of the step) backward_s=%.3f\n",
        format_bytes(kept).c_str(), format_bytes(peak_of(MemCategory::Activations)).c_str(),
        format_bytes(peak_of(MemCategory::CheckpointedActivations)).c_str(),
        format_bytes(peak_of(MemCategory::HostCheckpoints)).c_str(), med.recompute_s,
        100.0 * med.recompute_s / med.seconds, med.backward_s);
    std::fflush(stdout);
  }
}

}  // namespace strata
