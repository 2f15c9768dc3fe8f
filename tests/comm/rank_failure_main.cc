// A job in which rank 1 fails: it throws while its own all_reduce is still queued (rank 0 never
// joins it), and main's handler must end the whole job at once with a message naming rank 1 and
// the reason, instead of waiting for the stuck collective. Run by tests/comm/expect_abort.cmake.
#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"

namespace {

void run(strata::comm::Communicator& world) {
  std::vector<float> x(1000, 1.0f);
  if (world.rank() == 1) {
    (void)world.all_reduce_async(x.data(), x.size(), strata::DType::F32, strata::DType::F32);
    throw std::runtime_error("rank 1 failed on purpose");
  }
  std::this_thread::sleep_for(std::chrono::seconds(100));  // the others are busy elsewhere
}

}  // namespace

int main(int argc, char** argv) {
  namespace comm = strata::comm;
  comm::init(&argc, &argv);
  try {
    comm::Communicator world(MPI_COMM_WORLD, "world");  // watchdog at its 600 s default
    run(world);
  } catch (const std::exception& e) {
    comm::abort_job(1, std::string("failed: ") + e.what());
  }
  comm::finalize();
  return 0;
}
