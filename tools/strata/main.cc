// strata: the command line. Exit codes: 0 success, 2 usage or configuration error (bad config,
// data file or command line), 1 runtime failure. Under mpirun (or srun) every process runs the
// same command; a failure on any rank aborts the whole job with a message naming the rank, except
// an input error that every rank hits: it is printed once and each rank exits 2.
#include <dnnl.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "strata/comm/heartbeat.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"
#include "strata/core/progress.h"
#include "strata/kernels/ops.h"
#include "tools/strata/commands.h"
#include "tools/strata/suggest.h"

namespace {

// Whether a launcher started this process as one rank of a job.
bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

// How long the ranks of a job that hit an input error wait for each other before the job is
// aborted: every rank reads the config and the command line within moments of the others.
constexpr double kInputErrorWaitSeconds = 5.0;

int fail(int code, const char* kind, const char* what) {
  strata::comm::heartbeat_fatal(code, std::string(kind) + what);
  if (strata::comm::initialized() && strata::comm::world_size() > 1) {
    if (code == 2) {  // bad input: printed once when every rank has it, no MPI_Abort
      strata::comm::end_job_on_input_error(code, std::string(kind) + what, kInputErrorWaitSeconds);
      return code;
    }
    strata::comm::abort_job(code, std::string(kind) + what);  // never returns
  }
  std::fprintf(stderr, "strata: %s%s\n", kind, what);
  if (strata::comm::initialized()) strata::comm::finalize();
  return code;
}

// The CUDA backend as built into this binary (CMakeLists.txt): the toolkit and architectures,
// whether NCCL carries its collectives, and the GPUs this process sees now.
std::string cuda_text() {
#ifdef STRATA_HAVE_CUDA
  const int gpus = strata::ops::device_count(strata::Device::CUDA);
  std::string nccl =
#ifdef STRATA_HAVE_NCCL
      "NCCL";
#else
      "no NCCL: GPU collectives through host memory";
#endif
  return std::string("cuda (CUDA ") + STRATA_CUDA_VERSION + ", sm " + STRATA_CUDA_ARCHITECTURES +
         ", " + nccl + "; " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") + " visible)";
#else
  return "CUDA: not built into this binary (no nvcc at build time, or -DSTRATA_CUDA=OFF)";
#endif
}

// `strata --version`: the release and what this binary was built with.
std::string version_text() {
  const dnnl_version_t* dnnl = dnnl_version();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_line(mpi, size_t(len));
  mpi_line = mpi_line.substr(0, mpi_line.find_first_of(",\n"));
  return std::string("strata ") + STRATA_VERSION + "\nbackends: cpu (oneDNN " +
         std::to_string(dnnl->major) + "." + std::to_string(dnnl->minor) + "." +
         std::to_string(dnnl->patch) + ", OpenMP); " + cuda_text() + "\nMPI: " + mpi_line;
}

std::vector<std::string>& saved_command_line() {
  static std::vector<std::string> args;
  return args;
}

}  // namespace

void strata::cli::set_command_line(int argc, char** argv) {
  saved_command_line().assign(argv, argv + argc);
}

const std::vector<std::string>& strata::cli::command_line() {
  return saved_command_line();
}

int main(int argc, char** argv) {
  strata::cli::set_command_line(argc, argv);
  CLI::App app{"strata: distributed training of Transformer models", "strata"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text());
  int exit_code = 0;
  strata::cli::add_train_command(app);
  strata::cli::add_launch_command(app, &exit_code);
  strata::cli::add_topology_command(app);
  strata::cli::add_schedule_command(app);
  strata::cli::add_elastic_command(app);
  strata::cli::add_data_command(app);
  strata::cli::add_bench_command(app);
  strata::cli::add_plan_command(app);
  strata::cli::add_ckpt_command(app);
  strata::cli::add_doctor_command(app);
  strata::cli::add_report_command(app);
  try {
    if (launched_by_mpi()) strata::comm::init(&argc, &argv);
    // Rank 0 draws progress live where a person watches a terminal (core/progress.h).
    strata::set_live_progress(strata::decide_live_progress() && strata::comm::world_rank() == 0);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help, or a bad command line: CLI11 prints it (once, from rank 0 under MPI).
    const bool rank0 = strata::comm::world_rank() == 0;
    const int code = rank0 ? app.exit(e) : e.get_exit_code();
    if (rank0 && code != 0) {
      for (const std::string& s : strata::cli::suggestions(app, argc, argv)) {
        std::fprintf(stderr, "strata: %s\n", s.c_str());
      }
    }
    if (strata::comm::initialized()) strata::comm::finalize();
    return code == 0 ? 0 : 2;
  } catch (const std::filesystem::filesystem_error& e) {
    return fail(2, "error: ", e.what());  // a path the user gave cannot be used
  } catch (const strata::InputError& e) {
    return fail(2, "error: ", e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "failed: ",
                "out of memory; reduce train_micro_batch_size_per_gpu, model.seq_len or the "
                "model, or run on several ranks with zero_optimization.stage 1-3 to shard the "
                "model states");
  } catch (const std::exception& e) {
    return fail(1, "failed: ", e.what());
  }
  if (strata::comm::initialized()) strata::comm::finalize();
  return exit_code;
}
