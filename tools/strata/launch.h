// What `strata launch` and its elastic supervisor share: the mpirun command for a job.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

// OpenMP threads per rank for n ranks: `requested` (--threads) if > 0, else OMP_NUM_THREADS, else
// this host's cores shared by the ranks; on one host an inherited OMP_NUM_THREADS that would
// oversubscribe the cores is capped at the share (a warning if --threads asked for it).
int threads_per_rank(int n, int requested, bool one_host);

// mpirun -np n [--hostfile F | --oversubscribe] ... -x OMP_NUM_THREADS=threads, every
// forwardable environment variable, then this executable and `command`.
std::vector<std::string> mpirun_command(int n, const std::string& hostfile, int threads,
                                        const std::vector<std::string>& command);

// Forks and execs argv; with new_group the child leads its own process group (so that a
// supervisor can signal mpirun and the ranks it started on this host at once). Returns the pid.
int spawn(const std::vector<std::string>& argv, bool new_group);

// The exit code of a waitpid status: the code, or 128 + the signal.
int exit_code_of(int status);

struct ElasticOptions {
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

// strata launch --elastic: runs the job, restarts it on failure; returns the exit code.
int run_elastic(const ElasticOptions& o);

}  // namespace strata::cli
