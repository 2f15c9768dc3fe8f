// What a training run reports: the progress line on stdout every steps_per_print steps and one
// JSON object per optimizer step in <run_dir>/metrics.jsonl.
#pragma once

#include <mpi.h>

#include <fstream>
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
  int threads = 1;
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

class MetricsLog {
 public:
  // Creates run_dir if needed and truncates <run_dir>/metrics.jsonl.
  // append: a resumed run adds its steps after the saved run's lines.
  explicit MetricsLog(const std::string& run_dir, bool append = false);
  void write(const StepMetrics& s, double peak_gflops);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace strata
