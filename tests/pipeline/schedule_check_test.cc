// The checker catches broken lists, each with a message naming the stage, the position and the
// action; the Chrome trace is valid JSON with one event per compute action.
#include "strata/pipeline/schedule_check.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/pipeline/schedule.h"

namespace strata::pipeline {
namespace {

using Lists = std::vector<std::vector<Action>>;

// The message check() throws for the lists ("" if none).
std::string error_of(const ScheduleSpec& s, const Lists& lists, int max_in_flight = 0) {
  try {
    check(s, lists, {}, max_in_flight);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

size_t position(const std::vector<Action>& list, const Action& a) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == a) return i;
  }
  ADD_FAILURE() << "no " << action_name(a) << " in the list";
  return 0;
}

TEST(ScheduleCheck, GeneratedListsPass) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  EXPECT_EQ(error_of(s, generate(s)), "");
}

TEST(ScheduleCheck, MissingReceive) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  ASSERT_EQ(l[1][0], (Action{Op::RecvActivation, 0, 0, 0}));
  l[1].erase(l[1].begin());
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 1, action 0 (F0.0)");
  EXPECT_HAS(e,
             "before its activation was received: no RecvActivation of micro-batch 0 chunk 0 "
             "from stage 0");
}

TEST(ScheduleCheck, SendWithoutReceive) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  const Action send{Op::SendActivation, 1, 0, 1};
  const size_t at = position(l[0], send);
  l[0].insert(l[0].begin() + long(at) + 1, send);  // the same message twice
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 0, action " + std::to_string(at + 1) + " (send-act 1.0 to 1)");
  EXPECT_HAS(e, "send without a receive: this message is sent 2 times but received 1 time(s)");
}

TEST(ScheduleCheck, ReceiveWithoutSend) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  const Action recv{Op::RecvGradient, 0, 0, 1};
  const size_t at = position(l[0], recv);
  l[0].insert(l[0].begin() + long(at) + 1, recv);
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 0, action " + std::to_string(at + 1) + " (recv-grad 0.0 from 1)");
  EXPECT_HAS(e, "receive without a send");
}

TEST(ScheduleCheck, DeadlockWhenBothStagesReceiveFirst) {
  // Stage 0 waits for micro-batch 0's gradient before sending its activation; stage 1 waits for
  // that activation.
  const ScheduleSpec s{ScheduleKind::GPipe, 2, 1, 1};
  Lists l = generate(s);
  ASSERT_EQ(l[0][1], (Action{Op::SendActivation, 0, 0, 1}));
  std::swap(l[0][1], l[0][2]);
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "deadlock");
  EXPECT_HAS(e,
             "stage 0 waits at action 1 (recv-grad 0.0 from 1) for stage 1's action 3 "
             "(send-grad 0.0 to 0)");
  EXPECT_HAS(e,
             "stage 1 waits at action 0 (recv-act 0.0 from 0) for stage 0's action 2 "
             "(send-act 0.0 to 1)");
}

TEST(ScheduleCheck, DeadlockAcrossFourStages) {
  // 1F1B where stage 1 waits for micro-batch 0's gradient before sending micro-batch 1's
  // activation, which stage 2 needs before the backward that sends that gradient.
  const ScheduleSpec s{ScheduleKind::OneFOneB, 4, 4, 1};
  Lists l = generate(s);
  auto& st1 = l[1];
  const size_t send = position(st1, {Op::SendActivation, 1, 0, 2});
  const size_t recv = position(st1, {Op::RecvGradient, 0, 0, 2});
  ASSERT_LT(send, recv);
  const Action moved = st1[send];
  st1.erase(st1.begin() + long(send));
  st1.insert(st1.begin() + long(recv), moved);  // now right after the receive
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "deadlock");
  EXPECT_HAS(e, "stage 0 waits at action");
  EXPECT_HAS(e, "stage 1 waits at action " + std::to_string(recv - 1) + " (recv-grad 0.0 from 2)");
  EXPECT_HAS(e, "(recv-act 1.0 from 1) for stage 1's action " + std::to_string(recv));
  EXPECT_HAS(e, "stage 3 waits at action");
}

TEST(ScheduleCheck, BackwardBeforeForward) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  ASSERT_EQ(l[1][1], (Action{Op::Forward, 0, 0, -1}));
  ASSERT_EQ(l[1][2], (Action{Op::Backward, 0, 0, -1}));
  std::swap(l[1][1], l[1][2]);
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 1, action 1 (B0.0): Backward before its Forward on this stage");
}

TEST(ScheduleCheck, DuplicatedForward) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  ASSERT_EQ(l[0][0], (Action{Op::Forward, 0, 0, -1}));
  l[0].insert(l[0].begin() + 1, l[0][0]);
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 0, action 1 (F0.0): duplicated Forward (first at action 0)");
}

TEST(ScheduleCheck, WeightGradientBeforeInputGradient) {
  const ScheduleSpec s{ScheduleKind::ZeroBubble, 2, 2, 1};
  Lists l = generate(s);
  const size_t b = position(l[1], {Op::BackwardInput, 0, 0, -1});
  const size_t w = position(l[1], {Op::BackwardWeight, 0, 0, -1});
  const Action weight = l[1][w];
  l[1].erase(l[1].begin() + long(w));
  l[1].insert(l[1].begin() + long(b), weight);
  const std::string e = error_of(s, l);
  EXPECT_HAS(e, "stage 1, action " + std::to_string(b) +
                    " (W0.0): BackwardWeight before its BackwardInput on this stage");
}

TEST(ScheduleCheck, MissingWeightGradient) {
  const ScheduleSpec s{ScheduleKind::ZeroBubble, 2, 2, 1};
  Lists l = generate(s);
  l[0].erase(l[0].begin() + long(position(l[0], {Op::BackwardWeight, 1, 0, -1})));
  EXPECT_HAS(error_of(s, l),
             "stage 0: micro-batch 1 chunk 0 has a BackwardInput but no BackwardWeight");
}

TEST(ScheduleCheck, ExceededMaxInFlight) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 4, 8, 1};
  const Lists l = generate(s);
  EXPECT_EQ(error_of(s, l, 4), "");
  const std::string e = error_of(s, l, 3);
  EXPECT_HAS(e, "stage 0, action 6 (F3.0): 4 micro-batch chunks in flight");
  EXPECT_HAS(e, "over the bound 3");
  // GPipe holds every micro-batch.
  const ScheduleSpec g{ScheduleKind::GPipe, 4, 8, 1};
  EXPECT_HAS(error_of(g, generate(g), 4), "5 micro-batch chunks in flight");
}

TEST(ScheduleCheck, WrongPeerAndNeighbours) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 4, 4, 1};
  Lists l = generate(s);
  l[0][1].peer = 2;  // F0's send goes to stage 1
  EXPECT_HAS(error_of(s, l), "stage 0, action 1 (send-act 0.0 to 2): the peer must be stage 1");
  l = generate(s);
  l[0].insert(l[0].begin(), {Op::RecvActivation, 0, 0, 3});
  EXPECT_HAS(error_of(s, l), "the first model chunk reads token ids; it receives no activation");
  l = generate(s);
  l[3].push_back({Op::SendActivation, 0, 0, 0});
  EXPECT_HAS(error_of(s, l), "the last model chunk computes the loss; it sends no activation");
}

TEST(ScheduleCheck, OutOfRangeAndWrongListCount) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 2, 1};
  Lists l = generate(s);
  l[0][0].micro = 2;
  EXPECT_HAS(error_of(s, l), "micro-batch 2 is out of range 0..1");
  l = generate(s);
  l.pop_back();
  EXPECT_HAS(error_of(s, l), "1 action lists for 2 stages");
}

TEST(ScheduleCheck, TimelineTimes) {
  // p = 2, m = 1, GPipe, F = 1, B = W = 1: stage 0 F [0,1), stage 1 F [1,2) B [2,4), stage 0 B
  // [4,6).
  const ScheduleSpec s{ScheduleKind::GPipe, 2, 1, 1};
  const CheckResult r = check(s, generate(s));
  ASSERT_EQ(r.timeline.size(), 4u);
  EXPECT_EQ(r.timeline[0].start, 0);
  EXPECT_EQ(r.timeline[1].start, 4);
  EXPECT_EQ(r.timeline[1].end, 6);
  EXPECT_EQ(r.timeline[2].start, 1);
  EXPECT_EQ(r.timeline[3].start, 2);
  EXPECT_EQ(r.makespan, 6);
  EXPECT_NEAR(r.bubble_fraction, 0.5, 1e-12);
}

// Ranks sharing cores (the planner's model of more CPU ranks than cores): with a core each it is
// check()'s timeline plus the tails; on one core nothing is ever idle, so it is the total work;
// in between it is traced by hand.
TEST(ScheduleSharedCores, DedicatedSharedAndPinnedCores) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                            ScheduleKind::ZeroBubble}) {
    const ScheduleSpec s{kind, 4, 8, kind == ScheduleKind::Interleaved ? 2 : 1};
    const Lists lists = generate(s);
    const Costs c{1.0, 1.5, kind == ScheduleKind::ZeroBubble ? 0.7 : 0.0, 0.25};
    const std::vector<double> scale = {1.0, 0.9, 1.1, 1.3};
    const CheckResult r = check(s, lists, c, 0, scale);
    const SharedResult own = shared_makespan(s, lists, c, scale, {{0}, {1}, {2}, {3}});
    EXPECT_NEAR(own.makespan, r.makespan, 1e-9) << schedule_name(kind);
    EXPECT_EQ(own.contended, std::vector<double>(4, 0.0));
    // Sends cost nothing on one core; every action runs back to back.
    const Costs free{c.forward, c.backward_input, c.backward_weight, 0.0};
    double work = 0;
    for (const TimedAction& t : check(s, lists, free, 0, scale).timeline) work += t.end - t.start;
    EXPECT_NEAR(
        shared_makespan(s, lists, free, scale, {{0}, {0}, {0}, {0}}, {0.5, 0.5, 0.5, 0.5}).makespan,
        work + 2.0, 1e-9)
        << schedule_name(kind);
    // Four stages round-robin on two cores: no faster than either bound, and slower than the
    // busier core's work (the warm-up and the cool-down leave a core idle).
    const double two = shared_makespan(s, lists, free, scale, {{0}, {1}, {0}, {1}}).makespan;
    EXPECT_GT(two, r.makespan - 4 * c.send);
    EXPECT_GT(two, 1.02 * work * (1.0 + 1.1) / (1.0 + 0.9 + 1.1 + 1.3));
  }
  // By hand: two stages, one micro-batch, forward 1 and backward 2, tails of 2. Stage 0 forwards
  // (0-1), stage 1 forwards (1-2) and backwards (2-4); then stage 0's backward and stage 1's tail
  // run at once: on two cores 4-6, then stage 0's tail 6-8; on one core at half speed 4-8, then
  // the tail 8-10.
  const ScheduleSpec s{ScheduleKind::OneFOneB, 2, 1, 1};
  const Costs c{1.0, 2.0, 0.0, 0.0};
  // On one core stage 0's backward (2 of its 3 units of work) shares it with stage 1's tail:
  // contended; stage 1 never runs beside stage 0's compute.
  const SharedResult apart = shared_makespan(s, generate(s), c, {}, {{0}, {1}}, {2.0, 2.0});
  const SharedResult one = shared_makespan(s, generate(s), c, {}, {{0}, {0}}, {2.0, 2.0});
  EXPECT_NEAR(apart.makespan, 8.0, 1e-12);
  EXPECT_EQ(apart.contended, std::vector<double>(2, 0.0));
  EXPECT_NEAR(one.makespan, 10.0, 1e-12);
  ASSERT_EQ(one.contended.size(), 2u);
  EXPECT_NEAR(one.contended[0], 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(one.contended[1], 0.0, 1e-12);
  // A stage's ranks (data-parallel replicas) on both cores go at the pace of the busier one.
  EXPECT_NEAR(shared_makespan(s, generate(s), c, {}, {{0, 1}, {0}}, {2.0, 2.0}).makespan, 10.0,
              1e-12);
}

TEST(ScheduleTrace, ChromeTraceIsValidJsonWithOneEventPerComputeAction) {
  for (const ScheduleSpec& s : {ScheduleSpec{ScheduleKind::OneFOneB, 4, 8, 1},
                                ScheduleSpec{ScheduleKind::Interleaved, 2, 4, 2},
                                ScheduleSpec{ScheduleKind::ZeroBubble, 4, 8, 1}}) {
    const CheckResult r = check(s, generate(s));
    const nlohmann::json j = nlohmann::json::parse(chrome_trace(r, s));
    ASSERT_TRUE(j.contains("traceEvents"));
    size_t events = 0;
    double last_end = 0;
    for (const auto& e : j["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const TimedAction& t = r.timeline[events++];
      EXPECT_EQ(e["pid"], 0);
      EXPECT_EQ(e["tid"], t.stage);
      EXPECT_EQ(e["name"], action_name(t.action));
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), t.start * 1000);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), (t.end - t.start) * 1000);
      last_end = std::max(last_end, e["ts"].get<double>() + e["dur"].get<double>());
    }
    EXPECT_EQ(events, r.timeline.size());
    EXPECT_DOUBLE_EQ(last_end, r.makespan * 1000);
  }
  const ScheduleSpec s{ScheduleKind::ZeroBubble, 2, 2, 1};
  const nlohmann::json j = nlohmann::json::parse(chrome_trace(check(s, generate(s)), s));
  std::vector<std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 1) names.push_back(e["name"]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"F0.0", "B0.0", "F1.0", "B1.0", "W0.0", "W1.0"}));
}

}  // namespace
}  // namespace strata::pipeline
