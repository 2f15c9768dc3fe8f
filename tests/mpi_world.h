// The MPI world as the multi-rank equivalence tests see it: its size, this rank, one temporary
// path every rank agrees on (rank 0's process id in it), and a token file written there.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"

namespace strata::test {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// <temp dir>/<prefix><rank 0's pid><suffix>, the same on every rank (a collective).
inline std::string shared_temp_path(const std::string& prefix, const std::string& suffix = "") {
  char name[512] = {};
  std::snprintf(
      name, sizeof name, "%s",
      (std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + suffix))
          .c_str());
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

// `n` token ids uniform in [0, vocab) (rng_key(seed, name)), written by rank 0 as an llm.c shard
// at shared_temp_path(prefix, ".bin"); returns that path once every rank can read it (a
// collective).
inline std::string shared_token_file(const std::string& prefix, size_t n, uint64_t seed,
                                     std::string_view name, int vocab) {
  const std::string path = shared_temp_path(prefix, ".bin");
  if (world_rank() == 0) {
    std::vector<int32_t> tokens(n);
    const uint64_t key = rng_key(seed, name);
    for (size_t i = 0; i < n; ++i) tokens[i] = int32_t(rng_uniform(key, i) * vocab) % vocab;
    data::write_llmc_shard(path, tokens, false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// Waits for a non-blocking MPI request, sleeping between tests instead of spinning, so that ranks
// oversubscribing the cores leave them to the ranks still computing.
inline void wait_sleeping(MPI_Request& r) {
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The results of `jobs` independent computations every rank needs (the single-process
// references a multi-rank test compares with), shared out instead of repeated: rank r computes
// jobs r, r + P, r + 2P, ... (run(i): job i's result, `n` doubles), then each is broadcast from
// the rank that computed it, the others waiting asleep. A collective; every rank passes the same
// jobs.
inline std::vector<std::vector<double>> shared_out(
    size_t jobs, size_t n, const std::function<std::vector<double>(size_t)>& run) {
  const int P = world_size(), me = world_rank();
  std::vector<std::vector<double>> out(jobs, std::vector<double>(n, 0.0));
  for (size_t i = size_t(me); i < jobs; i += size_t(P)) out[i] = run(i);
  for (size_t i = 0; i < jobs; ++i) {
    MPI_Request r;
    MPI_Ibcast(out[i].data(), int(n), MPI_DOUBLE, int(i % size_t(P)), MPI_COMM_WORLD, &r);
    wait_sleeping(r);
  }
  return out;
}

}  // namespace strata::test
