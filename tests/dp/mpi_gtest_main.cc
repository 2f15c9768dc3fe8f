// main() for GoogleTest binaries run under mpirun: every rank runs every test; only rank 0
// prints; the exit status is non-zero if a test failed on any rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include "strata/comm/mpi_runtime.h"

int main(int argc, char** argv) {
  strata::comm::init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (strata::comm::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  strata::comm::finalize();
  return any;
}
