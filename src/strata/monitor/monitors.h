// The run's monitors from the config: DeepSpeed's tensorboard and csv_monitor blocks, fed on
// rank 0 with each step's figures (the same step metrics.jsonl records). Tags and x axis are
// DeepSpeed's: "Train/Samples/<name>" at the global sample count (train_loss, lr, loss_scale as
// DeepSpeed logs them), with strata's own figures beside them under the same prefix.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/monitor/csv_monitor.h"
#include "strata/monitor/scalars.h"
#include "strata/monitor/step_metrics.h"
#include "strata/monitor/tensorboard.h"

namespace strata {

// A monitor's directory: <output_path>/<job_name> as DeepSpeed makes it, with train.run_dir in
// place of an empty output_path (DeepSpeed's would be the working directory).
std::string monitor_dir(const MonitorConfig& m, const std::string& run_dir);

// One step's scalars: train_loss, lr, loss_scale, grad_norm, val_loss and val_ppl (steps that
// evaluate), tokens_per_s, mfu, step_time_s, the exposed communication (data-parallel
// reductions, ZeRO-3 gathers, tensor-parallel collectives), and memory/<category>_bytes for each
// category's peak.
monitor::Scalars step_scalars(const StepMetrics& s, double peak_gflops,
                              std::optional<double> val_loss);

class RunMonitors {
 public:
  // resumed_samples: the samples a resumed run had consumed when its checkpoint was saved (0 for
  // a fresh run); the monitors keep what earlier runs logged up to it.
  RunMonitors(const Config& cfg, int64_t resumed_samples);
  bool any() const { return tb_ != nullptr || csv_ != nullptr; }
  void write(const StepMetrics& s, int64_t samples, double peak_gflops,
             std::optional<double> val_loss);
  // "tensorboard: DIR/events..., csv_monitor: DIR" for the start-up line; "" without monitors.
  std::string describe() const;

 private:
  std::unique_ptr<monitor::TensorBoardWriter> tb_;
  std::unique_ptr<monitor::CsvMonitor> csv_;
};

}  // namespace strata
