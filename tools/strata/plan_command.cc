// strata plan: every layout of a config's model and global batch on a cluster, refused with
// train's first reason or predicted (memory per rank, step time = compute + bubble + exposed
// communication), ranked; one row explained or written out as a config (planner/search.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/text.h"
#include "strata/cost/device_profile.h"
#include "strata/planner/search.h"
#include "strata/planner/verify.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct PlanArgs {
  std::string config, hostfile, device = "cpu", calibration, emit, explain_what;
  int devices = 0, per_node = 0, top = 10, verify = 0, row = 1, verify_steps = 3, fit = 0;
  int verify_repeats = 2;
  bool rejected = false;
};

planner::Cluster cluster_of(const PlanArgs& a) {
  STRATA_INPUT_CHECK(a.devices >= 1, "strata plan needs --devices N (the ranks to plan for)");
  STRATA_INPUT_CHECK(a.hostfile.empty() || a.per_node == 0,
                     "give --hostfile or --devices-per-node, not both");
  if (!a.hostfile.empty()) {
    planner::Cluster c;
    c.devices = a.devices;
    c.hosts = comm::parse_hostfile(a.hostfile);
    int slots = 0;
    for (const auto& [h, n] : c.hosts) slots += n, c.per_node = std::max(c.per_node, n);
    STRATA_INPUT_CHECK(slots >= a.devices, "hostfile ", a.hostfile, " provides ", slots,
                       " slots for --devices ", a.devices, "; add hosts or slots");
    return c;
  }
  return planner::uniform_cluster(a.devices, a.per_node > 0 ? a.per_node : a.devices);
}

std::string gib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(b) / 1073741824.0);
  return s;
}

void print_table(const std::vector<planner::Row>& rows, int top) {
  std::printf(
      "| # | layout | GiB/rank | compute s | bubble s | comm s (tp+cp+ep+pp+dp exposed) | step s | "
      "tokens/s | MFU |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < top && i < int(rows.size()) && rows[size_t(i)].valid(); ++i) {
    const planner::Prediction& p = rows[size_t(i)].p;
    std::printf("| %d | %s | %s | %.4f | %.4f | %.4f | %.4f | %.0f | %.1f%% |\n", i + 1,
                planner::describe(rows[size_t(i)].c).c_str(), gib(p.device_bytes).c_str(),
                p.compute_s, p.bubble_s,
                p.tp_comm_s + p.cp_comm_s + p.ep_comm_s + p.pp_comm_s + p.dp_exposed_s, p.step_s,
                p.tokens_per_s, 100.0 * p.mfu);
  }
}

// The refusals grouped by their reason's first words, most frequent first, with one layout each.
void print_rejections(const std::vector<planner::Row>& rows, bool all) {
  std::map<std::string, std::pair<int, const planner::Row*>> by;
  for (const planner::Row& r : rows) {
    if (r.valid()) continue;
    std::string key = r.reason.substr(0, std::min<size_t>(r.reason.size(), 60));
    auto& e = by[key];
    if (e.first++ == 0) e.second = &r;
  }
  std::vector<std::pair<int, const planner::Row*>> list;
  for (const auto& [k, e] : by) list.push_back(e);
  std::sort(list.begin(), list.end(),
            [](const auto& x, const auto& y) { return x.first > y.first; });
  std::printf("refused, by first reason (%s):\n", all ? "all"
                                                      : "the 8 most frequent; --rejected "
                                                        "for all");
  for (size_t i = 0; i < list.size() && (all || i < 8); ++i) {
    std::printf("  %5d  e.g. %s: %s\n", list[i].first, planner::describe(list[i].second->c).c_str(),
                list[i].second->reason.c_str());
  }
}

void run_plan(const PlanArgs& a) {
  planner::PlanInput in;
  in.base = read_config_json(a.config);
  in.cluster = cluster_of(a);
  const std::string calib =
      a.calibration.empty() ? cost::default_calibration_path() : a.calibration;
  if (a.device == "cpu" && !std::filesystem::exists(calib))
    planner::calibrate_for_plan(a.config, calib);
  in.device = cost::load_profile(a.device, calib);
  if (in.device.gpu && a.hostfile.empty() && a.per_node == 0) {
    in.cluster = planner::uniform_cluster(a.devices, std::max(1, in.device.devices_per_node));
  }
  STRATA_INPUT_CHECK(a.verify == 0 || !in.device.gpu,
                     "--verify runs the layouts here, on the CPU: plan with --device cpu (or a "
                     "CPU profile file) to verify");
  STRATA_INPUT_CHECK(a.fit == 0 || !in.device.gpu,
                     "--fit runs probe layouts here, on the CPU: plan with --device cpu (or a CPU "
                     "profile file)");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<planner::Row> rows = planner::plan(in);
  const Config base = parse_config(in.base);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int valid = 0;
  for (const planner::Row& r : rows) valid += r.valid() ? 1 : 0;
  std::printf(
      "model %s: %d layers, hidden %d, seq %d; global batch %lld; %d ranks, %d per node\n"
      "device %s (%s)\n%zu layouts: %d valid, %zu refused; planned in %.2f s\n\n",
      base.model.family.c_str(), base.model.layers, base.model.hidden, base.model.seq_len,
      static_cast<long long>(in.base["train_batch_size"].get<int64_t>()), in.cluster.devices,
      in.cluster.per_node, in.device.name.c_str(), in.device.source.c_str(), rows.size(), valid,
      rows.size() - size_t(valid), secs);
  if (!in.device.gpu) {
    const cost::StepFit* f = in.device.step_fit(in.cluster.per_node);
    if (f != nullptr) {
      std::printf("step fit at %d ranks per node: %s\n\n", f->ranks_per_node, f->source.c_str());
    } else {
      std::printf(
          "no step fit at %d ranks per node: the model's step (strata plan --fit K measures "
          "one)\n\n",
          in.cluster.per_node);
    }
  }
  STRATA_INPUT_CHECK(valid > 0 || !a.explain_what.empty(),
                     "no layout of this model and batch fits ", in.cluster.devices, " ranks of ",
                     in.device.name, ": ",
                     rows.empty() ? std::string("none was possible") : rows.front().reason);
  print_table(rows, a.top);
  std::printf("\n");
  print_rejections(rows, a.rejected);
  if (!a.explain_what.empty()) {
    // A row number of the table, or a layout as the table writes it.
    const planner::Row* r = nullptr;
    char* end = nullptr;
    const long n = std::strtol(a.explain_what.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && n >= 1 && n <= valid) {
      r = &rows[size_t(n - 1)];
    } else {
      for (const planner::Row& x : rows) {
        if (planner::describe(x.c) == a.explain_what) r = &x;
      }
    }
    STRATA_INPUT_CHECK(
        r != nullptr, "--explain ", a.explain_what, ": not a row number (1..", valid,
        ") nor a layout of the table (e.g. \"",
        valid > 0 ? planner::describe(rows.front().c) : std::string("dp1 tp1 pp1 z0 mb1x1"), "\")");
    std::printf("\n%s", planner::explain(in, *r).c_str());
  }
  if (!a.emit.empty()) {
    STRATA_INPUT_CHECK(a.row >= 1 && a.row <= valid, "--row ", a.row, ": the table has ", valid,
                       " valid rows");
    const planner::Row& r = rows[size_t(a.row - 1)];
    atomic_write(a.emit, planner::candidate_config(in.base, r.c).dump(2) + "\n", IoError::input);
    std::printf("\nwrote %s: row %d, %s\n", a.emit.c_str(), a.row, planner::describe(r.c).c_str());
  }
  std::vector<planner::Candidate> probed;  // by --fit at the config's batch
  if (a.fit > 0) {
    const std::string path = a.device == "cpu" ? calib : a.device;
    const std::string source = "strata plan --fit " + std::to_string(a.fit) + " on " + a.config +
                               " at " + std::to_string(a.devices) + " ranks, " +
                               utc_now(kUtcMinute);
    planner::fit_plan(in, rows, a.fit, a.verify_steps, a.verify_repeats, path, source, a.verify,
                      &probed);
    in.device = cost::read_profile(path);
    rows = planner::plan(in);
    std::printf("\nwith the fit:\n");
    print_table(rows, a.top);
  }
  if (a.verify > 0)
    planner::verify_plan(in, rows, a.verify, a.verify_steps, a.verify_repeats, probed);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "The best layouts of a config's model and global batch on a cluster, predicted");
  cmd->add_option("--config", args->config,
                  "DeepSpeed-style JSON config (its model and "
                  "train_batch_size)")
      ->required();
  cmd->add_option("--devices", args->devices, "ranks to plan for (GPUs, or CPU ranks)")->required();
  cmd->add_option("--hostfile", args->hostfile, "OpenMPI hostfile: the nodes and their slots");
  cmd->add_option("--devices-per-node", args->per_node,
                  "ranks per node (default: every rank on one node; a GPU profile's 8)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--device", args->device,
                  "cpu (this machine, as --calibration measured it), a100, h100, h200, or a "
                  "device profile file")
      ->capture_default_str();
  cmd->add_option("--calibration", args->calibration,
                  "the CPU calibration file (default: $STRATA_CALIBRATION or "
                  "~/.cache/strata/calibration.json), measured first by strata bench "
                  "--calibrate at the config's shapes where it does not exist");
  cmd->add_option("--top", args->top, "rows of the table")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--explain", args->explain_what,
                  "a row number or layout: its memory by category and time split");
  cmd->add_option("--emit-config", args->emit, "write the config of --row (default 1) here");
  cmd->add_option("--row", args->row, "the row --emit-config writes")->capture_default_str();
  cmd->add_option("--verify", args->verify,
                  "run the top K rows and a sample of others here and compare with the "
                  "prediction")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--fit", args->fit,
                  "run K probe layouts here and fit the step's overheads at these ranks per node "
                  "into the CPU profile (--calibration, or --device FILE)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--verify-steps", args->verify_steps, "timed steps per verified or probe row")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--verify-repeats", args->verify_repeats,
                  "runs of each verified or probe row, in passes over them (its step: the median "
                  "of its runs')")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--rejected", args->rejected, "list every refusal reason, not the 8 commonest");
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace strata::cli
