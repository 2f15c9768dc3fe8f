#include "strata/launch/mpirun.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "strata/core/check.h"
#include "strata/core/progress.h"

extern char** environ;

namespace strata::launch {

namespace {

// Environment variables not forwarded: the launcher's own and per-process ones.
bool forwardable(const std::string& name) {
  for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "SLURM_", "BASH_FUNC_"}) {
    if (name.rfind(prefix, 0) == 0) return false;
  }
  return name != "OMP_NUM_THREADS" && name != "_" && name != "PWD" && name != "SHLVL";
}

// mpirun's own words when a job ends with a non-zero code, boxed between lines of dashes: that a
// process "returned a non-zero exit code", or that MPI_Abort was called with code 2 (an input
// error on some ranks only, which strata has printed naming the rank). launch returns the code
// and strata has said what went wrong, so these are dropped; every other line passes unchanged.
class EpilogueFilter {
 public:
  explicit EpilogueFilter(FILE* out) : out_(out) {}

  void feed(const char* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      partial_ += data[i];
      if (data[i] == '\n') {
        line(partial_);
        partial_.clear();
      }
    }
  }
  // End of the stream: what is left of a box that never closed, and a last unterminated line.
  void finish() {
    emit(block_);
    block_.clear();
    emit(partial_);
    partial_.clear();
  }

 private:
  static bool dashes(const std::string& l) {
    const size_t n = l.find_last_not_of("\r\n") + 1;
    return n >= 20 && l.find_first_not_of('-') >= n;
  }
  static bool is_epilogue(const std::string& box) {
    const auto has = [&](const char* s) { return box.find(s) != std::string::npos; };
    return has("Primary job  terminated normally") ||
           has("mpirun detected that one or more processes exited with non-zero status") ||
           (has("MPI_ABORT was invoked") && has("with errorcode 2."));
  }
  void emit(const std::string& text) {
    if (text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), out_);
    std::fflush(out_);
  }
  void line(const std::string& l) {
    if (block_.empty()) {
      // mpirun's tally of the same box from other ranks, after a dropped MPI_Abort box.
      if (dropped_abort_ && (l.find("help-mpi-api.txt / mpi-abort") != std::string::npos ||
                             l.find("orte_base_help_aggregate") != std::string::npos)) {
        return;
      }
      if (dashes(l)) {
        block_ = l;
        block_lines_ = 1;
      } else {
        emit(l);
      }
      return;
    }
    block_ += l;
    ++block_lines_;
    if (dashes(l)) {
      if (is_epilogue(block_)) {
        dropped_abort_ = dropped_abort_ || block_.find("MPI_ABORT") != std::string::npos;
      } else {
        emit(block_);
      }
      block_.clear();
    } else if (block_lines_ > 40) {  // too long for one of mpirun's boxes
      emit(block_);
      block_.clear();
    }
  }

  FILE* out_;
  std::string partial_, block_;
  int block_lines_ = 0;
  bool dropped_abort_ = false;
};

}  // namespace

std::string self_executable() {
  char buf[4096];
  ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  STRATA_CHECK(len > 0, "cannot find the strata executable (/proc/self/exe)");
  buf[len] = '\0';
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q.push_back(c);
    }
  }
  q.push_back('\'');
  return q;
}

// Runs mpirun with its stderr (its own and every rank's) passed through EpilogueFilter; returns
// the job's exit code.
int run_mpirun(const std::vector<std::string>& argv) {
  int fds[2];
  // Close-on-exec: mpirun gets the pipe's write end as its stderr only.
  STRATA_CHECK(pipe2(fds, O_CLOEXEC) == 0, "pipe failed: ", std::strerror(errno));
  const int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0);
  STRATA_CHECK(saved >= 0, "dup failed: ", std::strerror(errno));
  std::fflush(stderr);
  dup2(fds[1], STDERR_FILENO);  // the child inherits the pipe as its stderr
  int pid = -1;
  try {
    pid = spawn(argv, false);
  } catch (...) {
    dup2(saved, STDERR_FILENO);
    close(saved), close(fds[0]), close(fds[1]);
    throw;
  }
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fds[1]);
  EpilogueFilter filter(stderr);
  char buf[4096];
  for (;;) {
    const ssize_t got = read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    filter.feed(buf, size_t(got));
  }
  filter.finish();
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exit_code_of(status);
}

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
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(n)};
  const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  if (hostfile.empty() && int64_t(n) * threads > cpus) {
    // More ranks than CPUs: each is pinned to one, round robin, so that consecutive ranks (a
    // tensor-, context- or data-parallel group, which run at the same time) sit on different
    // CPUs. Left to the scheduler, its wake-up placement stacked such peers on one CPU now and
    // then: one 4-rank layout on 2 CPUs measured 0.19 s or 0.34 s a step from run to run, pinned
    // 0.20-0.21 s every time.
    argv.insert(argv.end(), {"--map-by", "hwthread", "--bind-to", "hwthread:overload-allowed"});
  } else {
    argv.insert(argv.end(), {"--bind-to", "none"});
  }
  if (!hostfile.empty()) {
    argv.insert(argv.end(), {"--hostfile", hostfile});
  } else {
    // One host: OpenMPI counts physical cores as slots, so allow more ranks than that.
    argv.push_back("--oversubscribe");
  }
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  // The ranks' stdout is OpenMPI's pseudo-terminal wherever this one's goes: they draw a live
  // progress line only if this process would (core/progress.h).
  if (std::getenv("STRATA_PROGRESS") == nullptr) {
    argv.insert(argv.end(), {"-x", std::string("STRATA_PROGRESS=") +
                                       (decide_live_progress() ? "live" : "lines")});
  }
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

}  // namespace strata::launch
