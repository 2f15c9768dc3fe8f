#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"

namespace strata::comm {

ProcessGroups::ProcessGroups(const RankGrid& grid, MPI_Comm world) : grid_(grid) {
  int rank = 0, size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(world, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(world, &size));
  STRATA_INPUT_CHECK(size == grid.world(), "the rank grid (dp ", grid.dp(), " x tp ", grid.tp(),
                     " x pp ", grid.pp(), ") needs ", grid.world(), " processes but ", size,
                     " were launched; launch ", grid.world(), " or change parallelism");
  coord_ = grid.coord(rank);
  world_ = std::make_unique<Communicator>(world, "world");
  for (Axis a : {Axis::DP, Axis::TP, Axis::PP}) {
    // A group is identified by its member with coordinate 0 along a; the key orders members
    // by their coordinate, so group rank == coordinate.
    GridCoord first = coord_;
    first.at(a) = 0;
    MPI_Comm split = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_split(world, grid.rank_of(first), coord_.at(a), &split));
    groups_[int(a)] = std::make_unique<Communicator>(split, axis_name(a));
    MPI_Comm_free(&split);
  }
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace strata::comm
