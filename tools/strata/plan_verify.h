// strata plan --verify: the planner's predictions held against runs of the same layouts here.
#pragma once

#include <vector>

#include "strata/planner/search.h"

namespace strata::cli {

// Runs the top `k` valid rows and a sample of the others (every fourth of the rest, up to k more)
// with `strata bench --config` (under mpirun for several ranks) for `steps` timed steps each, and
// prints predicted against measured step time and memory per rank by category, then the median
// and worst step-time errors and how far the planner's first choice is from the fastest
// measured. Rows whose run fails are listed with the failure.
void verify_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows, int k,
                 int steps);

}  // namespace strata::cli
