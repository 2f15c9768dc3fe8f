#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"

namespace strata::comm {

namespace {

// Tensor-parallel ranks exchange activations every layer: they must share a host. Checked on
// the real placement (host names gathered from every rank), whatever launched the job.
void check_tp_groups_on_one_host(const RankGrid& grid, MPI_Comm world) {
  constexpr int kLen = 256;
  std::string mine = host_name();
  mine.resize(kLen - 1, '\0');
  std::vector<char> all(size_t(grid.world()) * kLen);
  STRATA_MPI_CHECK(MPI_Allgather(mine.c_str(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, world));
  auto host = [&](int r) { return std::string(all.data() + size_t(r) * kLen); };
  for (const std::vector<int>& g : grid.groups(Axis::TP)) {
    for (int r : g) {
      STRATA_INPUT_CHECK(host(r) == host(g.front()), "tensor-parallel group of ranks ", g.front(),
                         "..", g.back(), " spans hosts ", host(g.front()), " and ", host(r),
                         "; give every host a multiple of parallelism.tensor=", grid.tp(),
                         " ranks (slots) or choose an order with tp fastest");
    }
  }
}

}  // namespace

ProcessGroups::ProcessGroups(const RankGrid& grid, MPI_Comm world) : grid_(grid) {
  int rank = 0, size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(world, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(world, &size));
  STRATA_INPUT_CHECK(size == grid.world(), "the rank grid (dp ", grid.dp(), " x cp ", grid.cp(),
                     " x tp ", grid.tp(), " x pp ", grid.pp(), ") needs ", grid.world(),
                     " processes but ", size, " were launched; launch ", grid.world(),
                     " or change parallelism");
  if (grid.tp() > 1) check_tp_groups_on_one_host(grid, world);
  coord_ = grid.coord(rank);
  world_ = std::make_unique<Communicator>(world, "world");
  for (Axis a : {Axis::DP, Axis::TP, Axis::PP, Axis::CP}) {
    // A group is identified by its member with coordinate 0 along a; the key orders members
    // by their coordinate, so group rank == coordinate.
    GridCoord first = coord_;
    first.at(a) = 0;
    MPI_Comm split = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_split(world, grid.rank_of(first), coord_.at(a), &split));
    groups_[int(a)] = std::make_unique<Communicator>(split, axis_name(a));
    MPI_Comm_free(&split);
  }
  if (grid.cp() > 1) {
    GridCoord first = coord_;
    first.dp = first.cp = 0;
    MPI_Comm split = MPI_COMM_NULL;
    STRATA_MPI_CHECK(
        MPI_Comm_split(world, grid.rank_of(first), coord_.dp * grid.cp() + coord_.cp, &split));
    dp_cp_ = std::make_unique<Communicator>(split, "dp-cp");
    MPI_Comm_free(&split);
  }
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace strata::comm
