// Pipeline schedules as data (DESIGN.md §6): for each stage, the ordered list of actions it runs.
// A generator knows nothing of the model; an executor runs any list, and schedule_check.h
// validates one and simulates its timeline.
//
// Model chunks: with p stages and v virtual stages the model is cut into p·v chunks; global chunk
// g = k·p + s lives on stage s as its local chunk k (Megatron's interleaving). Activations flow
// g → g+1 (stage s → s+1, and from stage p-1 local chunk k to stage 0 local chunk k+1), gradients
// flow back. The first global chunk takes token ids (no RecvActivation); the last computes the loss
// (no SendActivation; its backward starts from the loss, no RecvGradient). With p = 1 and v > 1
// the messages between chunks go from stage 0 to itself.
//
// Communication is explicit in the lists: a Forward of (micro, chunk) is preceded by its
// RecvActivation and followed by its SendActivation; a Backward or BackwardInput is preceded by
// its RecvGradient and followed by its SendGradient (where the chunk has such a neighbour).
// BackwardWeight communicates nothing. Semantics an executor implements: a send is asynchronous
// (never blocks the sender, the message reaches the peer); a receive blocks until the matching
// send was issued; compute actions run in list order on their stage.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::pipeline {

enum class Op : uint8_t {
  Forward,
  Backward,        // input and weight gradients together
  BackwardInput,   // input gradient only (zero-bubble "B"), its weight gradient comes later
  BackwardWeight,  // weight gradient of an earlier BackwardInput (zero-bubble "W")
  SendActivation,
  RecvActivation,
  SendGradient,
  RecvGradient,
};

// micro: the micro-batch; chunk: the stage's local model chunk 0..v-1 the action computes, or,
// for a send or receive, whose output it sends or whose input it receives; peer: for a send or
// receive, the stage on the other side (-1 otherwise).
struct Action {
  Op op = Op::Forward;
  int micro = 0;
  int chunk = 0;
  int peer = -1;
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved, ZeroBubble };

// "gpipe" | "1f1b" | "interleaved" | "zero_bubble"; InputError naming the valid values otherwise.
ScheduleKind parse_schedule(std::string_view name);
const char* schedule_name(ScheduleKind kind);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;          // p
  int micro = 1;           // m: micro-batches per step
  int virtual_stages = 1;  // v: model chunks per stage (interleaved only)
};

// Throws InputError unless stages >= 1, micro >= 1 and: interleaved has virtual_stages >= 2 and
// micro a multiple of stages (Megatron's constraint with its default micro-batch group of p); the
// other schedules have virtual_stages == 1.
void validate(const ScheduleSpec& s);

// Each stage's ordered actions (validates first).
//   gpipe: all forwards, then all backwards (fused), micro-batches in order.
//   1f1b: Megatron's non-interleaved 1F1B: p-s-1 warm-up forwards on stage s, steady one forward
//     one backward, cool-down backwards. At most p-s micro-batches in flight on stage s.
//   interleaved: Megatron's forward_backward_pipelining_with_interleaving: virtual micro-batches
//     in groups of p micro-batches per chunk, warm-up 2(p-s-1) + (v-1)p forwards (all of them
//     when m == p).
//   zero_bubble: ZB-H1 (Qi et al. 2023): 1F1B with the backward split into BackwardInput and
//     BackwardWeight; stage s runs, for x = 0 .. m+p-2, F(x), B(x-(p-1-s)), W(x-(p-1)) (each when
//     its micro-batch is in range): the input gradients keep 1F1B's rhythm and the weight
//     gradients of the last p-1 micro-batches fill the cool-down. Micro-batches whose input
//     gradient is not done stay at 1F1B's p-s per stage; those whose weight gradient is not done
//     reach p on every stage, 1F1B's peak (stage 0's). strata's model chunks keep what only the
//     input gradient reads in slots freed by it (p-s of them) and the rest for p.
std::vector<std::vector<Action>> generate(const ScheduleSpec& s);

// The stage holding global chunk g, and the global chunk of local chunk k on stage s.
inline int stage_of(int g, int stages) {
  return g % stages;
}
inline int global_chunk(int chunk, int stage, int stages) {
  return chunk * stages + stage;
}

// "F3.1" (micro 3, local chunk 1) for compute actions: F forward, B backward (fused or input), W
// weight; sends and receives as "send-act 3.1 to 2", "recv-grad 3.1 from 2".
std::string action_name(const Action& a);
// The same text written into buf (n bytes, cut to fit) without allocating, for the step's hot
// path (the flight recorder's activity); returns buf.
const char* format_action(char* buf, size_t n, const Action& a);
const char* op_name(Op op);  // "Forward", "BackwardInput", ...

// One line per stage, compute actions only (each receive comes right before and each send right
// after its compute action in generated lists): "stage 0: F0 F1 F2 B0 F3 B1 ...". Chunks are
// shown ("F3.1") when any action has a chunk other than 0.
std::string describe(const std::vector<std::vector<Action>>& lists);

}  // namespace strata::pipeline
