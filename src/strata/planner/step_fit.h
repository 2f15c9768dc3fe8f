// Fitting a step fit (cost/device_profile.h: StepFit) to measured steps: non-negative least squares
// of step = a·model + b·collectives + g·gathers + c·messages + e·kernel calls + h·tp collectives
// beside background reductions + k·contended tp/cp collectives + d over probe layouts,
// each probe's residual relative to its measured step (relative error is what the planner is
// judged by) and weighted by the probe's weight.
#pragma once

#include <vector>

#include "strata/cost/device_profile.h"

namespace strata::planner {

struct StepSample {
  // The planner's, for the probe (Prediction's).
  double model_s = 0, collectives = 0, messages = 0, calls = 0, gathers = 0, tp_beside = 0;
  double contended = 0;
  double measured_s = 0;  // its measured step
  double weight = 1.0;    // its squared relative residual's weight in the fit
};

// The fit with the least weighted sum of squared relative residuals among those with every
// coefficient >= 0 (every subset of the eight terms solved exactly: 255). At least 8 samples with a
// measured step > 0 (an InputError otherwise).
cost::StepFit fit_step(const std::vector<StepSample>& samples, int ranks_per_node);

// The fit's step for a sample.
double fitted_step(const cost::StepFit& f, const StepSample& s);

}  // namespace strata::planner
