// Process groups of a rank grid under mpirun: each axis's communicator holds exactly the ranks
// RankGrid says, in coordinate order, and reduces only among them.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/mpi_runtime.h"
#include "strata/comm/topology.h"
#include "strata/core/check.h"

namespace strata::comm {
namespace {

struct Layout {
  int tp, pp;
  const char* order;
};

TEST(ProcessGroups, EachAxisReducesOnlyWithinItsGroup) {
  const int world = world_size(), rank = world_rank();
  const Layout layouts[] = {{2, 1, "tp-dp-pp"},
                            {1, 2, "tp-dp-pp"},
                            {2, 2, "tp-dp-pp"},
                            {2, 1, "dp-tp-pp"},
                            {1, 1, "tp-dp-pp"}};
  int tried = 0;
  for (const Layout& l : layouts) {
    if (world % (l.tp * l.pp) != 0) continue;
    ++tried;
    const RankGrid grid(world, l.tp, l.pp, l.order);
    ProcessGroups groups(grid, MPI_COMM_WORLD);
    const std::string where = grid.describe();
    EXPECT_EQ(groups.coord(), grid.coord(rank));
    EXPECT_EQ(groups.world().size(), world);
    EXPECT_EQ(groups.world().rank(), rank);
    for (Axis a : {Axis::DP, Axis::TP, Axis::PP}) {
      Communicator& c = groups.group(a);
      c.set_timeout(std::chrono::seconds(60));
      EXPECT_EQ(c.name(), axis_name(a));
      EXPECT_EQ(c.size(), grid.size(a)) << axis_name(a) << "\n" << where;
      EXPECT_EQ(c.rank(), grid.coord(rank).at(a)) << axis_name(a) << "\n" << where;
      // Sum of (world rank + 1) over the group, and who is in it, bit by bit.
      float v[2] = {float(rank + 1), 0.0f};
      std::vector<int> members(size_t(c.size()), -1);
      c.all_reduce(v, 1, DType::F32, DType::F32);
      c.all_gather(&rank, members.data(), 1, DType::F32);  // 4-byte ints travel as 4 bytes
      float want = 0;
      for (int r : grid.group_ranks(a, rank)) want += float(r + 1);
      EXPECT_EQ(v[0], want) << axis_name(a) << "\n" << where;
      EXPECT_EQ(members, grid.group_ranks(a, rank)) << axis_name(a) << "\n" << where;
    }
    EXPECT_EQ(&groups.dp(), &groups.group(Axis::DP));
    EXPECT_EQ(&groups.tp(), &groups.group(Axis::TP));
    EXPECT_EQ(&groups.pp(), &groups.group(Axis::PP));
  }
  EXPECT_GE(tried, 2);
}

TEST(ProcessGroups, AGridForAnotherWorldSizeIsAnInputError) {
  const RankGrid grid(world_size() * 2, 1, 1);
  try {
    ProcessGroups groups(grid, MPI_COMM_WORLD);
    FAIL() << "accepted a grid for the wrong number of ranks";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("were launched"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::comm
