// The schedule generators: every schedule passes the checker over a sweep of stages, micro-batches
// and virtual stages; bubbles and activations in flight match the literature; lists are exactly
// Megatron's orders.
#include "strata/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "strata/core/check.h"
#include "strata/pipeline/schedule_check.h"

namespace strata::pipeline {
namespace {

// (schedule, p, m / p, v)
using Sweep = std::tuple<ScheduleKind, int, int, int>;

class ScheduleSweep : public ::testing::TestWithParam<Sweep> {};

TEST_P(ScheduleSweep, PassesTheCheckerWithTheClosedFormBubble) {
  const auto [kind, p, factor, v] = GetParam();
  const ScheduleSpec s{kind, p, p * factor, v};
  const auto lists = generate(s);
  ASSERT_EQ(int(lists.size()), p);
  const CheckResult r = check(s, lists);
  const double m = s.micro;
  // Compute actions: F and B (+ W) per (micro-batch, chunk).
  const size_t per = kind == ScheduleKind::ZeroBubble ? 3 : 2;
  EXPECT_EQ(r.timeline.size(), per * size_t(p) * size_t(s.micro) * size_t(v));
  // With F = 1 and B + W = 2 per chunk, each stage computes 3·m·v.
  const double ideal = 3.0 * m * v, idle = r.makespan - ideal;
  EXPECT_NEAR(r.bubble_fraction, 1.0 - ideal / r.makespan, 1e-12);
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      EXPECT_NEAR(r.bubble_fraction, (p - 1) / (m + p - 1), 1e-12);
      break;
    case ScheduleKind::Interleaved:
      // Megatron's figure, bubble over ideal time: (p-1)/(v·m).
      EXPECT_NEAR(idle / ideal, (p - 1) / (v * m), 1e-12);
      EXPECT_NEAR(r.bubble_fraction, (p - 1) / (v * m + p - 1), 1e-12);
      break;
    case ScheduleKind::ZeroBubble:
      // ZB-H1 with F = B = W: bubble (p-1)·1 per stage against 1F1B's (p-1)·3.
      EXPECT_NEAR(idle, p - 1.0, 1e-12);
      EXPECT_NEAR(r.bubble_fraction, (p - 1) / (3 * m + p - 1), 1e-12);
      break;
  }
  const auto closed = closed_form_bubble(s);
  ASSERT_TRUE(closed.has_value());
  EXPECT_NEAR(r.bubble_fraction, *closed, 1e-12);
}

std::string sweep_name(const ::testing::TestParamInfo<Sweep>& info) {
  const auto [kind, p, factor, v] = info.param;
  return std::string(schedule_name(kind)) + "_p" + std::to_string(p) + "_m" +
         std::to_string(p * factor) + "_v" + std::to_string(v);
}

INSTANTIATE_TEST_SUITE_P(NonInterleaved, ScheduleSweep,
                         ::testing::Combine(::testing::Values(ScheduleKind::GPipe,
                                                              ScheduleKind::OneFOneB,
                                                              ScheduleKind::ZeroBubble),
                                            ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(1, 2, 4), ::testing::Values(1)),
                         sweep_name);
INSTANTIATE_TEST_SUITE_P(Interleaved, ScheduleSweep,
                         ::testing::Combine(::testing::Values(ScheduleKind::Interleaved),
                                            ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(1, 2, 4), ::testing::Values(2, 3)),
                         sweep_name);

CheckResult run(ScheduleKind kind, int p, int m, int v = 1, const Costs& c = {}) {
  const ScheduleSpec s{kind, p, m, v};
  return check(s, generate(s), c);
}

TEST(ScheduleBubble, InterleavedBubbleTimeIsOneFOneBsOverV) {
  // The same model cut into v chunks per stage: each chunk costs 1/v of a stage's work.
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const CheckResult base = run(ScheduleKind::OneFOneB, p, m);
      const double base_idle = base.makespan - 3.0 * m;
      for (int v : {2, 3}) {
        const double u = 1.0 / v;
        const CheckResult r = run(ScheduleKind::Interleaved, p, m, v, {u, u, u, 0});
        EXPECT_NEAR(r.makespan - 3.0 * m, base_idle / v, 1e-9) << "p " << p << " m " << m;
        EXPECT_LT(r.bubble_fraction, base.bubble_fraction);
      }
    }
  }
}

TEST(ScheduleBubble, ZeroBubbleIsAThirdOfOneFOneBs) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const CheckResult zb = run(ScheduleKind::ZeroBubble, p, m);
      const CheckResult ob = run(ScheduleKind::OneFOneB, p, m);
      const double zb_idle = zb.makespan - 3.0 * m, ob_idle = ob.makespan - 3.0 * m;
      EXPECT_NEAR(zb_idle, ob_idle / 3, 1e-12);
      // As fractions of the makespan: (p-1)/(3m+p-1) against (p-1)/(m+p-1), within 1/3 + p/(3m).
      EXPECT_LE(zb.bubble_fraction, ob.bubble_fraction / 3 + double(p) / (3.0 * m) + 1e-12);
    }
  }
}

TEST(ScheduleBubble, ClosedFormsMatchTheSimulationForOtherCosts) {
  const Costs costs[] = {{2, 1, 0.5, 0}, {1, 3, 0.1, 0},   {0.7, 1.3, 1.1, 0},
                         {1, 1, 3, 0},   {1, 0.5, 0.2, 0}, {1, 1, 0, 0}};
  for (const Costs& c : costs) {
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                              ScheduleKind::Interleaved, ScheduleKind::ZeroBubble}) {
      for (int p : {1, 2, 3, 4, 8}) {
        for (int m = 1; m <= 3 * p; ++m) {
          const int v = kind == ScheduleKind::Interleaved ? 2 : 1;
          if (v > 1 && m % p != 0) continue;
          const ScheduleSpec s{kind, p, m, v};
          const auto closed = closed_form_bubble(s, c);
          if (kind == ScheduleKind::ZeroBubble && m < p) {
            EXPECT_FALSE(closed.has_value());
            continue;
          }
          ASSERT_TRUE(closed.has_value());
          EXPECT_NEAR(check(s, generate(s), c).bubble_fraction, *closed, 1e-12)
              << schedule_name(kind) << " p " << p << " m " << m << " costs " << c.forward << ","
              << c.backward_input << "," << c.backward_weight;
        }
      }
    }
  }
}

TEST(ScheduleBubble, SendTimeLengthensTheMakespan) {
  const CheckResult free = run(ScheduleKind::OneFOneB, 4, 8);
  const CheckResult slow = run(ScheduleKind::OneFOneB, 4, 8, 1, {1, 1, 1, 0.5});
  EXPECT_GT(slow.makespan, free.makespan);
  EXPECT_GT(slow.bubble_fraction, free.bubble_fraction);
}

TEST(ScheduleMemory, PeakInFlight) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const CheckResult ob = run(ScheduleKind::OneFOneB, p, m);
      const CheckResult gp = run(ScheduleKind::GPipe, p, m);
      const CheckResult zb = run(ScheduleKind::ZeroBubble, p, m);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(ob.peak_in_flight[size_t(s)], p - s) << "1f1b stage " << s;
        EXPECT_EQ(ob.peak_activations[size_t(s)], p - s);
        EXPECT_EQ(gp.peak_in_flight[size_t(s)], m) << "gpipe stage " << s;
        // ZB-H1: micro-batches holding all their activations (input gradient not done) as 1F1B;
        // counting those whose weight gradient waits, p on every stage: 1F1B's peak (stage 0).
        EXPECT_EQ(zb.peak_activations[size_t(s)], ob.peak_in_flight[size_t(s)]) << "zb " << s;
        EXPECT_EQ(zb.peak_in_flight[size_t(s)], ob.peak_in_flight[0]) << "zb stage " << s;
      }
      // Megatron's interleaved warm-up 2(p-s-1) + (v-1)p forwards, plus the steady one; all with
      // m == p.
      for (int v : {2, 3}) {
        const CheckResult il = run(ScheduleKind::Interleaved, p, m, v);
        for (int s = 0; s < p; ++s) {
          const int expect = m == p ? m * v : 2 * (p - s - 1) + (v - 1) * p + 1;
          EXPECT_EQ(il.peak_in_flight[size_t(s)], expect) << "p " << p << " m " << m << " v " << v;
        }
      }
    }
  }
}

TEST(ScheduleMemory, OneFOneBRespectsItsBoundAndFewerMicroBatches) {
  const ScheduleSpec s{ScheduleKind::OneFOneB, 8, 3, 1};  // m < p
  const CheckResult r = check(s, generate(s), {}, 3);
  for (int st = 0; st < 8; ++st) EXPECT_EQ(r.peak_in_flight[size_t(st)], std::min(8 - st, 3));
}

TEST(ScheduleLists, ExplicitSendsAndReceives) {
  const auto lists = generate({ScheduleKind::GPipe, 2, 1, 1});
  const std::vector<Action> stage0 = {{Op::Forward, 0, 0, -1},
                                      {Op::SendActivation, 0, 0, 1},
                                      {Op::RecvGradient, 0, 0, 1},
                                      {Op::Backward, 0, 0, -1}};
  const std::vector<Action> stage1 = {{Op::RecvActivation, 0, 0, 0},
                                      {Op::Forward, 0, 0, -1},
                                      {Op::Backward, 0, 0, -1},
                                      {Op::SendGradient, 0, 0, 0}};
  EXPECT_EQ(lists[0], stage0);
  EXPECT_EQ(lists[1], stage1);
}

TEST(ScheduleLists, InterleavedChunksWrapFromTheLastStageToTheFirst) {
  // p = 2, v = 2: global chunks 0 (stage 0), 1 (stage 1), 2 (stage 0 local 1), 3 (stage 1 local 1).
  const auto lists = generate({ScheduleKind::Interleaved, 2, 2, 2});
  bool wrap_send = false, wrap_recv = false;
  for (const Action& a : lists[1]) {
    wrap_send |= a.op == Op::SendActivation && a.chunk == 0 && a.peer == 0;
    EXPECT_FALSE(a.op == Op::SendActivation && a.chunk == 1) << "the last chunk sends nothing";
  }
  for (const Action& a : lists[0]) {
    wrap_recv |= a.op == Op::RecvActivation && a.chunk == 1 && a.peer == 1;
    EXPECT_FALSE(a.op == Op::RecvActivation && a.chunk == 0) << "the first chunk reads tokens";
  }
  EXPECT_TRUE(wrap_send);
  EXPECT_TRUE(wrap_recv);
}

TEST(ScheduleLists, Describe) {
  EXPECT_EQ(describe(generate({ScheduleKind::OneFOneB, 2, 3, 1})),
            "stage 0: F0 F1 B0 F2 B1 B2\n"
            "stage 1: F0 B0 F1 B1 F2 B2\n");
  EXPECT_EQ(describe(generate({ScheduleKind::GPipe, 2, 2, 1})),
            "stage 0: F0 F1 B0 B1\n"
            "stage 1: F0 F1 B0 B1\n");
  // ZB-H1: F(x), B(x-(p-1-s)), W(x-(p-1)).
  EXPECT_EQ(describe(generate({ScheduleKind::ZeroBubble, 2, 3, 1})),
            "stage 0: F0 F1 B0 W0 F2 B1 W1 B2 W2\n"
            "stage 1: F0 B0 F1 B1 W0 F2 B2 W1 W2\n");
  // Megatron's interleaved order with p = 2, v = 2, m = 4: stage 0 warms up with
  // 2(p-1) + (v-1)p = 4 forwards, groups of p micro-batches per chunk.
  const std::string il = describe(generate({ScheduleKind::Interleaved, 2, 4, 2}));
  EXPECT_EQ(il.substr(0, il.find('\n')),
            "stage 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 "
            "B3.0");
}

TEST(ScheduleSpecs, Validation) {
  auto message = [](const ScheduleSpec& s) {
    try {
      generate(s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({ScheduleKind::Interleaved, 4, 8, 1}).find("virtual_stages >= 2"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::Interleaved, 4, 6, 2}).find("multiple of parallelism.pipeline"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::OneFOneB, 4, 8, 2}).find("needs the interleaved schedule"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::GPipe, 4, 0, 1}).find("at least 1 micro-batch"),
            std::string::npos);
  EXPECT_NE(message({ScheduleKind::GPipe, 0, 4, 1}).find("at least 1 stage"), std::string::npos);
}

TEST(ScheduleSpecs, ParseNames) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                         ScheduleKind::ZeroBubble}) {
    EXPECT_EQ(parse_schedule(schedule_name(k)), k);
  }
  try {
    parse_schedule("zb");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gpipe, 1f1b, interleaved, zero_bubble"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace strata::pipeline
