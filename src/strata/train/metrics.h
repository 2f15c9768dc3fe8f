// What a training run reports: the progress line on stdout every steps_per_print steps and one
// JSON object per optimizer step in <run_dir>/metrics.jsonl.
#pragma once

#include <mpi.h>

#include <fstream>
#include <optional>
#include <string>

#include "strata/train/engine.h"

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
std::string progress_line(const StepMetrics& s, int64_t total_steps, double peak_gflops,
                          bool breakdown);

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
  void write(const StepMetrics& s, double peak_gflops,
             std::optional<double> val_loss = std::nullopt);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace strata
