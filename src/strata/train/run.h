// `strata train` as a library call: a run from its config to its last step on every rank of the
// job (or one process). It loads the config (a checkpoint's model where the config has none),
// builds the process groups, the data and the engine, resumes, then steps: validation on its
// schedule, metrics, monitors, stragglers, progress and checkpoints at their intervals; traces
// and injected faults where asked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/pipeline/fault_injection.h"

namespace strata {

struct RunOptions {
  std::string config;  // the config file
  // "a.b.c=value" overrides in order: --set's, then the keys the command's flags set
  // (train.steps, train.run_dir, data.path, train.device).
  std::vector<std::string> overrides;
  std::string resume;  // "auto" (checkpoint.dir's latest, if any), a checkpoint directory, or ""
  int64_t trace_first = 0, trace_last = -1;  // the steps traced (1-based); none when last < first
  pipeline::FaultPlan faults;                // injected faults (tests)
  // What run.json records of the program.
  std::string version;
  std::vector<std::string> command_line;
};

void run_training(const RunOptions& o);

// train.device: "cuda" puts this rank on a GPU (local rank mod the visible GPUs) before anything
// is allocated, and makes it the device every Buffer and view of the run lives on; "cpu" notes a
// visible GPU on rank 0. No GPU for "cuda" is an InputError.
void select_device(const std::string& device, bool rank0);

}  // namespace strata
