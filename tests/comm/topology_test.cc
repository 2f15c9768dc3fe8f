#include "strata/comm/topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "strata/core/check.h"

namespace strata::comm {
namespace {

TEST(RankGrid, MegatronOrderPutsTpFastestThenDpThenPp) {
  RankGrid g(16, 2, 2);  // dp 4
  EXPECT_EQ(g.dp(), 4);
  EXPECT_EQ(g.tp(), 2);
  EXPECT_EQ(g.pp(), 2);
  EXPECT_EQ(g.order(), "tp-dp-pp");
  for (int r = 0; r < 16; ++r) {
    const GridCoord c = g.coord(r);
    EXPECT_EQ(r, c.tp + 2 * (c.dp + 4 * c.pp)) << r;
    EXPECT_EQ(g.rank_of(c), r);
  }
  EXPECT_EQ(g.coord(7), (GridCoord{.dp = 3, .tp = 1, .pp = 0}));
  EXPECT_EQ(g.group_ranks(Axis::TP, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.group_ranks(Axis::DP, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.group_ranks(Axis::PP, 5), (std::vector<int>{5, 13}));
}

TEST(RankGrid, EveryOrderIsABijectionWithTheStatedStrides) {
  const std::vector<std::string> orders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                           "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
  for (const std::string& order : orders) {
    RankGrid g(24, 2, 3, order);  // dp 4
    std::set<int> seen;
    for (int r = 0; r < 24; ++r) {
      const GridCoord c = g.coord(r);
      EXPECT_EQ(g.rank_of(c), r) << order;
      seen.insert(g.rank_of(c));
    }
    EXPECT_EQ(seen.size(), 24u) << order;
    // The first axis of the order varies fastest: rank 1 is one step along it.
    const GridCoord c1 = g.coord(1);
    const std::string first = order.substr(0, 2);
    EXPECT_EQ(c1.at(first == "tp" ? Axis::TP : first == "dp" ? Axis::DP : Axis::PP), 1) << order;
  }
  RankGrid g(8, 2, 2, "dp-tp-pp");  // rank = dp + 2 * (tp + 2 * pp)
  EXPECT_EQ(g.coord(6), (GridCoord{.dp = 0, .tp = 1, .pp = 1}));
  EXPECT_EQ(g.group_ranks(Axis::TP, 0), (std::vector<int>{0, 2}));
}

TEST(RankGrid, GroupsPartitionTheRanksAndAgreeWithGroupRanks) {
  RankGrid g(24, 2, 3);
  for (Axis a : {Axis::DP, Axis::TP, Axis::PP}) {
    const auto groups = g.groups(a);
    EXPECT_EQ(int(groups.size()), 24 / g.size(a)) << axis_name(a);
    std::vector<int> all;
    for (const auto& grp : groups) {
      EXPECT_EQ(int(grp.size()), g.size(a));
      for (size_t i = 0; i < grp.size(); ++i) {
        EXPECT_EQ(g.group_ranks(a, grp[i]), grp);
        EXPECT_EQ(g.coord(grp[i]).at(a), int(i));  // group rank == coordinate
        // Members differ only along a.
        GridCoord c = g.coord(grp[i]), c0 = g.coord(grp[0]);
        c.at(a) = c0.at(a) = 0;
        EXPECT_EQ(c, c0);
      }
      all.insert(all.end(), grp.begin(), grp.end());
    }
    std::sort(all.begin(), all.end());
    for (int r = 0; r < 24; ++r) EXPECT_EQ(all[size_t(r)], r);
  }
}

TEST(RankGrid, SizesThatDoNotFitAreInputErrorsWithAFix) {
  try {
    RankGrid g(6, 2, 2);
    FAIL() << "accepted world 6 with tp 2 x pp 2";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("world size 6"), std::string::npos) << m;
    EXPECT_NE(m.find("tp=2"), std::string::npos) << m;
    EXPECT_NE(m.find("pp=2"), std::string::npos) << m;
    EXPECT_NE(m.find("multiple of 4"), std::string::npos) << m;
  }
  EXPECT_THROW(RankGrid(4, 0, 1), InputError);
  EXPECT_THROW(RankGrid(4, 1, -1), InputError);
  EXPECT_THROW(RankGrid(0, 1, 1), InputError);
  for (const char* bad :
       {"tp-dp", "tp-dp-dp", "tp-dp-pp-", "tp-dp-xx", "", "tp_dp_pp", "tp-dp-pp-tp"}) {
    EXPECT_THROW(RankGrid(4, 1, 1, bad), InputError) << bad;
  }
  EXPECT_THROW(RankGrid(4, 2, 1).coord(4), Error);
}

TEST(RankGrid, DescribeListsEveryRankAndTheGroups) {
  const std::string d = RankGrid(8, 2, 2).describe();
  EXPECT_NE(d.find("8 ranks = dp 2 x tp 2 x pp 2, order tp-dp-pp"), std::string::npos) << d;
  EXPECT_NE(d.find("   7     1     1     1\n"), std::string::npos) << d;
  EXPECT_NE(d.find("tp groups (4 of 2): [0 1] [2 3] [4 5] [6 7]"), std::string::npos) << d;
  EXPECT_NE(d.find("dp groups (4 of 2): [0 2] [1 3] [4 6] [5 7]"), std::string::npos) << d;
  EXPECT_NE(d.find("pp groups (4 of 2): [0 4] [1 5] [2 6] [3 7]"), std::string::npos) << d;
}

TEST(TpWithinHosts, AcceptsGroupsInsideHostsAndNamesTheOneThatSpans) {
  const std::vector<std::pair<std::string, int>> two_by_four = {{"a", 4}, {"b", 4}};
  EXPECT_NO_THROW(check_tp_within_hosts(RankGrid(8, 4, 1), two_by_four));
  EXPECT_NO_THROW(check_tp_within_hosts(RankGrid(8, 2, 2), two_by_four));
  // 3 + 5 slots: the tp group {2,3} straddles a and b.
  try {
    check_tp_within_hosts(RankGrid(8, 2, 1), {{"a", 3}, {"b", 5}});
    FAIL() << "accepted a tp group across hosts";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor-parallel group {2,3} spans hosts a and b"), std::string::npos) << m;
    EXPECT_NE(m.find("multiple of tp=2"), std::string::npos) << m;
  }
  // tp not fastest-varying: tp groups are strided across hosts.
  EXPECT_THROW(check_tp_within_hosts(RankGrid(8, 4, 1, "dp-tp-pp"), two_by_four), InputError);
  // Too few slots.
  try {
    check_tp_within_hosts(RankGrid(8, 2, 1), {{"a", 2}, {"b", 2}});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("4 slots for 8 ranks"), std::string::npos) << e.what();
  }
  // Extra slots are fine: ranks fill hosts in order.
  EXPECT_NO_THROW(check_tp_within_hosts(RankGrid(4, 4, 1), {{"a", 8}, {"b", 8}}));
}

}  // namespace
}  // namespace strata::comm
