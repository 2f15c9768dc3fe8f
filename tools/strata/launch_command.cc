// strata launch: runs a strata command on N processes through mpirun, which is also how
// multi-host jobs start (--hostfile) and what Slurm's srun replaces.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/check.h"
#include "tools/strata/commands.h"
#include "tools/strata/launch.h"

extern char** environ;

namespace strata::cli {

namespace {

struct LaunchArgs {
  int n = 0;
  std::string hostfile;
  int threads = 0;  // OpenMP threads per rank; 0 = cores / ranks on this host
  std::string fault;
  bool elastic = false;
  ElasticOptions elastic_options;
  std::vector<std::string> command;
};

std::string self_executable() {
  char buf[4096];
  ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  STRATA_CHECK(len > 0, "cannot find the strata executable (/proc/self/exe)");
  buf[len] = '\0';
  return buf;
}

// Environment variables not forwarded: the launcher's own and per-process ones.
bool forwardable(const std::string& name) {
  for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "SLURM_", "BASH_FUNC_"}) {
    if (name.rfind(prefix, 0) == 0) return false;
  }
  return name != "OMP_NUM_THREADS" && name != "_" && name != "PWD" && name != "SHLVL";
}

int run_launch(const LaunchArgs& a) {
  STRATA_INPUT_CHECK(!a.command.empty(),
                     "nothing to launch: give the strata command after --, e.g. "
                     "strata launch -n 4 -- train --config c.json");
  if (a.elastic) {
    ElasticOptions o = a.elastic_options;
    o.n = a.n, o.hostfile = a.hostfile, o.threads = a.threads, o.fault = a.fault;
    o.command = a.command;
    return run_elastic(o);
  }
  STRATA_INPUT_CHECK(a.n >= 1, "-n must be at least 1, got ", a.n);
  std::vector<std::string> command = a.command;
  if (!a.fault.empty()) command.insert(command.end(), {"--fault", a.fault});
  const int threads = threads_per_rank(a.n, a.threads, a.hostfile.empty());
  int status = 0;
  const int pid = spawn(mpirun_command(a.n, a.hostfile, threads, command), false);
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exit_code_of(status);
}

}  // namespace

int threads_per_rank(int n, int requested, bool one_host) {
  // Ranks that each use every core slow each other down: spinning OpenMP and MPI waits on
  // oversubscribed cores slowed a 4-rank step on 2 cores 24-fold here.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / n);
  const char* env_threads = std::getenv("OMP_NUM_THREADS");
  int threads = requested > 0                               ? requested
                : env_threads && std::atoi(env_threads) > 0 ? std::atoi(env_threads)
                                                            : share;
  if (one_host && n * threads > cores && threads > share) {
    if (requested > 0) {
      std::fprintf(stderr,
                   "strata launch: warning: %d ranks x %d threads exceed this host's %d cores; "
                   "steps will slow down many-fold (--threads %d fits)\n",
                   n, threads, cores, share);
    } else {
      std::fprintf(stderr,
                   "strata launch: note: OMP_NUM_THREADS=%d x %d ranks exceeds this host's %d "
                   "cores; using %d thread(s) per rank (--threads overrides)\n",
                   threads, n, cores, share);
      threads = share;
    }
  }
  return threads;
}

std::vector<std::string> mpirun_command(int n, const std::string& hostfile, int threads,
                                        const std::vector<std::string>& command) {
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(n), "--bind-to", "none"};
  if (!hostfile.empty()) {
    argv.insert(argv.end(), {"--hostfile", hostfile});
  } else {
    // One host: OpenMPI counts physical cores as slots, so allow more ranks than that.
    argv.push_back("--oversubscribe");
  }
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  for (char** e = environ; *e != nullptr; ++e) {
    std::string name(*e, std::strcspn(*e, "="));
    if (forwardable(name)) argv.insert(argv.end(), {"-x", name});
  }
  argv.push_back(self_executable());
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

int spawn(const std::vector<std::string>& argv, bool new_group) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  STRATA_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
  if (pid == 0) {
    if (new_group) setpgid(0, 0);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "strata: cannot run %s: %s; install openmpi-bin\n", cargv[0],
                 std::strerror(errno));
    _exit(127);
  }
  if (new_group) setpgid(pid, pid);  // both sides, so that a signal right away finds the group
  return pid;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void add_launch_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a strata command on N processes with mpirun: strata launch -n 4 -- train ...");
  ElasticOptions& e = args->elastic_options;
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
