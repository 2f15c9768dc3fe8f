// StragglerWatch::analyse on made-up phase times, without MPI: the window's statistics, the
// per-rank step and busy times strata report plots, and the slow rank.
#include "strata/monitor/stragglers.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata {
namespace {

TEST(Stragglers, AnalyseCarriesPerRankTimes) {
  StragglerWatch w({4, 0.2, 2, 600}, MPI_COMM_NULL, {"a", "b", "c"});
  const size_t k = straggler_phases().size();
  ASSERT_EQ(straggler_phases().front(), "step_s");
  ASSERT_EQ(straggler_phases().back(), "busy_s");
  // Sums over 4 steps: rank 2 is busy twice as long; every rank's step takes about as long.
  std::vector<std::vector<double>> sums(3, std::vector<double>(k, 0.0));
  const double step[3] = {0.40, 0.41, 0.42}, busy[3] = {0.20, 0.21, 0.40};
  for (size_t r = 0; r < 3; ++r) sums[r][0] = step[r], sums[r][k - 1] = busy[r];
  const StragglerReport rep = w.analyse(sums, 4, 8);
  const nlohmann::json& j = rep.stats;
  EXPECT_EQ(j["steps"], nlohmann::json({5, 8}));
  ASSERT_TRUE(j.contains("per_rank")) << j.dump();
  const std::vector<double> st = j["per_rank"]["step_time_s"], bs = j["per_rank"]["busy_s"];
  ASSERT_EQ(st.size(), 3u);
  ASSERT_EQ(bs.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_DOUBLE_EQ(st[r], step[r] / 4);
    EXPECT_DOUBLE_EQ(bs[r], busy[r] / 4);
  }
  EXPECT_DOUBLE_EQ(j["per_step"]["busy_s"]["max"].get<double>(), 0.10);
  EXPECT_EQ(j["per_step"]["busy_s"]["slowest_rank"], 2);
  EXPECT_EQ(j["slow_ranks"], nlohmann::json({2}));
}

}  // namespace
}  // namespace strata
