// Validates any per-stage action lists (schedule.h) and simulates their timeline: the figure the
// executor's measured idle time is compared with (DESIGN.md §6).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "strata/pipeline/schedule.h"

namespace strata::pipeline {

// Durations in arbitrary units (the trace maps 1 unit to 1 ms). A fused Backward costs
// backward_input + backward_weight; send is the time from a send's issue to its arrival (the
// sender does not wait for it).
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1, send = 0;
};

struct TimedAction {
  int stage = 0;
  Action action;
  double start = 0, end = 0;
};

struct CheckResult {
  double makespan = 0;         // time until the last action ends
  double bubble_fraction = 0;  // 1 - Σ compute time / (stages × makespan)
  // Per stage: the most (micro-batch, chunk) pairs whose Forward ran and whose weight gradient
  // (BackwardWeight, or fused Backward) has not.
  std::vector<int> peak_in_flight;
  // Per stage: the most pairs whose Forward ran and whose input gradient (BackwardInput, or fused
  // Backward) has not: those still holding all their activations (after BackwardInput only what
  // the weight gradient reads is kept).
  std::vector<int> peak_activations;
  // The compute actions, stage by stage in list order, with their simulated times.
  std::vector<TimedAction> timeline;
};

// Checks the lists against the spec's stages, micro-batches and virtual stages (its kind is not
// used) and simulates them: each stage runs its list in order from time 0; a compute action takes
// its cost; a send is issued at the stage's current time and arrives `send` later; a receive waits
// until its message arrived. Throws InputError naming the stage, the action's position and the
// action on the first violation of:
//  - every action's micro-batch, chunk and peer in range, and a send or receive only where the
//    chunk has that neighbour (the first global chunk receives no activation and sends no
//    gradient; the last sends no activation and receives no gradient);
//  - per stage, in list order: a Forward after its RecvActivation, a Backward/BackwardInput after
//    its Forward and its RecvGradient, a BackwardWeight after its BackwardInput, a send after the
//    compute action that produces its message; no compute action twice;
//  - peak in-flight at most max_in_flight (0: no bound);
//  - every (micro-batch, chunk) has one Forward and either one Backward or one BackwardInput and
//    one BackwardWeight;
//  - every send matched by exactly one receive of the same message on its peer, and every
//    receive by exactly one send;
//  - no deadlock: when every unfinished stage waits on a receive whose send is not issued, the
//    message names each stage, what it waits for and where that send is.
// stage_scale (optional, one factor per stage): stage s's compute actions take stage_scale[s]
// times the costs (stages of unequal work, e.g. the head's logits on the last).
CheckResult check(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists,
                  const Costs& c = {}, int max_in_flight = 0,
                  const std::vector<double>& stage_scale = {});

// The makespan of valid lists (check() passed) when the pipeline's ranks share CPU cores:
// rank_cpu[s] lists the cores stage s's ranks are pinned to (one entry a rank: its tensor-,
// context- and data-parallel peers run the same list in step). At each moment a stage's compute
// action progresses at 1 / (the ranks with a compute action to run on its most loaded core), as
// the OS's scheduler shares a core between runnable processes; a stage waiting on a receive
// leaves its core to the others. tail[s] (optional): work each rank of stage s does after its
// list (the data-parallel reductions and the optimizer step), shared the same way. With a core
// per rank it is check()'s makespan plus the largest tail.
struct SharedResult {
  double makespan = 0;
  // Per stage: the share of its compute actions' work done while one of its cores also ran a
  // rank of another stage (or another stage's tail). A tensor- or context-parallel collective
  // issued then waits for a peer the scheduler may have switched away from.
  std::vector<double> contended;
};
SharedResult shared_makespan(const ScheduleSpec& s, const std::vector<std::vector<Action>>& lists,
                             const Costs& c, const std::vector<double>& stage_scale,
                             const std::vector<std::vector<int>>& rank_cpu,
                             const std::vector<double>& tail = {});

// The bubble fraction the literature gives, with sends free, in check's definition (idle time
// over stages × makespan; a bubble B relative to the ideal time I is B / (B + I)):
//   gpipe, 1f1b: (p-1)/(m+p-1) (arXiv 2104.04473 §2.2: bubble (p-1)/m of the ideal time);
//   interleaved: (p-1)/(v·m+p-1) (the same paper: bubble (p-1)/(v·m) of the ideal time, v times
//     smaller);
//   zero_bubble (ZB-H1), for m >= p: bubble (p-1)(F+B-W) against the ideal m(F+B+W) (arXiv
//     2401.10241 §3.1, which takes W <= F, B); in general (p-1)(F+B-min(F,B,W)): the warm-up's
//     (p-1)F and the cool-down's chain of input gradients (p-1)B remain whatever W is.
// Each is exactly what check() simulates for the generated lists with any costs and send = 0.
// nullopt for zero_bubble with m < p.
std::optional<double> closed_form_bubble(const ScheduleSpec& s, const Costs& c = {});

// Chrome trace JSON (opens in Perfetto or chrome://tracing): one "X" event per compute action,
// pid 0, tid = stage, named "F3.1" / "B3.1" / "W3.1" (micro.chunk), 1 cost unit = 1000 us.
std::string chrome_trace(const CheckResult& r, const ScheduleSpec& s);

}  // namespace strata::pipeline
