#include "strata/pipeline/schedule_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "strata/core/check.h"

namespace strata::pipeline {

namespace {

using detail::concat;

bool is_send(Op op) {
  return op == Op::SendActivation || op == Op::SendGradient;
}
bool is_recv(Op op) {
  return op == Op::RecvActivation || op == Op::RecvGradient;
}
bool is_activation(Op op) {
  return op == Op::SendActivation || op == Op::RecvActivation;
}

std::string at(int s, size_t i, const Action& a) {
  return concat("schedule check: stage ", s, ", action ", i, " (", action_name(a), ")");
}

double cost(Op op, const Costs& c) {
  switch (op) {
    case Op::Forward:
      return c.forward;
    case Op::Backward:
      return c.backward_input + c.backward_weight;
    case Op::BackwardInput:
      return c.backward_input;
    case Op::BackwardWeight:
      return c.backward_weight;
    default:
      return 0;
  }
}

// Where a message lives: activations and gradients apart, each by (micro-batch, global chunk it
// goes to).
struct Messages {
  int G = 0;  // global chunks
  size_t key(Op op, int micro, int dest) const {
    return (size_t(micro) * size_t(G) + size_t(dest)) * 2 + (is_activation(op) ? 0 : 1);
  }
};

// The global chunk a send's message goes to or a receive's comes to.
int destination(const Action& a, int g) {
  if (a.op == Op::SendActivation) return g + 1;
  if (a.op == Op::SendGradient) return g - 1;
  return g;
}

// The state of one (micro-batch, global chunk) while reading its stage's list: positions of what
// ran, -1 for not yet.
struct PairState {
  long fwd = -1, input_grad = -1, weight_grad = -1, recv_act = -1, recv_grad = -1;
  bool fused = false;
};

struct Limits {
  int p, m, v, G, max_in_flight;
};

// Ranges, neighbours and per-stage order; fills the peaks.
void check_stage(int s, const std::vector<Action>& list, const Limits& L,
                 std::vector<PairState>& pairs, CheckResult& r) {
  int in_flight = 0, activations = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    STRATA_INPUT_CHECK(a.micro >= 0 && a.micro < L.m, at(s, i, a), ": micro-batch ", a.micro,
                       " is out of range 0..", L.m - 1);
    STRATA_INPUT_CHECK(a.chunk >= 0 && a.chunk < L.v, at(s, i, a), ": chunk ", a.chunk,
                       " is out of range 0..", L.v - 1, " (virtual stages)");
    const int g = global_chunk(a.chunk, s, L.p);
    PairState& st = pairs[size_t(a.micro) * size_t(L.G) + size_t(g)];
    if (is_send(a.op) || is_recv(a.op)) {
      const bool forward_msg = is_activation(a.op);
      const bool upstream = is_recv(a.op) == forward_msg;  // the peer holds g-1
      STRATA_INPUT_CHECK(!(upstream && g == 0), at(s, i, a),
                         ": the first model chunk reads token ids; it ",
                         forward_msg ? "receives no activation" : "sends no gradient");
      STRATA_INPUT_CHECK(!(!upstream && g == L.G - 1), at(s, i, a),
                         ": the last model chunk computes the loss; it ",
                         forward_msg ? "sends no activation" : "receives no gradient");
      const int want = stage_of(upstream ? g - 1 : g + 1, L.p);
      STRATA_INPUT_CHECK(a.peer == want, at(s, i, a), ": the peer must be stage ", want,
                         ", which holds global chunk ", upstream ? g - 1 : g + 1, ", not ", a.peer);
    }
    switch (a.op) {
      case Op::Forward:
        STRATA_INPUT_CHECK(st.fwd < 0, at(s, i, a), ": duplicated Forward (first at action ",
                           st.fwd, ")");
        STRATA_INPUT_CHECK(g == 0 || st.recv_act >= 0, at(s, i, a),
                           ": Forward before its activation was received: no "
                           "RecvActivation of micro-batch ",
                           a.micro, " chunk ", a.chunk, " from stage ", stage_of(g - 1, L.p),
                           " earlier on this stage");
        st.fwd = long(i);
        r.peak_in_flight[size_t(s)] = std::max(r.peak_in_flight[size_t(s)], ++in_flight);
        r.peak_activations[size_t(s)] = std::max(r.peak_activations[size_t(s)], ++activations);
        STRATA_INPUT_CHECK(L.max_in_flight <= 0 || in_flight <= L.max_in_flight, at(s, i, a), ": ",
                           in_flight,
                           " micro-batch chunks in flight (forward done, weight gradient not), "
                           "over the bound ",
                           L.max_in_flight);
        break;
      case Op::Backward:
      case Op::BackwardInput:
        STRATA_INPUT_CHECK(st.fwd >= 0, at(s, i, a), ": ", op_name(a.op),
                           " before its Forward on this stage");
        STRATA_INPUT_CHECK(st.input_grad < 0, at(s, i, a),
                           ": duplicated backward (first at action ", st.input_grad, ")");
        STRATA_INPUT_CHECK(g == L.G - 1 || st.recv_grad >= 0, at(s, i, a), ": ", op_name(a.op),
                           " before its gradient was received: no RecvGradient of micro-batch ",
                           a.micro, " chunk ", a.chunk, " from stage ", stage_of(g + 1, L.p),
                           " earlier on this stage");
        st.input_grad = long(i);
        --activations;
        if (a.op == Op::Backward) st.weight_grad = long(i), st.fused = true, --in_flight;
        break;
      case Op::BackwardWeight:
        STRATA_INPUT_CHECK(!st.fused, at(s, i, a),
                           ": BackwardWeight after the fused Backward at action ", st.weight_grad,
                           " already computed its weight gradient");
        STRATA_INPUT_CHECK(st.weight_grad < 0, at(s, i, a),
                           ": duplicated BackwardWeight (first at action ", st.weight_grad, ")");
        STRATA_INPUT_CHECK(st.input_grad >= 0, at(s, i, a),
                           ": BackwardWeight before its BackwardInput on this stage");
        st.weight_grad = long(i);
        --in_flight;
        break;
      case Op::SendActivation:
        STRATA_INPUT_CHECK(st.fwd >= 0, at(s, i, a),
                           ": sends an activation before the Forward that computes it");
        break;
      case Op::SendGradient:
        STRATA_INPUT_CHECK(st.input_grad >= 0, at(s, i, a),
                           ": sends a gradient before the backward that computes it");
        break;
      case Op::RecvActivation:
        if (st.recv_act < 0) st.recv_act = long(i);
        break;
      case Op::RecvGradient:
        if (st.recv_grad < 0) st.recv_grad = long(i);
        break;
    }
  }
  for (int k = 0; k < L.v; ++k) {
    const int g = global_chunk(k, s, L.p);
    for (int m = 0; m < L.m; ++m) {
      const PairState& st = pairs[size_t(m) * size_t(L.G) + size_t(g)];
      const auto missing = [&](const char* what) {
        STRATA_INPUT_FAIL("schedule check: stage ", s, ": micro-batch ", m, " chunk ", k, " has ",
                          what);
      };
      if (st.fwd < 0) missing("no Forward");
      if (st.input_grad < 0) missing("no Backward or BackwardInput");
      if (st.weight_grad < 0) missing("a BackwardInput but no BackwardWeight");
    }
  }
}

// Every send matched by exactly one receive on its peer and every receive by exactly one send.
// Fills the position of each message's first send (stage, index) by key.
void match(const std::vector<std::vector<Action>>& lists, const Limits& L, const Messages& msg,
           std::vector<std::pair<int, long>>& sender) {
  std::vector<int> sends(sender.size()), recvs(sender.size());
  for (int s = 0; s < L.p; ++s) {
    for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
      const Action& a = lists[size_t(s)][i];
      const int g = global_chunk(a.chunk, s, L.p);
      const size_t key = msg.key(a.op, a.micro, destination(a, g));
      if (is_send(a.op) && sends[key]++ == 0) sender[key] = {s, long(i)};
      if (is_recv(a.op)) ++recvs[key];
    }
  }
  for (int s = 0; s < L.p; ++s) {
    std::vector<int> seen_send(sender.size()), seen_recv(sender.size());
    for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
      const Action& a = lists[size_t(s)][i];
      const int g = global_chunk(a.chunk, s, L.p);
      const int dest = destination(a, g);
      const size_t key = msg.key(a.op, a.micro, dest);
      const char* recv_op = is_activation(a.op) ? "RecvActivation" : "RecvGradient";
      const char* send_op = is_activation(a.op) ? "SendActivation" : "SendGradient";
      if (is_send(a.op)) {
        STRATA_INPUT_CHECK(recvs[key] > 0, at(s, i, a), ": send without a receive: stage ", a.peer,
                           " has no ", recv_op, " of micro-batch ", a.micro, " chunk ", dest / L.p,
                           " from stage ", s);
        STRATA_INPUT_CHECK(seen_send[key]++ < recvs[key], at(s, i, a),
                           ": send without a receive: this message is sent ", sends[key],
                           " times but received ", recvs[key], " time(s) on stage ", a.peer);
      } else if (is_recv(a.op)) {
        const int from = is_activation(a.op) ? g - 1 : g + 1;
        STRATA_INPUT_CHECK(sends[key] > 0, at(s, i, a), ": receive without a send: stage ", a.peer,
                           " has no ", send_op, " of micro-batch ", a.micro, " chunk ", from / L.p,
                           " to stage ", s);
        STRATA_INPUT_CHECK(seen_recv[key]++ < sends[key], at(s, i, a),
                           ": receive without a send: this message is received ", recvs[key],
                           " times but sent ", sends[key], " time(s) by stage ", a.peer);
      }
    }
  }
}

}  // namespace

CheckResult check(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists,
                  const Costs& c, int max_in_flight, const std::vector<double>& stage_scale) {
  STRATA_INPUT_CHECK(stage_scale.empty() || int(stage_scale.size()) == s.stages,
                     "schedule costs: stage_scale needs one factor per stage (", s.stages,
                     "), got ", stage_scale.size());
  STRATA_INPUT_CHECK(s.stages >= 1 && s.micro >= 1 && s.virtual_stages >= 1,
                     "schedule check: stages, micro-batches and virtual stages must be >= 1, got ",
                     s.stages, ", ", s.micro, ", ", s.virtual_stages);
  STRATA_INPUT_CHECK(std::isfinite(c.forward + c.backward_input + c.backward_weight + c.send) &&
                         c.forward > 0 && c.backward_input > 0 && c.backward_weight >= 0 &&
                         c.send >= 0,
                     "schedule costs: forward and backward_input must be > 0, backward_weight and "
                     "send >= 0; got ",
                     c.forward, ", ", c.backward_input, ", ", c.backward_weight, ", ", c.send);
  const int p = s.stages;
  STRATA_INPUT_CHECK(int(lists.size()) == p, "schedule check: ", lists.size(), " action lists for ",
                     p, " stages");
  const Limits L{p, s.micro, s.virtual_stages, p * s.virtual_stages, max_in_flight};
  CheckResult r;
  r.peak_in_flight.assign(size_t(p), 0);
  r.peak_activations.assign(size_t(p), 0);
  std::vector<PairState> pairs(size_t(L.m) * size_t(L.G));
  for (int stage = 0; stage < p; ++stage) check_stage(stage, lists[size_t(stage)], L, pairs, r);

  const Messages msg{L.G};
  const size_t keys = size_t(L.m) * size_t(L.G) * 2;
  std::vector<std::pair<int, long>> sender(keys, {-1, -1});
  match(lists, L, msg, sender);

  // Simulate: each stage runs until a receive whose send is not issued yet; repeat until all are
  // done or none can move.
  std::vector<double> issued(keys, -1.0), clock(size_t(p), 0.0);
  std::vector<size_t> pc(size_t(p), 0);
  std::vector<std::vector<TimedAction>> timeline(static_cast<size_t>(p));
  double busy = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int stage = 0; stage < p; ++stage) {
      const std::vector<Action>& list = lists[size_t(stage)];
      double& now = clock[size_t(stage)];
      for (size_t& i = pc[size_t(stage)]; i < list.size(); ++i, moved = true) {
        const Action& a = list[i];
        const int g = global_chunk(a.chunk, stage, p);
        if (is_send(a.op)) {
          issued[msg.key(a.op, a.micro, destination(a, g))] = now;
        } else if (is_recv(a.op)) {
          const double t = issued[msg.key(a.op, a.micro, g)];
          if (t < 0) break;
          now = std::max(now, t + c.send);
        } else {
          const double d =
              cost(a.op, c) * (stage_scale.empty() ? 1.0 : stage_scale.at(size_t(stage)));
          timeline[size_t(stage)].push_back({stage, a, now, now + d});
          now += d, busy += d;
        }
      }
    }
  }
  std::string stuck;
  for (int stage = 0; stage < p; ++stage) {
    const size_t i = pc[size_t(stage)];
    if (i == lists[size_t(stage)].size()) continue;
    const Action& a = lists[size_t(stage)][i];
    const auto [from, j] = sender[msg.key(a.op, a.micro, global_chunk(a.chunk, stage, p))];
    stuck += concat(stuck.empty() ? "" : "; ", "stage ", stage, " waits at action ", i, " (",
                    action_name(a), ") for stage ", from, "'s action ", j, " (",
                    action_name(lists[size_t(from)][size_t(j)]), ")");
  }
  STRATA_INPUT_CHECK(stuck.empty(), "schedule check: deadlock, no stage can proceed: ", stuck);

  for (int stage = 0; stage < p; ++stage) {
    r.makespan = std::max(r.makespan, clock[size_t(stage)]);
    r.timeline.insert(r.timeline.end(), timeline[size_t(stage)].begin(),
                      timeline[size_t(stage)].end());
  }
  r.bubble_fraction = 1.0 - busy / (double(p) * r.makespan);
  return r;
}

SharedResult shared_makespan(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists,
                             const Costs& c, const std::vector<double>& stage_scale,
                             const std::vector<std::vector<int>>& rank_cpu,
                             const std::vector<double>& tail) {
  const int p = s.stages;
  STRATA_CHECK(int(lists.size()) == p && int(rank_cpu.size()) == p &&
                   (stage_scale.empty() || int(stage_scale.size()) == p) &&
                   (tail.empty() || int(tail.size()) == p),
               "shared_makespan: one list, core list, scale and tail per stage");
  int cpus = 0;
  for (const std::vector<int>& r : rank_cpu) {
    STRATA_CHECK(!r.empty(), "shared_makespan: a stage without ranks");
    for (int k : r) cpus = std::max(cpus, k + 1);
  }
  const Messages msg{p * s.virtual_stages};
  std::vector<double> issued(size_t(s.micro) * size_t(msg.G) * 2, -1.0);
  std::vector<size_t> pc(size_t(p), 0);
  // Work left in the stage's current compute action (or its tail, at pc == size), in time units
  // of a core of its own; -1: not started.
  std::vector<double> left(size_t(p), -1.0);
  std::vector<char> done(size_t(p), 0);
  std::vector<int> load(static_cast<size_t>(cpus)), own(static_cast<size_t>(cpus));
  // Compute work done in all and while contended, per stage.
  std::vector<double> work(size_t(p), 0.0), shared(size_t(p), 0.0);
  // Per pass: which stages have work, at what speed, beside another stage's ranks.
  const size_t stages = static_cast<size_t>(p);
  std::vector<char> runnable(stages), contended(stages);
  std::vector<double> speed(stages);
  double now = 0;
  for (int remaining = p;;) {
    // Move every stage through its sends and arrived receives to its next compute action (or the
    // end); the earliest message still in transit bounds the next step.
    // (Until no stage moves: a send issued by a later stage may let an earlier one receive.)
    double wake = std::numeric_limits<double>::infinity();
    std::fill(runnable.begin(), runnable.end(), 0);
    for (bool moved = true; moved;) {
      moved = false;
      for (int st = 0; st < p; ++st) {
        if (done[size_t(st)]) continue;
        const std::vector<Action>& list = lists[size_t(st)];
        size_t& i = pc[size_t(st)];
        for (; i < list.size() && left[size_t(st)] < 0; ++i, moved = true) {
          const Action& a = list[i];
          const int g = global_chunk(a.chunk, st, p);
          if (is_send(a.op)) {
            issued[msg.key(a.op, a.micro, destination(a, g))] = now;
          } else if (is_recv(a.op)) {
            const double t = issued[msg.key(a.op, a.micro, g)];
            if (t < 0) break;
            if (t + c.send > now) {
              wake = std::min(wake, t + c.send);
              break;
            }
          } else {
            left[size_t(st)] =
                cost(a.op, c) * (stage_scale.empty() ? 1.0 : stage_scale[size_t(st)]);
            break;
          }
        }
        if (i == list.size() && left[size_t(st)] < 0) {
          left[size_t(st)] = tail.empty() ? 0.0 : tail[size_t(st)];
        }
        runnable[size_t(st)] = left[size_t(st)] >= 0 ? 1 : 0;
      }
    }
    // Finished stages (at the end of their list with no work left) drop out.
    for (int st = 0; st < p; ++st) {
      if (!done[size_t(st)] && pc[size_t(st)] == lists[size_t(st)].size() &&
          left[size_t(st)] <= 0) {
        done[size_t(st)] = 1, runnable[size_t(st)] = 0, --remaining;
      }
    }
    if (remaining == 0) break;
    std::fill(load.begin(), load.end(), 0);
    for (int st = 0; st < p; ++st) {
      if (runnable[size_t(st)]) {
        for (int k : rank_cpu[size_t(st)]) ++load[size_t(k)];
      }
    }
    std::fill(speed.begin(), speed.end(), 0.0);
    std::fill(contended.begin(), contended.end(), 0);
    double next = wake;
    for (int st = 0; st < p; ++st) {
      if (!runnable[size_t(st)]) continue;
      int most = 1;
      for (int k : rank_cpu[size_t(st)]) ++own[size_t(k)];
      for (int k : rank_cpu[size_t(st)]) {
        most = std::max(most, load[size_t(k)]);
        contended[size_t(st)] |= load[size_t(k)] > own[size_t(k)] ? 1 : 0;
      }
      for (int k : rank_cpu[size_t(st)]) --own[size_t(k)];
      speed[size_t(st)] = 1.0 / most;
      next = std::min(next, now + left[size_t(st)] * most);
    }
    STRATA_CHECK(std::isfinite(next), "shared_makespan: no stage can proceed (lists not checked?)");
    for (int st = 0; st < p; ++st) {
      if (!runnable[size_t(st)]) continue;
      const double done_work = std::min(left[size_t(st)], speed[size_t(st)] * (next - now));
      if (pc[size_t(st)] < lists[size_t(st)].size()) {  // a compute action, not the tail
        work[size_t(st)] += done_work;
        if (contended[size_t(st)]) shared[size_t(st)] += done_work;
      }
      left[size_t(st)] -= speed[size_t(st)] * (next - now);
      // The action whose end this step reached completes (rounding aside); the next one starts
      // on the next pass.
      if (left[size_t(st)] <= 1e-12 * std::max(1.0, next)) {
        left[size_t(st)] = -1.0;
        if (pc[size_t(st)] < lists[size_t(st)].size()) {
          ++pc[size_t(st)];
        } else {
          done[size_t(st)] = 1, --remaining;
        }
      }
    }
    now = next;
    if (remaining == 0) break;
  }
  SharedResult r;
  r.makespan = now;
  for (int st = 0; st < p; ++st) {
    r.contended.push_back(work[size_t(st)] > 0 ? shared[size_t(st)] / work[size_t(st)] : 0.0);
  }
  return r;
}

std::optional<double> closed_form_bubble(const ScheduleSpec& s, const Costs& c) {
  const double p = s.stages, m = s.micro, v = s.virtual_stages;
  switch (s.kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::Interleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::ZeroBubble: {
      if (s.micro < s.stages) return std::nullopt;
      const double F = c.forward, B = c.backward_input, W = c.backward_weight;
      const double bubble = (p - 1) * (F + B - std::min({F, B, W})), ideal = m * (F + B + W);
      return bubble / (bubble + ideal);
    }
  }
  return std::nullopt;
}

std::string chrome_trace(const CheckResult& r, const ScheduleSpec& s) {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"args",
                     {{"name", concat("strata schedule ", schedule_name(s.kind), " p", s.stages,
                                      " m", s.micro, s.virtual_stages > 1 ? " v" : "",
                                      s.virtual_stages > 1 ? std::to_string(s.virtual_stages)
                                                           : std::string())}}}});
  for (int stage = 0; stage < s.stages; ++stage) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", stage},
                      {"args", {{"name", concat("stage ", stage)}}}});
  }
  for (const TimedAction& t : r.timeline) {
    const Action& a = t.action;
    events.push_back({{"name", action_name(a)},
                      {"cat", op_name(a.op)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", t.stage},
                      {"ts", t.start * 1000.0},
                      {"dur", (t.end - t.start) * 1000.0},
                      {"args",
                       {{"micro", a.micro},
                        {"chunk", a.chunk},
                        {"global_chunk", global_chunk(a.chunk, t.stage, s.stages)}}}});
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace strata::pipeline
