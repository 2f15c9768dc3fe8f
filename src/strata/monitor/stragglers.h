// Stragglers: which rank holds the others back. Every `interval` steps each rank's time per phase
// over the window (forward, backward, exposed data-parallel reduction, ZeRO-3 gathers,
// tensor-parallel collectives, pipeline receives, optimizer) is gathered on rank 0, which keeps
// min / median / max and the slowest rank of each for metrics.jsonl. A rank is slow in a window
// when its busy time per step (the step less the time it waited on others) exceeds the median's
// by more than `threshold` of it (and by 5% of the median step and 1 ms at least); one slow in
// `patience` windows in a row
// is named in the log, with the phase where it loses the most.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "strata/monitor/step_metrics.h"

namespace strata {

struct StragglerOptions {
  int64_t interval = 20;  // steps per window; 0: off
  double threshold = 0.2;
  int64_t patience = 2;
  int timeout_s = 600;  // parallelism.timeout_s: the longest wait for the other ranks
};

// The phases gathered, in order; "busy_s" last (the step less its waits).
const std::vector<std::string>& straggler_phases();

struct StragglerReport {
  nlohmann::json stats;            // for metrics.jsonl (rank 0)
  std::vector<std::string> named;  // log lines naming slow ranks (rank 0)
};

class StragglerWatch {
 public:
  // world: every rank of the job (MPI_COMM_NULL: one process, nothing to compare). describe_rank
  // (rank 0 only needs it) names a rank's place, e.g. "dp 1 tp 0 pp 1 on host-a".
  StragglerWatch(const StragglerOptions& o, MPI_Comm world, std::vector<std::string> rank_names);
  // Every rank after each step; at a window's end a collective over world. Rank 0 gets the
  // window's report.
  std::optional<StragglerReport> step_done(const StepMetrics& s);

  // The report of one window from per-rank phase seconds (rows: ranks; columns:
  // straggler_phases()) over `steps` steps, updating the slow streaks. stats: "steps" [first,
  // last]; "per_step": per phase min, median, max (seconds per step) and slowest_rank;
  // "per_rank": "step_time_s" and "busy_s", each rank's seconds per step, indexed by rank;
  // "slow_ranks".
  StragglerReport analyse(const std::vector<std::vector<double>>& per_rank, int64_t steps,
                          int64_t last_step);

 private:
  StragglerOptions o_;
  MPI_Comm world_;
  std::vector<std::string> names_;
  std::vector<double> sums_;
  int64_t steps_ = 0;
  std::vector<int64_t> streak_;  // windows in a row each rank was slow
  int flight_group_ = 0;         // the gather's group in the flight recorder
};

}  // namespace strata
