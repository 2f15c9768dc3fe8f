// The MPI world as the multi-rank equivalence tests see it: its size, this rank, one temporary
// path every rank agrees on (rank 0's process id in it), and a token file written there.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
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

}  // namespace strata::test
