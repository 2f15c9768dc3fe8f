// The Chrome trace of `train --trace-steps`: every rank's actions of the traced steps, gathered to
// rank 0 step by step and written as one <run_dir>/trace.json (it opens in Perfetto): a thread per
// rank named by its place in the grid, each step after the ones traced before it.
#pragma once

#include <mpi.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/comm/topology.h"
#include "strata/pipeline/executor.h"

namespace strata {

class StepTrace {
 public:
  // world: every rank of the job (MPI_COMM_NULL for one process); `at`: this rank's place.
  StepTrace(MPI_Comm world, bool rank0, const comm::GridCoord& at);
  // Collective over world: this rank's action spans of one step (Engine::last_trace()), placed
  // after the steps gathered before it, aligned on the step's earliest action over every rank
  // (one host: one steady clock).
  void gather(const std::vector<pipeline::ActionSpan>& spans);
  // Rank 0: the trace file, written whole (core/atomic_file.h).
  void write(const std::string& path) const;

 private:
  // One action of one rank as it travels to rank 0: plain bytes (every rank runs this binary),
  // without padding.
  struct Event {
    double start_s, end_s;
    int32_t op, micro, chunk, peer;
    int32_t pp, tp, dp, cp;
  };
  static_assert(sizeof(Event) == 2 * sizeof(double) + 8 * sizeof(int32_t));
  MPI_Comm world_;
  bool rank0_;
  comm::GridCoord at_;
  nlohmann::json events_ = nlohmann::json::array();
  double offset_us_ = 0.0;  // where the next step starts
};

}  // namespace strata
