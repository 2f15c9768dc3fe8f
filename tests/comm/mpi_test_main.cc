// main() for the MPI tests: every rank runs every test; rank 0 prints the usual output, other
// ranks print only their failures, prefixed with the rank; the exit status is non-zero if a test
// failed on any rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "strata/comm/mpi_runtime.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  strata::comm::init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = strata::comm::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  strata::comm::finalize();
  return any;
}
