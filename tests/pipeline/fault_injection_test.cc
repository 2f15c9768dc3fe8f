// The fault injector (pipeline/fault_injection.h): an injected error fires before exactly one
// action of one step, a kill in exactly one phase of one step (a death test: the child process
// is SIGKILLed), and nothing fires otherwise.
#include "strata/pipeline/fault_injection.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "strata/core/check.h"

namespace strata::pipeline {
namespace {

const Action kForward{Op::Forward, 0, 0, -1};
const Action kBackward{Op::Backward, 1, 0, -1};
const Action kRecv{Op::RecvActivation, 1, 0, 0};

TEST(FaultInjection, ThrowsBeforeTheChosenActionOfTheChosenStep) {
  FaultInjector f;
  f.throw_at(3, 2);
  EXPECT_NO_THROW(f.before_action(2, 2, kForward, 1));  // another step
  EXPECT_NO_THROW(f.before_action(3, 1, kForward, 1));  // another action
  EXPECT_NO_THROW(f.before_action(3, 3, kForward, 1));
  try {
    f.before_action(3, 2, kRecv, 1);
    FAIL() << "no fault";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("injected fault at step 3, action 2 (recv-act 1.0 from 0) of pipeline "
                        "stage 1"),
              std::string::npos)
        << what;
  }
}

TEST(FaultInjection, NoneByDefault) {
  const FaultInjector f;
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 3; ++i) EXPECT_NO_THROW(f.before_action(step, i, kForward, 0));
    for (KillPhase p : {KillPhase::Reduce, KillPhase::Optimizer, KillPhase::Save}) f.at(p, step);
  }
}

TEST(FaultInjection, KillsOnlyInTheChosenPhaseAndStep) {
  FaultInjector f;
  f.kill_at(2, KillPhase::Backward);
  f.before_action(2, 0, kForward, 0);   // the forward phase
  f.before_action(1, 1, kBackward, 0);  // the step before
  f.at(KillPhase::Reduce, 2);
  EXPECT_EXIT(f.before_action(2, 1, kBackward, 0), testing::KilledBySignal(SIGKILL), "");
}

TEST(FaultInjection, KillsAtTheReductionOptimizerAndSave) {
  for (KillPhase p : {KillPhase::Reduce, KillPhase::Optimizer, KillPhase::Save}) {
    FaultInjector f;
    f.kill_at(4, p);
    f.at(p, 3);
    f.before_action(4, 0, kForward, 0);
    EXPECT_EXIT(f.at(p, 4), testing::KilledBySignal(SIGKILL), "");
  }
}

// Hang waits at the reduction only: a forward, the optimizer step, the save and another step's
// reduction go on, and the chosen step's reduction stops alive (the child outlives it until its
// alarm).
TEST(FaultInjection, HangFiresAtTheReductionOnly) {
  FaultInjector f;
  f.kill_at(1, KillPhase::Hang);
  f.before_action(1, 0, kForward, 0);
  f.before_action(1, 1, kBackward, 0);
  f.at(KillPhase::Optimizer, 1);
  f.at(KillPhase::Save, 1);
  f.at(KillPhase::Reduce, 2);
  EXPECT_EXIT(
      {
        alarm(1);
        f.at(KillPhase::Reduce, 1);
      },
      testing::KilledBySignal(SIGALRM), "");
}

// HangForward and HangBackward stop alive (the child outlives them until its alarm) at the
// step's first forward or backward action only.
TEST(FaultInjection, HangForwardAndBackwardStopAtTheirActionOnly) {
  for (KillPhase p : {KillPhase::HangForward, KillPhase::HangBackward}) {
    FaultInjector f;
    f.kill_at(2, p);
    const Action& hit = p == KillPhase::HangForward ? kForward : kBackward;
    const Action& other = p == KillPhase::HangForward ? kBackward : kForward;
    f.before_action(1, 0, hit, 0);  // the step before
    f.before_action(2, 0, other, 0);
    f.before_action(2, 1, kRecv, 0);
    for (KillPhase q : {KillPhase::Reduce, KillPhase::Optimizer, KillPhase::Save}) f.at(q, 2);
    EXPECT_EXIT(
        {
          alarm(1);
          f.before_action(2, 2, hit, 0);
        },
        testing::KilledBySignal(SIGALRM), "");
  }
}

}  // namespace
}  // namespace strata::pipeline
