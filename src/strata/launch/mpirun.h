// Starting strata's processes: the mpirun command of a job (ranks pinned where they outnumber
// the cores, the environment forwarded, OpenMP threads shared out), running it with mpirun's own
// closing boxes dropped (strata has said what went wrong), and starting a strata subcommand as a
// child. `strata launch`, its elastic supervisor and the planner's measurements all start jobs
// so.
#pragma once

#include <string>
#include <vector>

namespace strata::launch {

// OpenMP threads per rank for n ranks: `requested` (--threads) if > 0, else OMP_NUM_THREADS, else
// this host's cores shared by the ranks; on one host an inherited OMP_NUM_THREADS that would
// oversubscribe the cores is capped at the share (a warning if --threads asked for it).
int threads_per_rank(int n, int requested, bool one_host);

// mpirun -np n [--hostfile F | --oversubscribe] ... -x OMP_NUM_THREADS=threads, every
// forwardable environment variable, then this executable and `command`.
std::vector<std::string> mpirun_command(int n, const std::string& hostfile, int threads,
                                        const std::vector<std::string>& command);

// Runs mpirun (argv from mpirun_command) with its stderr, its own and every rank's, passed on
// without mpirun's closing boxes for a job that ended with a non-zero code; returns the job's
// exit code.
int run_mpirun(const std::vector<std::string>& argv);

// Forks and execs argv; with new_group the child leads its own process group (so that a
// supervisor can signal mpirun and the ranks it started on this host at once). Returns the pid.
int spawn(const std::vector<std::string>& argv, bool new_group);

// The exit code of a waitpid status: the code, or 128 + the signal.
int exit_code_of(int status);

// This program's path (/proc/self/exe).
std::string self_executable();

// `s` as one word of a POSIX shell command line (single-quoted).
std::string shell_quote(const std::string& s);

}  // namespace strata::launch
