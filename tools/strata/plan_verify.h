// strata plan --verify: the planner's predictions held against runs of the same layouts here.
#pragma once

#include <string>
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

// Runs `k` probe rows spread over the valid ones (the first, the last and evenly between) the
// same way, fits step = a·model + b·collectives + c·messages + d to them (planner/step_fit.h),
// prints each probe's model, fitted and measured step, and writes the fit for the cluster's
// ranks per node into the profile file `profile_path` (replacing an earlier one for that count).
// Returns the fit.
planner::StepFit fit_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows,
                          int k, int steps, const std::string& profile_path,
                          const std::string& source);

}  // namespace strata::cli
