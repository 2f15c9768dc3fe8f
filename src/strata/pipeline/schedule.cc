#include "strata/pipeline/schedule.h"

#include <algorithm>
#include <cstdio>

#include "strata/core/check.h"

namespace strata::pipeline {

ScheduleKind parse_schedule(std::string_view name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zero_bubble") return ScheduleKind::ZeroBubble;
  STRATA_INPUT_FAIL("unknown pipeline schedule '", name,
                    "'; valid schedules: gpipe, 1f1b, interleaved, zero_bubble");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
    case ScheduleKind::ZeroBubble:
      return "zero_bubble";
  }
  return "?";
}

void validate(const ScheduleSpec& s) {
  STRATA_INPUT_CHECK(s.stages >= 1, "the pipeline needs at least 1 stage, got ", s.stages,
                     " (parallelism.pipeline)");
  STRATA_INPUT_CHECK(s.micro >= 1, "the pipeline needs at least 1 micro-batch per step, got ",
                     s.micro);
  if (s.kind == ScheduleKind::Interleaved) {
    STRATA_INPUT_CHECK(s.virtual_stages >= 2,
                       "the interleaved schedule needs parallelism.virtual_stages >= 2, got ",
                       s.virtual_stages, "; use 1f1b for one model chunk per stage");
    STRATA_INPUT_CHECK(
        s.micro % s.stages == 0, "the interleaved schedule needs the micro-batches (", s.micro,
        ") to be a multiple of parallelism.pipeline (", s.stages, ") as Megatron does; use ",
        (s.micro / s.stages + 1) * s.stages, " micro-batches or another schedule");
  } else {
    STRATA_INPUT_CHECK(s.virtual_stages == 1, "parallelism.virtual_stages = ", s.virtual_stages,
                       " needs the interleaved schedule; the ", schedule_name(s.kind),
                       " schedule runs one model chunk per stage (virtual_stages = 1)");
  }
}

namespace {

struct Compute {
  Op op;
  int micro, chunk;
};

// The stage's compute order with each action's receive before and send after it.
std::vector<Action> with_comm(const std::vector<Compute>& order, int s, int p, int v) {
  const int last = p * v - 1;
  std::vector<Action> out;
  out.reserve(order.size() * 3);
  for (const Compute& c : order) {
    const int g = global_chunk(c.chunk, s, p);
    const int prev = stage_of(g + p * v - 1, p), next = stage_of(g + 1, p);
    if (c.op == Op::Forward) {
      if (g > 0) out.push_back({Op::RecvActivation, c.micro, c.chunk, prev});
      out.push_back({c.op, c.micro, c.chunk});
      if (g < last) out.push_back({Op::SendActivation, c.micro, c.chunk, next});
    } else if (c.op == Op::Backward || c.op == Op::BackwardInput) {
      if (g < last) out.push_back({Op::RecvGradient, c.micro, c.chunk, next});
      out.push_back({c.op, c.micro, c.chunk});
      if (g > 0) out.push_back({Op::SendGradient, c.micro, c.chunk, prev});
    } else {
      out.push_back({c.op, c.micro, c.chunk});
    }
  }
  return out;
}

std::vector<Compute> gpipe(int m) {
  std::vector<Compute> out;
  for (int i = 0; i < m; ++i) out.push_back({Op::Forward, i, 0});
  for (int i = 0; i < m; ++i) out.push_back({Op::Backward, i, 0});
  return out;
}

std::vector<Compute> one_f_one_b(int s, int p, int m) {
  const int warmup = std::min(p - s - 1, m);
  std::vector<Compute> out;
  for (int i = 0; i < warmup; ++i) out.push_back({Op::Forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({Op::Forward, warmup + i, 0});
    out.push_back({Op::Backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) out.push_back({Op::Backward, i, 0});
  return out;
}

// Megatron's order: virtual micro-batch k runs micro-batch (k / pv)·p + k % p on chunk
// (k % pv) / p going forward, and on chunk v-1 - (k % pv) / p going backward.
std::vector<Compute> interleaved(int s, int p, int m, int v) {
  const int total = m * v;
  const int warmup = m == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
  auto micro = [&](int k) { return k / (p * v) * p + k % p; };
  auto forward = [&](int k) { return Compute{Op::Forward, micro(k), k % (p * v) / p}; };
  auto backward = [&](int k) { return Compute{Op::Backward, micro(k), v - 1 - k % (p * v) / p}; };
  std::vector<Compute> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(forward(warmup + i));
    out.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(backward(k));
  return out;
}

// ZB-H1: F(x), B(x - (p-1-s)), W(x - (p-1)) for x = 0 .. m+p-2, each when in range.
std::vector<Compute> zero_bubble(int s, int p, int m) {
  std::vector<Compute> out;
  for (int x = 0; x < m + p - 1; ++x) {
    const int b = x - (p - 1 - s), w = x - (p - 1);
    if (x < m) out.push_back({Op::Forward, x, 0});
    if (b >= 0 && b < m) out.push_back({Op::BackwardInput, b, 0});
    if (w >= 0 && w < m) out.push_back({Op::BackwardWeight, w, 0});
  }
  return out;
}

}  // namespace

std::vector<std::vector<Action>> generate(const ScheduleSpec& s) {
  validate(s);
  const int p = s.stages, m = s.micro, v = s.virtual_stages;
  std::vector<std::vector<Action>> lists(static_cast<size_t>(p));
  for (int stage = 0; stage < p; ++stage) {
    std::vector<Compute> order;
    switch (s.kind) {
      case ScheduleKind::GPipe:
        order = gpipe(m);
        break;
      case ScheduleKind::OneFOneB:
        order = one_f_one_b(stage, p, m);
        break;
      case ScheduleKind::Interleaved:
        order = interleaved(stage, p, m, v);
        break;
      case ScheduleKind::ZeroBubble:
        order = zero_bubble(stage, p, m);
        break;
    }
    lists[size_t(stage)] = with_comm(order, stage, p, v);
  }
  return lists;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward:
      return "Forward";
    case Op::Backward:
      return "Backward";
    case Op::BackwardInput:
      return "BackwardInput";
    case Op::BackwardWeight:
      return "BackwardWeight";
    case Op::SendActivation:
      return "SendActivation";
    case Op::RecvActivation:
      return "RecvActivation";
    case Op::SendGradient:
      return "SendGradient";
    case Op::RecvGradient:
      return "RecvGradient";
  }
  return "?";
}

namespace {

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput ||
         op == Op::BackwardWeight;
}

std::string compute_name(const Action& a, bool with_chunk) {
  std::string out(1, a.op == Op::Forward ? 'F' : a.op == Op::BackwardWeight ? 'W' : 'B');
  out += std::to_string(a.micro);
  if (with_chunk) out += '.', out += std::to_string(a.chunk);
  return out;
}

}  // namespace

const char* format_action(char* buf, size_t n, const Action& a) {
  const char* transfer = a.op == Op::SendActivation   ? "send-act"
                         : a.op == Op::RecvActivation ? "recv-act"
                         : a.op == Op::SendGradient   ? "send-grad"
                         : a.op == Op::RecvGradient   ? "recv-grad"
                                                      : nullptr;
  if (transfer != nullptr) {
    const bool send = a.op == Op::SendActivation || a.op == Op::SendGradient;
    std::snprintf(buf, n, "%s %d.%d %s %d", transfer, a.micro, a.chunk, send ? "to" : "from",
                  a.peer);
  } else {
    const char c = a.op == Op::Forward ? 'F' : a.op == Op::BackwardWeight ? 'W' : 'B';
    std::snprintf(buf, n, "%c%d.%d", c, a.micro, a.chunk);
  }
  return buf;
}

std::string action_name(const Action& a) {
  char buf[64];
  return format_action(buf, sizeof buf, a);
}

std::string describe(const std::vector<std::vector<Action>>& lists) {
  bool chunks = false;
  for (const auto& list : lists) {
    for (const Action& a : list) chunks = chunks || a.chunk != 0;
  }
  std::string out;
  for (size_t s = 0; s < lists.size(); ++s) {
    out += "stage ", out += std::to_string(s), out += ':';
    for (const Action& a : lists[s]) {
      if (is_compute(a.op)) out += ' ', out += compute_name(a, chunks);
    }
    out += "\n";
  }
  return out;
}

}  // namespace strata::pipeline
