// comm_bandwidth: strata's collectives against the raw MPI calls they wrap, on the same buffers.
// Prints, per operation and size, the median algorithm bandwidth (bytes / time) of raw MPI, of
// strata's blocking form (runs on the calling thread when nothing is queued) and of its async
// form issued and waited at once (runs on the communication thread: two thread hand-offs), with
// their ratios to raw.
//   mpirun -np 2 -x OMP_NUM_THREADS=1 build/comm_bandwidth [--reps N] [--wire bf16|fp16]
// Size is the all_reduce buffer, the reduce_scatter input and the all_gather output, in fp32.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/core/memory.h"

namespace {

using strata::DType;
namespace comm = strata::comm;

// Seconds one call takes on the slowest rank.
double timed(MPI_Comm raw, const std::function<void()>& op) {
  MPI_Barrier(raw);
  const double t0 = MPI_Wtime();
  op();
  double dt = MPI_Wtime() - t0, slowest = 0.0;
  MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, raw);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string human(size_t bytes) {
  char s[32];
  if (bytes >= (1u << 20)) {
    std::snprintf(s, sizeof(s), "%zu MiB", bytes >> 20);
  } else {
    std::snprintf(s, sizeof(s), "%zu KiB", bytes >> 10);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  comm::init(&argc, &argv);
  int fixed_reps = 0;
  DType wire = DType::F32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) fixed_reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--wire") == 0) wire = strata::parse_dtype(argv[i + 1], "--wire");
  }
  {
    comm::Communicator c(MPI_COMM_WORLD, "world");
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const int P = c.size();
    const bool print = c.rank() == 0;
    constexpr size_t kMaxBytes = size_t(64) << 20;
    strata::Buffer a(strata::MemCategory::Workspace, kMaxBytes);
    strata::Buffer b(strata::MemCategory::Workspace, kMaxBytes);
    float* x = a.as<float>();
    float* y = b.as<float>();
    for (size_t i = 0; i < kMaxBytes / 4; ++i) x[i] = float(i % 1000) * 1e-3f;
    if (print) {
      std::printf("ranks %d, fp32 data, strata wire %s, median of N repetitions\n", P,
                  strata::dtype_name(wire));
      std::printf("%-15s %8s %5s %9s %9s %6s %9s %6s\n", "op", "size", "N", "raw GB/s", "blocking",
                  "ratio", "async", "ratio");
    }
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
      for (size_t bytes = 1024; bytes <= kMaxBytes; bytes *= 4) {
        const size_t n = bytes / 4, per_rank = n / size_t(P);
        const int count = int(n), block = int(per_rank);
        std::function<void()> raw_op, strata_op, async_op;
        if (std::strcmp(op, "all_reduce") == 0) {
          raw_op = [&] { MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, raw); };
          strata_op = [&] { c.all_reduce(x, n, DType::F32, wire); };
          async_op = [&] { c.all_reduce_async(x, n, DType::F32, wire).wait(); };
        } else if (std::strcmp(op, "reduce_scatter") == 0) {
          raw_op = [&] { MPI_Reduce_scatter_block(x, y, block, MPI_FLOAT, MPI_SUM, raw); };
          strata_op = [&] { c.reduce_scatter(x, y, per_rank, DType::F32, wire); };
          async_op = [&] { c.reduce_scatter_async(x, y, per_rank, DType::F32, wire).wait(); };
        } else {
          raw_op = [&] { MPI_Allgather(x, block, MPI_FLOAT, y, block, MPI_FLOAT, raw); };
          strata_op = [&] { c.all_gather(x, y, per_rank, DType::F32); };
          async_op = [&] { c.all_gather_async(x, y, per_rank, DType::F32).wait(); };
        }
        const int reps =
            fixed_reps > 0 ? fixed_reps : int(std::clamp<size_t>((256u << 20) / bytes, 11, 201));
        const std::function<void()>* ops[3] = {&raw_op, &strata_op, &async_op};
        std::vector<double> t[3];
        for (int r = -2; r < reps; ++r) {  // 2 warm-up rounds; the order rotates every round
          for (int k = 0; k < 3; ++k) {
            const int which = (k + (r + 2)) % 3;
            const double dt = timed(raw, *ops[which]);
            if (r >= 0) t[which].push_back(dt);
          }
        }
        double g[3];
        for (int k = 0; k < 3; ++k) g[k] = double(bytes) / median(t[k]) / 1e9;
        if (print) {
          std::printf("%-15s %8s %5d %9.3f %9.3f %6.3f %9.3f %6.3f\n", op, human(bytes).c_str(),
                      reps, g[0], g[1], g[1] / g[0], g[2], g[2] / g[0]);
          std::fflush(stdout);
        }
      }
    }
    MPI_Comm_free(&raw);
  }
  comm::finalize();
  return 0;
}
