#include "strata/comm/mpi_runtime.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "strata/comm/flight_recorder.h"
#include "strata/comm/heartbeat.h"
#include "strata/comm/wire_reduce.h"

namespace strata::comm {

namespace {

// A duplicate of MPI_COMM_WORLD for the ending of a job only, so that its barrier can never match
// a collective of the job's own communicators.
MPI_Comm g_end_comm = MPI_COMM_NULL;

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return fallback;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace

void init(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  if (initialized()) {
    MPI_Query_thread(&provided);
  } else {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    STRATA_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error_string(rc));
  }
  STRATA_CHECK(provided == MPI_THREAD_MULTIPLE, "the MPI library provides ",
               thread_level_name(provided),
               "; strata needs MPI_THREAD_MULTIPLE (each process group runs its collectives on "
               "its own thread): use an MPI built with thread support (OpenMPI: "
               "--enable-mpi-thread-multiple)");
  detail::create_wire_ops();
  if (g_end_comm == MPI_COMM_NULL) {
    STRATA_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_end_comm) == MPI_SUCCESS,
                 "MPI_Comm_dup of MPI_COMM_WORLD failed");
  }
}

void finalize() {
  if (!initialized()) return;
  if (g_end_comm != MPI_COMM_NULL) MPI_Comm_free(&g_end_comm);
  detail::free_wire_ops();
  MPI_Finalize();
}

bool initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int world_rank() {
  int r = 0;
  if (initialized()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0);
}

int world_size() {
  int s = 1;
  if (initialized()) {
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }
  return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, 1);
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

void abort_job(int exit_code, const std::string& why) {
  const std::string line =
      strata::detail::concat("strata: rank ", world_rank(), " on ", host_name(), ": ", why, "\n");
  std::fflush(stdout);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  flight::dump("abort: " + why);
  heartbeat_fatal(exit_code, why);
  // MPI_Abort asks mpirun to end the job; with mpirun unreachable (a cut link) it may never
  // return, so the default action of SIGALRM ends this process regardless.
  alarm(10);
  if (initialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

void end_job_on_input_error(int exit_code, const std::string& why, double wait_s) {
  if (!initialized() || g_end_comm == MPI_COMM_NULL) {
    std::fprintf(stderr, "strata: %s\n", why.c_str());
    return;
  }
  // Every rank that hits the error enters the barrier; it completes only when all have.
  MPI_Request barrier = MPI_REQUEST_NULL;
  int all_here = 0;
  if (MPI_Ibarrier(g_end_comm, &barrier) == MPI_SUCCESS) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (MPI_Test(&barrier, &all_here, MPI_STATUS_IGNORE) == MPI_SUCCESS && !all_here &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (!all_here) abort_job(exit_code, why);  // other ranks are elsewhere: end them

  // Rank 0's message, and whether every rank has the same one.
  int len = int(why.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, g_end_comm);
  std::string first(size_t(len), '\0');
  if (world_rank() == 0) first = why;
  MPI_Bcast(first.data(), len, MPI_CHAR, 0, g_end_comm);
  int same = first == why, all_same = 0;
  MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_LAND, g_end_comm);
  std::fflush(stdout);
  if (all_same && world_rank() == 0) {
    std::fprintf(stderr, "strata: all %d ranks: %s\n", world_size(), why.c_str());
  } else if (!all_same && (world_rank() == 0 || !same)) {
    std::fprintf(stderr, "strata: rank %d on %s: %s\n", world_rank(), host_name().c_str(),
                 why.c_str());
  }
  std::fflush(stderr);
  finalize();
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
    return strata::detail::concat("MPI error ", code);
  return std::string(buf, size_t(len));
}

}  // namespace strata::comm
