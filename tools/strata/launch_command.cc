// strata launch: runs a strata command on N processes through mpirun, which is also how
// multi-host jobs start (--hostfile) and what Slurm's srun replaces; with --elastic under the
// supervisor (elastic/supervisor.h).
#include <memory>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/elastic/supervisor.h"
#include "strata/launch/mpirun.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct LaunchArgs {
  int n = 0;
  std::string hostfile;
  int threads = 0;  // OpenMP threads per rank; 0 = cores / ranks on this host
  std::string fault;
  bool elastic = false;
  strata::elastic::SupervisorOptions elastic_options;
  std::vector<std::string> command;
};

int run_launch(const LaunchArgs& a) {
  STRATA_INPUT_CHECK(!a.command.empty(),
                     "nothing to launch: give the strata command after --, e.g. "
                     "strata launch -n 4 -- train --config c.json");
  if (a.elastic) {
    elastic::SupervisorOptions o = a.elastic_options;
    o.n = a.n, o.hostfile = a.hostfile, o.threads = a.threads, o.fault = a.fault;
    o.command = a.command;
    return elastic::run_supervisor(o);
  }
  STRATA_INPUT_CHECK(a.n >= 1, "-n must be at least 1, got ", a.n);
  std::vector<std::string> command = a.command;
  if (!a.fault.empty()) command.insert(command.end(), {"--fault", a.fault});
  const int threads = launch::threads_per_rank(a.n, a.threads, a.hostfile.empty());
  return launch::run_mpirun(launch::mpirun_command(a.n, a.hostfile, threads, command));
}

}  // namespace

void add_launch_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a strata command on N processes with mpirun: strata launch -n 4 -- train ...");
  elastic::SupervisorOptions& e = args->elastic_options;
  cmd->add_option("-n,--np", args->n,
                  "number of processes (with --elastic: the first start's, default --max-ranks)");
  cmd->add_option("--hostfile", args->hostfile, "OpenMPI hostfile: 'host slots=N' per line")
      ->check(CLI::ExistingFile);
  cmd->add_option("--threads", args->threads,
                  "OpenMP threads per process (default: cores / processes)");
  cmd->add_option("--fault", args->fault,
                  "rank=R,step=S,phase=P: passed to train (with --elastic, to the first start "
                  "only): rank R is killed in phase P of step S (tests)");
  cmd->add_flag("--elastic", args->elastic,
                "run under a supervisor that restarts the job from its latest checkpoint on the "
                "workers still available when a rank dies, a host drops out or the watchdog fires");
  cmd->add_option("--min-ranks", e.min_ranks, "elastic: the fewest ranks to go on with")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-ranks", e.max_ranks, "elastic: the most ranks (default: every slot)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-restarts", e.max_restarts, "elastic: restarts before giving up")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--heartbeat-timeout", e.heartbeat_timeout_s,
                  "elastic: seconds of silence after which a rank (or, from a rank's side, the "
                  "supervisor) counts as lost")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--supervisor-addr", e.supervisor_addr,
                  "elastic: the address ranks reach the supervisor at (default: 127.0.0.1, or "
                  "with --hostfile this host's address towards the first host)");
  cmd->add_option("command", args->command, "the strata command and its arguments, after --")
      ->required();
  cmd->callback([args, exit_code] { *exit_code = run_launch(*args); });
}

}  // namespace strata::cli
