// What a training run reports: the progress line on stdout every steps_per_print steps and one
// JSON object per optimizer step in <run_dir>/metrics.jsonl.
#pragma once

#include <fstream>
#include <string>

#include "strata/train/engine.h"

namespace strata {

// Peak GFLOP/s of a large matmul (n³, best of 5) in dtype on this machine with the current
// OpenMP threads, measured once per (dtype, n) per process: the denominator of MFU. `strata bench`
// uses n = 2048; training uses 1024 to keep start-up quick.
double measured_matmul_peak_gflops(DType dtype, int n);

// With `breakdown` (wall_clock_breakdown) the line ends with forward, backward, exposed
// gradient communication and optimizer times.
// The step's peak bytes per memory category, "params 1.2 MiB, grads ..." (non-zero ones).
std::string describe_peaks(const StepMetrics& s);
std::string progress_line(const StepMetrics& s, int64_t total_steps, double peak_gflops,
                          bool breakdown);

class MetricsLog {
 public:
  // Creates run_dir if needed and truncates <run_dir>/metrics.jsonl.
  explicit MetricsLog(const std::string& run_dir);
  void write(const StepMetrics& s, double peak_gflops);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace strata
