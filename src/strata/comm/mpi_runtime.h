// The MPI process runtime: start-up and shutdown, who this process is, and how a job dies.
// strata needs MPI_THREAD_MULTIPLE: every Communicator runs its operations on its own thread.
#pragma once

#include <mpi.h>

#include <string>

#include "strata/core/check.h"

namespace strata::comm {

// MPI_Init_thread with MPI_THREAD_MULTIPLE; throws Error if the library cannot provide it.
// Accepts an MPI that someone else initialised, if it runs at that thread level.
void init(int* argc, char*** argv);
// Frees strata's MPI types and ops, then MPI_Finalize. No-op when MPI is not running.
// Destroy every Communicator first; one still alive afterwards is torn down without MPI.
void finalize();
// MPI_Init has run and MPI_Finalize has not.
bool initialized();
// This process's rank and the job size: from MPI when it runs, otherwise from the launcher's
// environment (OMPI_COMM_WORLD_*, PMI_*), otherwise 0 and 1.
int world_rank();
int world_size();
std::string host_name();

// Prints "strata: rank R on HOST: WHY" to stderr and ends the whole job: MPI_Abort when MPI
// runs (mpirun then kills every rank), std::exit otherwise.
[[noreturn]] void abort_job(int exit_code, const std::string& why);

// Ends this rank's part of a job that hit an input error (bad config, data or command line), the
// error `why`. When every rank reports an input error within `wait_s` seconds (a deterministic
// one), it is printed once ("strata: all N ranks: WHY" from rank 0, or each rank's own where they
// differ), MPI is finalized and the caller exits with `exit_code` (no MPI_Abort, so mpirun shows
// no abort banner). Otherwise (an error on some ranks only) abort_job. Without MPI running it
// only prints "strata: WHY".
void end_job_on_input_error(int exit_code, const std::string& why, double wait_s);

// The MPI library's sentence for an error code.
std::string mpi_error_string(int code);

}  // namespace strata::comm

// Calls an MPI function on a communicator with MPI_ERRORS_RETURN; a failure throws strata::Error
// naming the call and MPI's reason.
#define STRATA_MPI_CHECK(call)                                                           \
  do {                                                                                   \
    const int strata_mpi_rc_ = (call);                                                   \
    if (strata_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                                    \
      STRATA_FAIL(#call, " failed: ", ::strata::comm::mpi_error_string(strata_mpi_rc_)); \
    }                                                                                    \
  } while (0)
