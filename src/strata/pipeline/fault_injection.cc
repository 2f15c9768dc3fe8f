#include "strata/pipeline/fault_injection.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/comm/flight_recorder.h"
#include "strata/comm/heartbeat.h"
#include "strata/core/check.h"

namespace strata::pipeline {

namespace {

// An integer >= lo, or nullopt.
std::optional<int64_t> integer(const std::string& text, int64_t lo) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo) return std::nullopt;
  return v;
}

// text split at `sep`.
std::vector<std::string> fields(const std::string& text, char sep) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find(sep, at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

constexpr std::pair<const char*, KillPhase> kPhases[] = {
    {"forward", KillPhase::Forward},
    {"backward", KillPhase::Backward},
    {"reduce", KillPhase::Reduce},
    {"optimizer", KillPhase::Optimizer},
    {"save", KillPhase::Save},
    {"hang", KillPhase::Hang},
    {"hang-forward", KillPhase::HangForward},
    {"hang-backward", KillPhase::HangBackward}};

void parse_fault(const std::string& s, FaultPlan& p) {
  const char* usage =
      ": expected rank=R,step=S,action=N or rank=R,step=S,phase=P (R, N >= 0, S >= 1; P one of "
      "forward, backward, reduce, optimizer, save, or hang, hang-forward, hang-backward: stop "
      "alive before the reduction, the first forward or the first backward)";
  bool rank = false, step = false;
  for (const std::string& item : fields(s, ',')) {
    const size_t eq = item.find('=');
    STRATA_INPUT_CHECK(eq != std::string::npos, "--fault ", s, usage);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "phase") {
      for (const auto& [name, phase] : kPhases) {
        if (value == name) p.phase = phase;
      }
      STRATA_INPUT_CHECK(p.phase != KillPhase::None, "--fault ", s, usage);
      continue;
    }
    const std::optional<int64_t> v = integer(value, 0);
    STRATA_INPUT_CHECK(v && (key == "rank" || key == "step" || key == "action"), "--fault ", s,
                       usage);
    if (key == "rank") p.fault_rank = int(*v), rank = true;
    if (key == "step") p.step = *v, step = true;
    if (key == "action") p.action = *v;
  }
  const bool one = (p.action >= 0) != (p.phase != KillPhase::None);
  STRATA_INPUT_CHECK(rank && step && p.step >= 1 && one, "--fault ", s, usage);
}

void parse_slow(const std::string& s, FaultPlan& p) {
  const std::vector<std::string> f = fields(s, ':');
  const std::optional<int64_t> rank = integer(f[0], 0);
  char* end = nullptr;
  const double secs = f.size() >= 2 ? std::strtod(f[1].c_str(), &end) : -1.0;
  const bool secs_ok = f.size() >= 2 && !f[1].empty() && *end == '\0' && secs >= 0 && secs <= 60;
  const std::optional<int64_t> from = f.size() == 3 ? integer(f[2], 1) : std::optional<int64_t>(1);
  STRATA_INPUT_CHECK((f.size() == 2 || f.size() == 3) && rank && secs_ok && from, "--slow ", s,
                     ": expected R:SECONDS or R:SECONDS:FROM_STEP (R >= 0, 0 <= SECONDS <= 60, "
                     "FROM_STEP >= 1), e.g. --slow 1:0.05");
  p.slow_rank = int(*rank), p.slow_s = secs, p.slow_from = *from;
}

}  // namespace

FaultPlan parse_fault_plan(const std::string& fault, const std::string& slow) {
  FaultPlan p;
  if (!fault.empty()) parse_fault(fault, p);
  if (!slow.empty()) parse_slow(slow, p);
  return p;
}

FaultInjector FaultInjector::for_rank(const FaultPlan& plan, int rank) {
  FaultInjector f;
  if (plan.fault_rank == rank) {
    if (plan.action >= 0) f.throw_at(plan.step, size_t(plan.action));
    f.kill_at(plan.step, plan.phase);
  }
  if (plan.slow_rank == rank) f.slow_from(plan.slow_from, plan.slow_s);
  return f;
}

void FaultInjector::before_action(int64_t step, size_t index, const Action& a, int stage) const {
  if (a.op == Op::Forward) at(KillPhase::Forward, step);
  if (a.op == Op::Backward || a.op == Op::BackwardInput) at(KillPhase::Backward, step);
  if (throw_step_ > 0 && step == throw_step_ && index == throw_action_) {
    STRATA_RUNTIME_FAIL("injected fault at step ", throw_step_, ", action ", throw_action_, " (",
                        action_name(a), ") of pipeline stage ", stage);
  }
}

void FaultInjector::delay(int64_t step, const Action& a) const {
  if (a.op != Op::Forward || slow_step_ <= 0 || step < slow_step_) return;
  // Busy, not asleep: the time counts as this rank's forward, as a slow chip's would.
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(slow_s_);
  while (std::chrono::steady_clock::now() < until) {
  }
}

void FaultInjector::at(KillPhase phase, int64_t step) const {
  const KillPhase hang_at = kill_phase_ == KillPhase::Hang           ? KillPhase::Reduce
                            : kill_phase_ == KillPhase::HangForward  ? KillPhase::Forward
                            : kill_phase_ == KillPhase::HangBackward ? KillPhase::Backward
                                                                     : KillPhase::None;
  const bool hang = hang_at != KillPhase::None && phase == hang_at;
  if ((phase != kill_phase_ && !hang) || step != kill_step_) return;
  static constexpr const char* kNames[] = {"none",   "forward",      "backward",
                                           "reduce", "optimizer",    "save",
                                           "hang",   "hang-forward", "hang-backward"};
  comm::heartbeat_fault(kNames[int(kill_phase_)]);
  std::fflush(stdout);
  std::fflush(stderr);
  if (hang) {
    comm::flight::set_activity(step,
                               std::string("injected hang (") + kNames[int(kill_phase_)] + ")");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  ::kill(::getpid(), SIGKILL);
}

}  // namespace strata::pipeline
