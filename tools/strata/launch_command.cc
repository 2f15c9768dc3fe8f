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

extern char** environ;

namespace strata::cli {

namespace {

struct LaunchArgs {
  int n = 1;
  std::string hostfile;
  int threads = 0;  // OpenMP threads per rank; 0 = cores / ranks on this host
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
  STRATA_INPUT_CHECK(a.n >= 1, "-n must be at least 1, got ", a.n);
  STRATA_INPUT_CHECK(!a.command.empty(),
                     "nothing to launch: give the strata command after --, e.g. "
                     "strata launch -n 4 -- train --config c.json");
  // Threads per rank: --threads, else the user's OMP_NUM_THREADS, else this host's hardware
  // threads shared by the ranks (ranks that each use every core slow each other down). On one
  // host an inherited OMP_NUM_THREADS that would put more threads than cores to work is capped
  // at the share: spinning OpenMP and MPI waits on oversubscribed cores slowed a 4-rank step on
  // 2 cores 24-fold here. An explicit --threads is kept, with a warning.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / a.n);
  const char* env_threads = std::getenv("OMP_NUM_THREADS");
  int threads = a.threads > 0                               ? a.threads
                : env_threads && std::atoi(env_threads) > 0 ? std::atoi(env_threads)
                                                            : share;
  const bool one_host = a.hostfile.empty();
  if (one_host && a.n * threads > cores && threads > share) {
    if (a.threads > 0) {
      std::fprintf(stderr,
                   "strata launch: warning: %d ranks x %d threads exceed this host's %d cores; "
                   "steps will slow down many-fold (--threads %d fits)\n",
                   a.n, threads, cores, share);
    } else {
      std::fprintf(stderr,
                   "strata launch: note: OMP_NUM_THREADS=%d x %d ranks exceeds this host's %d "
                   "cores; using %d thread(s) per rank (--threads overrides)\n",
                   threads, a.n, cores, share);
      threads = share;
    }
  }
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(a.n), "--bind-to", "none"};
  if (!a.hostfile.empty()) {
    argv.insert(argv.end(), {"--hostfile", a.hostfile});
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
  argv.insert(argv.end(), a.command.begin(), a.command.end());

  std::vector<char*> cargv;
  for (std::string& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = fork();
  STRATA_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
  if (pid == 0) {
    execvp("mpirun", cargv.data());
    std::fprintf(stderr, "strata: cannot run mpirun: %s; install openmpi-bin\n",
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

void add_launch_command(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run a strata command on N processes with mpirun: strata launch -n 4 -- train ...");
  cmd->add_option("-n,--np", args->n, "number of processes")->required();
  cmd->add_option("--hostfile", args->hostfile, "OpenMPI hostfile: 'host slots=N' per line")
      ->check(CLI::ExistingFile);
  cmd->add_option("--threads", args->threads,
                  "OpenMP threads per process (default: cores / processes)");
  cmd->add_option("command", args->command, "the strata command and its arguments, after --")
      ->required();
  cmd->callback([args, exit_code] { *exit_code = run_launch(*args); });
}

}  // namespace strata::cli
