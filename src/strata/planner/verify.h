// strata plan --verify and --fit: the planner's predictions held against runs of the same
// layouts here, the step's overheads fitted to probe runs, and the calibration a first CPU plan
// runs.
#pragma once

#include <string>
#include <vector>

#include "strata/planner/search.h"

namespace strata::planner {

// Runs the top `k` valid rows and a sample of the others (every fourth of the rest, up to k more)
// with `strata bench --config` (under mpirun for several ranks) for `steps` timed steps each,
// `repeats` times in passes over all of them (each layout's step: the median of its runs'), and
// prints predicted against measured step time and memory per rank by category, then the median
// and worst step-time errors and how far the planner's first choice is from the fastest
// measured. Rows whose run fails are listed with the failure.
// Rows a layout also probed by the fit at the config's batch (`probes`) are marked as such and
// counted in the summary.
void verify_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows, int k,
                 int steps, int repeats, const std::vector<planner::Candidate>& probes = {});

// Measures this machine into the CPU profile `path` at the shapes of the model of `config` (a
// config file): `strata bench --calibrate` on 2 local ranks (1 on a one-core machine), which
// `strata plan --device cpu` runs where the profile does not exist yet, saying so. An input error
// where the profile cannot be written; a runtime error where the measurement fails.
void calibrate_for_plan(const std::string& config, const std::string& path);

// The rows verify_plan(rows, k) runs: the top k valid ones, then every fourth of the rest (up to
// k more).
std::vector<size_t> verify_rows(const std::vector<planner::Row>& rows, int k);

// Runs `k` probe rows the same way, 3/4 at the config's global batch and 1/4 at half of it;
// at each, half spread over the whole ranking (the first, the last and evenly between) and half
// over its leading rows, at the config's batch leaving out verify_rows(rows, verify_k); run as
// verify_plan runs its rows. Fits the step to them (planner/step_fit.h; a probe from a ranking's
// leading rows weighs ten times another), prints each probe's model, fitted and measured step, and
// writes the fit for the cluster's ranks per node into the profile file `profile_path`
// (replacing an earlier one for that count). Returns the fit; `probed` (optional) gets the
// layouts probed at the config's batch.
cost::StepFit fit_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows, int k,
                       int steps, int repeats, const std::string& profile_path,
                       const std::string& source, int verify_k = 0,
                       std::vector<planner::Candidate>* probed = nullptr);

}  // namespace strata::planner
