#include "strata/monitor/stragglers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "strata/comm/flight_recorder.h"
#include "strata/core/check.h"

namespace strata {

const std::vector<std::string>& straggler_phases() {
  static const std::vector<std::string> p = {
      "step_s",    "forward_s",       "backward_s",  "comm_exposed_s", "gather_exposed_s",
      "tp_comm_s", "pipeline_wait_s", "optimizer_s", "ep_comm_s",      "busy_s"};
  return p;
}

namespace {

std::vector<double> phase_values(const StepMetrics& s) {
  // Waiting in collectives is not work: a rank that waits for a slow one is not slow itself.
  const double ep = std::max(0.0, s.ep_comm_s);
  const double waits = s.comm_exposed_s + s.gather_exposed_s + s.tp_comm_s + s.pipeline_wait_s + ep;
  return {s.seconds,
          s.forward_s,
          s.backward_s,
          s.comm_exposed_s,
          s.gather_exposed_s,
          s.tp_comm_s,
          s.pipeline_wait_s,
          s.optimizer_s,
          ep,
          std::max(0.0, s.seconds - waits)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

StragglerWatch::StragglerWatch(const StragglerOptions& o, MPI_Comm world,
                               std::vector<std::string> rank_names)
    : o_(o), world_(world), names_(std::move(rank_names)), sums_(straggler_phases().size(), 0.0) {
  if (world_ != MPI_COMM_NULL) flight_group_ = comm::flight::register_group("stragglers", world_);
}

std::optional<StragglerReport> StragglerWatch::step_done(const StepMetrics& s) {
  if (o_.interval <= 0 || world_ == MPI_COMM_NULL) return std::nullopt;
  const std::vector<double> v = phase_values(s);
  for (size_t i = 0; i < v.size(); ++i) sums_[i] += v[i];
  if (++steps_ < o_.interval) return std::nullopt;
  int rank = 0, size = 1;
  MPI_Comm_rank(world_, &rank);
  MPI_Comm_size(world_, &size);
  const int k = int(sums_.size());
  std::vector<double> all(rank == 0 ? size_t(size) * size_t(k) : 0);
  // Without blocking forever: a rank that never comes (hung, not dead) ends the job here with a
  // message, as the communicator's watchdog would in a collective.
  MPI_Request req;
  const uint64_t id = comm::flight::issue(flight_group_, comm::flight::Kind::Collective, "gather",
                                          0, 0, sums_.size() * sizeof(double));
  comm::flight::start(id);
  MPI_Igather(sums_.data(), k, MPI_DOUBLE, all.data(), k, MPI_DOUBLE, 0, world_, &req);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o_.timeout_s);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      comm::flight::mark_stuck(id);
      STRATA_RUNTIME_FAIL("rank ", rank, " waited over parallelism.timeout_s = ", o_.timeout_s,
                          " s for the other ranks' phase times after step ", s.step,
                          " (train.straggler_interval): a rank has stopped");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  comm::flight::complete(id);
  const int64_t steps = steps_;
  std::fill(sums_.begin(), sums_.end(), 0.0);
  steps_ = 0;
  if (rank != 0) return std::nullopt;
  std::vector<std::vector<double>> per_rank(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    per_rank[size_t(r)].assign(all.begin() + r * k, all.begin() + (r + 1) * k);
  }
  return analyse(per_rank, steps, s.step);
}

StragglerReport StragglerWatch::analyse(const std::vector<std::vector<double>>& per_rank,
                                        int64_t steps, int64_t last_step) {
  const std::vector<std::string>& phases = straggler_phases();
  const size_t n = per_rank.size();
  streak_.resize(n, 0);
  StragglerReport r;
  nlohmann::json& j = r.stats;
  j["steps"] = {last_step - steps + 1, last_step};
  nlohmann::json ph = nlohmann::json::object();
  std::vector<double> med(phases.size());
  for (size_t p = 0; p < phases.size(); ++p) {
    std::vector<double> col(n);
    for (size_t q = 0; q < n; ++q) col[q] = per_rank[q][p] / double(steps);
    const auto mx = std::max_element(col.begin(), col.end());
    med[p] = median(col);
    ph[phases[p]] = {{"min", *std::min_element(col.begin(), col.end())},
                     {"median", med[p]},
                     {"max", *mx},
                     {"slowest_rank", int(mx - col.begin())}};
  }
  j["per_step"] = ph;
  const size_t busy = phases.size() - 1;
  // Each rank's step and busy seconds per step, by rank (strata report plots them).
  std::vector<double> step_s(n), busy_s(n);
  for (size_t q = 0; q < n; ++q) {
    step_s[q] = per_rank[q][0] / double(steps);
    busy_s[q] = per_rank[q][busy] / double(steps);
  }
  j["per_rank"] = {{"step_time_s", step_s}, {"busy_s", busy_s}};
  std::vector<int> slow;
  for (size_t q = 0; q < n; ++q) {
    const double b = per_rank[q][busy] / double(steps);
    // A floor — 5% of the median step, 1 ms at least — keeps the noise of short steps and the
    // waits no phase counts (the tied embeddings' pipeline all-reduce) from naming anyone: what
    // the floor hides costs the job under 5% of its time.
    const bool is_slow = b - med[busy] > std::max({o_.threshold * med[busy], 0.05 * med[0], 1e-3});
    streak_[q] = is_slow ? streak_[q] + 1 : 0;
    if (is_slow) slow.push_back(int(q));
    if (!is_slow || streak_[q] < o_.patience) continue;
    // The compute phase where this rank loses the most against the median.
    size_t worst = 1;
    double lost = -1e300;
    for (size_t p : {size_t(1), size_t(2), size_t(7)}) {
      const double d = per_rank[q][p] / double(steps) - med[p];
      if (d > lost) lost = d, worst = p;
    }
    char line[400];
    std::snprintf(line, sizeof line,
                  "straggler: rank %zu (%s) busy %.4f s per step against the median %.4f s "
                  "(+%.0f%%) for %lld windows of %lld steps in a row, steps %lld-%lld; most in "
                  "%s (+%.4f s per step)",
                  q, q < names_.size() ? names_[q].c_str() : "?", b, med[busy],
                  100.0 * (b / med[busy] - 1.0), static_cast<long long>(streak_[q]),
                  static_cast<long long>(steps), static_cast<long long>(last_step - steps + 1),
                  static_cast<long long>(last_step), phases[worst].c_str(), lost);
    r.named.push_back(line);
  }
  j["slow_ranks"] = slow;
  return r;
}

}  // namespace strata
