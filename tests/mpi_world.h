// The MPI world as the multi-rank equivalence tests see it: its size, this rank, and one
// temporary path every rank agrees on (rank 0's process id in it).
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

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

}  // namespace strata::test
