// What a training run reports: the progress line on stdout every steps_per_print steps and one
// JSON object per optimizer step in <run_dir>/metrics.jsonl.
#pragma once

#include <mpi.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "strata/monitor/step_metrics.h"

namespace strata {

// MFU's denominator, one figure per machine as Megatron and PaLM define it: the best large dense
// GEMM the machine runs in any dtype — fp32, or bf16 where the CPU multiplies bf16 natively
// (an emulated or widened bf16 kernel is no peak) — whatever dtype the run trains in. Rank 0
// times a 2048³ GEMM alone with one rank's OpenMP threads while the others wait idle; the job's
// peak multiplies it by the ranks' worth of cores the hosts have (ranks sharing cores count
// once per core: 4 ranks × 1 thread on 2 cores are 2 ranks' worth).
struct MachinePeak {
  double fp32_gflops = 0.0, bf16_gflops = 0.0;  // one rank's threads; bf16 0 unless native
  int threads = 1;                              // 0: a GPU's peak (bf16_gflops alone)
  double rank_equivalents = 1.0;
  double per_rank_gflops() const;
  double gflops() const;  // the job's peak
  std::string describe() const;
};
// A collective over world (MPI_COMM_NULL: one process).
MachinePeak measure_machine_peak(MPI_Comm world);

// With `breakdown` (wall_clock_breakdown) the line ends with forward, backward, exposed
// gradient communication and optimizer times.
// The step's peak bytes per memory category, "params 1.2 MiB, grads ..." (non-zero ones).
std::string describe_peaks(const StepMetrics& s);
// eta_s >= 0 (before the last step) ends the line with "| ETA 4m05s".
std::string progress_line(const StepMetrics& s, int64_t total_steps, double peak_gflops,
                          bool breakdown, double eta_s = -1.0);
// The terminal's live line (core/progress.h): "step 12/400 | loss 3.2101 | 51234 tok/s |
// MFU 41.2% | ETA 4m10s".
std::string live_line(const StepMetrics& s, int64_t total_steps, double peak_gflops, double eta_s);

// The time left of a run from its pace so far: the wall time since this run's first step ended
// (validation and checkpoints included) over the steps since, times the steps left; from the
// first step alone until a second one ends. Negative when nothing is known or nothing is left.
class EtaClock {
 public:
  // After each step: its number and wall time.
  void step_done(int64_t step, double step_seconds);
  double eta_s(int64_t total_steps) const;

 private:
  int64_t first_step_ = -1, last_step_ = -1;
  double first_seconds_ = 0.0;
  std::chrono::steady_clock::time_point first_end_, last_end_;
};

// "step 40 | val loss 3.2101 | val ppl 24.78 | 0.52 s" (exp of the loss is the perplexity).
std::string val_line(int64_t step, double val_loss, double seconds);

class MetricsLog {
 public:
  // Creates run_dir if needed and opens <run_dir>/metrics.jsonl, one JSON object per step.
  // resumed_step 0: the file starts empty. A resumed run (resumed_step S > 0) keeps the rows of
  // steps 1..S and drops the later ones (the interrupted run's steps that this run trains again;
  // rewritten atomically), so the file holds one row per step.
  explicit MetricsLog(const std::string& run_dir, int64_t resumed_step = 0);
  // val_loss: the step's validation loss (Engine::evaluate), written as val_loss and val_ppl.
  // stragglers: the window's straggler statistics (monitor/stragglers.h), at a window's end.
  void write(const StepMetrics& s, double peak_gflops,
             std::optional<double> val_loss = std::nullopt,
             const nlohmann::json* stragglers = nullptr);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace strata
