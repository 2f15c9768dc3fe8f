#include "strata/planner/step_fit.h"

#include <array>
#include <cmath>
#include <limits>

#include "strata/core/check.h"

namespace strata::planner {

namespace {

constexpr int kTerms = 8;

std::array<double, kTerms> features(const StepSample& s) {
  return {s.model_s, s.collectives, s.messages, s.calls, s.gathers, s.tp_beside, s.contended, 1.0};
}

// Least squares over the terms in `mask` (the others 0), by the normal equations with partial
// pivoting; false when they are singular (a term constant or zero over the samples).
bool solve(const std::vector<StepSample>& samples, unsigned mask, std::array<double, kTerms>& x) {
  std::array<int, kTerms> idx{};
  int n = 0;
  for (int t = 0; t < kTerms; ++t) {
    if (mask & (1u << t)) idx[size_t(n++)] = t;
  }
  double A[kTerms][kTerms + 1] = {};
  for (const StepSample& s : samples) {
    const std::array<double, kTerms> f = features(s);
    const double w = s.weight / (s.measured_s * s.measured_s);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j)
        A[i][j] += w * f[size_t(idx[size_t(i)])] * f[size_t(idx[size_t(j)])];
      A[i][n] += w * f[size_t(idx[size_t(i)])] * s.measured_s;
    }
  }
  for (int c = 0; c < n; ++c) {
    int piv = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::fabs(A[r][c]) > std::fabs(A[piv][c])) piv = r;
    }
    if (std::fabs(A[piv][c]) < 1e-300) return false;
    for (int k = 0; k <= n; ++k) std::swap(A[c][k], A[piv][k]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double m = A[r][c] / A[c][c];
      for (int k = c; k <= n; ++k) A[r][k] -= m * A[c][k];
    }
  }
  x.fill(0.0);
  for (int i = 0; i < n; ++i) {
    const double v = A[i][n] / A[i][i];
    if (!std::isfinite(v)) return false;
    x[size_t(idx[size_t(i)])] = v;
  }
  return true;
}

}  // namespace

double fitted_step(const cost::StepFit& f, const StepSample& s) {
  return f.model_scale * s.model_s + f.per_collective_s * s.collectives +
         f.per_message_s * s.messages + f.per_call_s * s.calls + f.per_gather_s * s.gathers +
         f.per_tp_beside_s * s.tp_beside + f.per_contended_s * s.contended + f.per_step_s;
}

cost::StepFit fit_step(const std::vector<StepSample>& samples, int ranks_per_node) {
  STRATA_INPUT_CHECK(samples.size() >= size_t(kTerms), "a step fit needs at least ", kTerms,
                     " measured probes, got ", samples.size(),
                     "; give --fit a larger K (or fix the probes that failed)");
  for (const StepSample& s : samples) {
    STRATA_CHECK(s.measured_s > 0 && s.model_s >= 0 && s.weight > 0,
                 "a probe without a measured step or a weight");
  }
  double best = std::numeric_limits<double>::infinity();
  std::array<double, kTerms> best_x{};
  for (unsigned mask = 1; mask < (1u << kTerms); ++mask) {
    std::array<double, kTerms> x{};
    if (!solve(samples, mask, x)) continue;
    bool feasible = true;
    for (double v : x) feasible = feasible && v >= 0.0;
    if (!feasible) continue;
    double r = 0.0;
    for (const StepSample& s : samples) {
      const std::array<double, kTerms> f = features(s);
      double y = 0.0;
      for (int t = 0; t < kTerms; ++t) y += x[size_t(t)] * f[size_t(t)];
      r += s.weight * std::pow((y - s.measured_s) / s.measured_s, 2);
    }
    if (r < best) best = r, best_x = x;
  }
  STRATA_CHECK(std::isfinite(best), "no non-negative step fit exists for these probes");
  cost::StepFit f;
  f.ranks_per_node = ranks_per_node;
  f.model_scale = best_x[0];
  f.per_collective_s = best_x[1];
  f.per_message_s = best_x[2];
  f.per_call_s = best_x[3];
  f.per_gather_s = best_x[4];
  f.per_tp_beside_s = best_x[5];
  f.per_contended_s = best_x[6];
  f.per_step_s = best_x[7];
  f.probes = int(samples.size());
  return f;
}

}  // namespace strata::planner
