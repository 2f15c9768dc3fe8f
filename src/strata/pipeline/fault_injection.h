// Fault injection (tests, `train --fault`): a failure on purpose at a chosen point of a chosen
// step, as a failing stage or a lost machine would cause one. It lives in pipeline/ because the
// executor asks it before every action of the schedule (the engine asks it at the reduction, the
// optimizer step and the checkpoint save), and because a kill first tells the supervisor through
// comm's heartbeat (comm/heartbeat.h): core/ could not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/pipeline/schedule.h"

namespace strata::pipeline {

// Where an injected kill stops the process: the step's first forward, its first backward, the
// gradient reduction, the optimizer step, or the checkpoint save after it (this rank's data file
// written, the checkpoint not yet committed). Hang stops where the reduction would start without
// dying: the process lives on (its heartbeat too), so only the other ranks' watchdog can tell;
// HangForward and HangBackward stop so before the step's first forward or backward action.
enum class KillPhase {
  None,
  Forward,
  Backward,
  Reduce,
  Optimizer,
  Save,
  Hang,
  HangForward,
  HangBackward
};

// What `train --fault` and `--slow` ask of the job, one rank each (tests):
//   --fault rank=R,step=S,action=N   world rank R throws before its action N of step S;
//   --fault rank=R,step=S,phase=P    world rank R is killed (or hangs, P hang*) in phase P of S;
//   --slow R:SECONDS[:FROM_STEP]     world rank R computes SECONDS longer before each forward from
//                                    step FROM_STEP (default 1) on.
struct FaultPlan {
  int fault_rank = -1;  // -1: no --fault
  int64_t step = 0, action = -1;
  KillPhase phase = KillPhase::None;
  int slow_rank = -1;  // -1: no --slow
  double slow_s = 0.0;
  int64_t slow_from = 1;
};
// Both flags' text parsed ("" for a flag not given); an InputError naming the flag and its form.
FaultPlan parse_fault_plan(const std::string& fault, const std::string& slow);

class FaultInjector {
 public:
  // The injector world rank `rank` runs for `plan` (none where the plan names another rank).
  static FaultInjector for_rank(const FaultPlan& plan, int rank);

  // The step numbered `step` (1-based) throws a runtime Error just before this rank's action
  // number `action` of it. step 0: none.
  void throw_at(int64_t step, size_t action) { throw_step_ = step, throw_action_ = action; }
  // The step numbered `step` kills this process (SIGKILL) in `phase`. step 0 or None: none.
  void kill_at(int64_t step, KillPhase phase) { kill_step_ = step, kill_phase_ = phase; }
  // Every forward of every step from `from_step` on is preceded by `seconds` of busy work on
  // this rank: a straggler made on purpose (slower cores, a throttled chip).
  void slow_from(int64_t from_step, double seconds) { slow_step_ = from_step, slow_s_ = seconds; }

  // Before action number `index` (a) of the step numbered `step`, on pipeline stage `stage`: a
  // Forward kills in the Forward phase, a Backward or BackwardInput in the Backward phase; then
  // the injected error is thrown.
  void before_action(int64_t step, size_t index, const Action& a, int stage) const;
  // Inside action a's timing: a Forward's injected slowness (slow_from).
  void delay(int64_t step, const Action& a) const;
  // At `phase` (Forward, Backward, Reduce, Optimizer or Save) of the step numbered `step`: kills,
  // or hangs forever (Hang at Reduce, HangForward at Forward, HangBackward at Backward).
  void at(KillPhase phase, int64_t step) const;

 private:
  int64_t throw_step_ = 0;
  size_t throw_action_ = 0;
  int64_t kill_step_ = 0;
  KillPhase kill_phase_ = KillPhase::None;
  int64_t slow_step_ = 0;
  double slow_s_ = 0.0;
};

}  // namespace strata::pipeline
