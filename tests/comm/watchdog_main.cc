// A job the watchdog must end: rank 1 never joins the all_reduce that rank 0 waits in, and
// rank 0's 2 s timeout aborts the job with a message naming rank 0, the operation and the group.
// Argument: "blocking" (the call runs on rank 0's own thread and the comm thread watches it) or
// "async" (the comm thread runs it and wait() watches). Run by tests/comm/expect_abort.cmake.
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"

int main(int argc, char** argv) {
  namespace comm = strata::comm;
  comm::init(&argc, &argv);
  const bool blocking = argc > 1 && std::strcmp(argv[1], "blocking") == 0;
  {
    comm::Communicator world(MPI_COMM_WORLD, "world");
    world.set_timeout(std::chrono::seconds(2));
    if (world.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(100));  // stuck: never joins
    } else {
      std::vector<float> x(1000, 1.0f);
      if (blocking) {
        world.all_reduce(x.data(), x.size(), strata::DType::F32, strata::DType::F32);
      } else {
        world.all_reduce_async(x.data(), x.size(), strata::DType::F32, strata::DType::F32).wait();
      }
    }
  }
  comm::finalize();
  return 0;
}
