// strata launch --elastic: the supervisor that runs a job, restarts it on the workers still
// available when a rank dies, a host drops out or the watchdog fires, and keeps its global batch
// (layout.h); supervisor.cc says how it hears of a failure.
#pragma once

#include <string>
#include <vector>

namespace strata::elastic {

struct SupervisorOptions {
  int n = 0;  // first start; 0: max_ranks
  std::string hostfile;
  int threads = 0;
  int min_ranks = 1, max_ranks = 0;  // 0: every slot
  int max_restarts = 3;
  double heartbeat_timeout_s = 10.0;
  std::string supervisor_addr;  // how ranks reach the supervisor; "" = found out
  std::string fault;            // --fault for the first start only
  std::vector<std::string> command;
};

// Runs the job, restarting it on failure; returns the exit code.
int run_supervisor(const SupervisorOptions& o);

}  // namespace strata::elastic
