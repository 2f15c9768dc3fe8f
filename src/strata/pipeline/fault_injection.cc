#include "strata/pipeline/fault_injection.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "strata/comm/flight_recorder.h"
#include "strata/comm/heartbeat.h"
#include "strata/core/check.h"

namespace strata::pipeline {

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
