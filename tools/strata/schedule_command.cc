// strata schedule: a pipeline schedule's action lists, checked and simulated (bubble, makespan,
// activations in flight), and its timeline as a Chrome trace.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/pipeline/schedule.h"
#include "strata/pipeline/schedule_check.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct ScheduleArgs {
  int pp = 1, micro = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  std::string trace;
  bool trace_given = false;
  std::vector<double> costs;
};

pipeline::Costs parse_costs(const std::vector<double>& v) {
  pipeline::Costs c;
  if (v.empty()) return c;
  STRATA_INPUT_CHECK(v.size() == 3 || v.size() == 4,
                     "--costs takes F,B,W or F,B,W,SEND (forward, input gradient, weight "
                     "gradient, send), got ",
                     v.size(), " values");
  c.forward = v[0], c.backward_input = v[1], c.backward_weight = v[2];
  if (v.size() == 4) c.send = v[3];
  return c;
}

std::string join(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out;
}

void run_schedule(const ScheduleArgs& a) {
  pipeline::ScheduleSpec spec{pipeline::parse_schedule(a.schedule), a.pp, a.micro,
                              a.virtual_stages};
  const pipeline::Costs costs = parse_costs(a.costs);
  const auto lists = pipeline::generate(spec);
  const pipeline::CheckResult r = pipeline::check(spec, lists, costs);
  std::printf(
      "schedule %s: pp %d, micro-batches %d, virtual stages %d; costs F=%g B=%g W=%g "
      "send=%g\n",
      pipeline::schedule_name(spec.kind), spec.stages, spec.micro, spec.virtual_stages,
      costs.forward, costs.backward_input, costs.backward_weight, costs.send);
  std::printf("%s", pipeline::describe(lists).c_str());
  std::printf("makespan: %g\n", r.makespan);
  std::printf("bubble fraction: %.6f simulated", r.bubble_fraction);
  if (const auto closed = pipeline::closed_form_bubble(spec, costs); closed && costs.send == 0) {
    std::printf(", %.6f closed form", *closed);
  }
  std::printf("\npeak in flight per stage: %s\n", join(r.peak_in_flight).c_str());
  std::printf("peak awaiting input gradient per stage: %s\n", join(r.peak_activations).c_str());
  if (a.trace_given) {
    std::string path = a.trace;
    if (path.empty()) {
      path = std::string("schedule_") + pipeline::schedule_name(spec.kind) + "_p" +
             std::to_string(spec.stages) + "_m" + std::to_string(spec.micro) +
             (spec.virtual_stages > 1 ? "_v" + std::to_string(spec.virtual_stages) : "") + ".json";
    }
    atomic_write(path, pipeline::chrome_trace(r, spec), IoError::input);
    std::printf("trace: %s\n", path.c_str());
  }
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto args = std::make_shared<ScheduleArgs>();
  CLI::App* cmd = app.add_subcommand(
      "schedule",
      "Print a pipeline schedule per stage, its simulated bubble fraction, makespan and "
      "micro-batches in flight; optionally write its timeline as a Chrome trace (Perfetto)");
  cmd->add_option("--pp", args->pp, "pipeline stages")->required();
  cmd->add_option("--micro", args->micro, "micro-batches per step")->required();
  cmd->add_option("--schedule", args->schedule, "gpipe | 1f1b | interleaved | zero_bubble")
      ->required();
  cmd->add_option("--virtual", args->virtual_stages,
                  "model chunks per stage (interleaved only, >= 2; micro-batches a multiple of "
                  "--pp)");
  CLI::Option* trace = cmd->add_option(
      "--trace", args->trace,
      "write the timeline as Chrome trace JSON to FILE (1 cost unit = 1 ms); without FILE: "
      "schedule_<S>_p<P>_m<M>[_v<V>].json in the current directory");
  trace->expected(0, 1);
  cmd->add_option("--costs", args->costs,
                  "F,B,W[,SEND]: forward, input-gradient backward, weight-gradient backward "
                  "(a fused backward costs B+W) and send times (default 1,1,1,0)")
      ->delimiter(',');
  cmd->callback([args, trace] {
    args->trace_given = trace->count() > 0;
    run_schedule(*args);
  });
}

}  // namespace strata::cli
