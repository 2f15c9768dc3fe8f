// strata train: the flags, then one call (train/run.h).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/core/check.h"
#include "strata/pipeline/fault_injection.h"
#include "strata/train/run.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

constexpr int64_t kNoSteps = INT64_MIN;

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = kNoSteps;  // --steps, when given
  std::string run_dir;
  std::string data;
  std::string trace_steps;  // "A:B" (1-based, inclusive) or "A"
  std::string device;       // --device, when given
  std::string fault;        // "rank=R,step=S,action=N" or "rank=R,step=S,phase=P"
  std::string slow;         // "R:SECONDS" or "R:SECONDS:FROM_STEP"
  std::string resume;       // "auto" (checkpoint.dir's latest) or a checkpoint path
};

// --trace-steps: the first and last step traced.
std::pair<int64_t, int64_t> parse_trace_steps(const std::string& s) {
  if (s.empty()) return {0, -1};
  const size_t colon = s.find(':');
  const std::string a = s.substr(0, colon),
                    b = colon == std::string::npos ? a : s.substr(colon + 1);
  char* end = nullptr;
  const long long first = std::strtoll(a.c_str(), &end, 10);
  const bool ok_a = !a.empty() && *end == '\0';
  const long long last = std::strtoll(b.c_str(), &end, 10);
  const bool ok_b = !b.empty() && *end == '\0';
  STRATA_INPUT_CHECK(ok_a && ok_b && first >= 1 && last >= first, "--trace-steps ", s,
                     ": give the first and last step to trace as A:B (1-based, A <= B), e.g. 3:5");
  return {first, last};
}

RunOptions run_options(const TrainArgs& a) {
  RunOptions o;
  o.config = a.config;
  o.overrides = a.overrides;
  if (a.steps != kNoSteps) {
    STRATA_INPUT_CHECK(a.steps >= 1, "--steps ", a.steps,
                       ": give the number of optimizer steps the run trains in all, at least 1");
    o.overrides.push_back("train.steps=" + std::to_string(a.steps));
  }
  if (!a.run_dir.empty()) o.overrides.push_back("train.run_dir=\"" + a.run_dir + "\"");
  if (!a.data.empty()) o.overrides.push_back("data.path=\"" + a.data + "\"");
  if (!a.device.empty()) o.overrides.push_back("train.device=\"" + a.device + "\"");
  o.resume = a.resume;
  std::tie(o.trace_first, o.trace_last) = parse_trace_steps(a.trace_steps);
  o.faults = pipeline::parse_fault_plan(a.fault, a.slow);
  o.version = STRATA_VERSION;
  o.command_line = command_line();
  return o;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a DeepSpeed-style JSON config");
  cmd->add_option("--config,-c", args->config, "config file (DeepSpeed JSON + strata blocks)")
      ->required();
  cmd->add_option("--set", args->overrides, "override a key: --set a.b.c=value (repeatable)");
  cmd->add_option("--steps", args->steps, "optimizer steps of the run in all, >= 1 (train.steps)");
  cmd->add_option("--run-dir", args->run_dir, "directory for metrics and data (train.run_dir)");
  cmd->add_option("--data", args->data, "dataset path (data.path)");
  cmd->add_option("--device", args->device, "cpu or cuda: where each rank computes (train.device)");
  cmd->add_option("--resume", args->resume,
                  "auto (checkpoint.dir's latest, if any) or a checkpoint directory: continue "
                  "that run, in this run's layout, up to train.steps");
  cmd->add_option("--fault", args->fault,
                  "rank=R,step=S,action=N: rank R fails before its action N of step S; "
                  "rank=R,step=S,phase=P: rank R is killed in phase P (forward, backward, reduce, "
                  "optimizer, save) of step S, or hangs alive before its reduction (hang), its "
                  "first forward (hang-forward) or first backward (hang-backward) (tests)");
  cmd->add_option("--slow", args->slow,
                  "R:SECONDS[:FROM_STEP]: rank R computes SECONDS longer before each forward, "
                  "from step FROM_STEP (default 1) on: a straggler on purpose (tests)");
  cmd->add_option("--trace-steps", args->trace_steps,
                  "A:B: write every rank's actions of steps A..B (1-based) as one Chrome trace, "
                  "<run_dir>/trace.json (opens in Perfetto)");
  cmd->callback([args] { run_training(run_options(*args)); });
}

}  // namespace strata::cli
