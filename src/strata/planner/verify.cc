#include "strata/planner/verify.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "strata/core/atomic_file.h"
#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/launch/mpirun.h"
#include "strata/planner/calibrate.h"
#include "strata/planner/step_fit.h"

namespace strata::planner {

namespace {

struct Measured {
  bool ok = false;
  std::string error;
  double step_s = 0;         // the median of the runs' steps
  std::vector<double> runs;  // each run's step (bench's median of its timed steps)
  std::array<size_t, kNumMemCategories> bytes{};
  // Half the runs' range over their median: how far the machine moved the same layout.
  double spread() const {
    if (runs.size() < 2) return 0.0;
    const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
    return 0.5 * (*hi - *lo) / step_s;
  }
  // "0.1888", or with several runs "0.1888 ±2.1%".
  std::string text() const {
    char s[64];
    if (runs.size() < 2) {
      std::snprintf(s, sizeof s, "%.4f", step_s);
    } else {
      std::snprintf(s, sizeof s, "%.4f ±%.1f%%", step_s, 100.0 * spread());
    }
    return s;
  }
};

// One layout run here: bench --config on the cluster's ranks, its report read back; its files
// are `dir`/`name`.json, .report.json and .log.
Measured run_one(const planner::PlanInput& in, const planner::Row& r, const std::string& dir,
                 const std::string& name, int steps) {
  Measured m;
  const int r_stage = r.p.worst_stage;
  const std::string cfg = dir + "/" + name + ".json";
  const std::string report = dir + "/" + name + ".report.json";
  const std::string log = dir + "/" + name + ".log";
  atomic_write(cfg, planner::candidate_config(in.base, r.c).dump(2) + "\n", IoError::runtime);
  std::vector<std::string> bench = {
      "bench",    "--config", cfg,        "--steps", std::to_string(steps),
      "--warmup", "1",        "--report", report};
  const int n = in.cluster.devices;
  std::vector<std::string> argv;
  if (n == 1) {
    argv = {launch::self_executable()};
    argv.insert(argv.end(), bench.begin(), bench.end());
  } else {
    argv = launch::mpirun_command(n, "", launch::threads_per_rank(n, 0, true), bench);
  }
  std::string cmd;
  for (const std::string& a : argv) cmd.append(launch::shell_quote(a)).append(" ");
  cmd.append(">").append(launch::shell_quote(log)).append(" 2>&1");
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  std::ifstream rep(report);
  if (status != 0 || !rep) {
    std::ifstream l(log);
    std::string line, last;
    while (std::getline(l, line)) {
      if (line.find("error") != std::string::npos) last = line;
    }
    m.error = "exit " + std::to_string(launch::exit_code_of(status)) +
              (last.empty() ? "" : ": " + last) + " (log " + log + ")";
    return m;
  }
  std::stringstream text;
  text << rep.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("step_s") || !j.contains("ranks")) {
    m.error = "unreadable report " + report;
    return m;
  }
  m.step_s = j["step_s"].get<double>();
  m.runs = {m.step_s};
  // The rank the prediction is for: tensor-parallel rank 0 of the stage with the most memory.
  for (const nlohmann::json& r : j["ranks"]) {
    if (r.value("stage", -1) != r_stage || r.value("tp_rank", -1) != 0) continue;
    for (int k = 0; k < kNumMemCategories; ++k) {
      m.bytes[size_t(k)] = r["peak_bytes"].value(mem_category_name(MemCategory(k)), size_t(0));
    }
    break;
  }
  m.ok = true;
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0.0;
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// "6 timed steps each", or with several runs "2 runs of 6 timed steps each (in 2 passes over
// them)".
std::string runs_text(int steps, int repeats) {
  if (repeats <= 1) return std::to_string(steps) + " timed steps each";
  return std::to_string(repeats) + " runs of " + std::to_string(steps) + " timed steps each (in " +
         std::to_string(repeats) + " passes over them)";
}

// A layout to run: its plan input (the config's batch or the fit's other one) and its row.
struct Job {
  const planner::PlanInput* in;
  const planner::Row* row;
  int index;  // its files: row<index>[.run<k>].*
};

// Every job run `repeats` times, in passes over all of them: a slow spell of the machine (a busy
// neighbour, a minute of lower clocks) then falls on one run of several layouts rather than on
// every run of one (on the 2-core Xeon one layout's runs spread over +-5%, a few by 10%). Each
// job's step is the median of its runs' (their mean for two), its memory its first run's; a job
// failing once has failed.
std::vector<Measured> run_passes(const std::vector<Job>& jobs, const std::string& dir, int steps,
                                 int repeats) {
  std::vector<Measured> out(jobs.size());
  for (int pass = 0; pass < repeats; ++pass) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      Measured& m = out[i];
      if (pass > 0 && !m.ok) continue;
      const std::string name = "row" + std::to_string(jobs[i].index) +
                               (pass > 0 ? ".run" + std::to_string(pass + 1) : "");
      Measured run = run_one(*jobs[i].in, *jobs[i].row, dir, name, steps);
      if (pass == 0) {
        m = std::move(run);
      } else if (!run.ok) {
        m.ok = false, m.error = "run " + std::to_string(pass + 1) + ": " + run.error;
      } else {
        m.runs.push_back(run.step_s);
      }
    }
  }
  for (Measured& m : out) {
    if (m.ok) m.step_s = median(m.runs);
  }
  return out;
}

}  // namespace

void calibrate_for_plan(const std::string& config, const std::string& path) {
  check_profile_output(path, "--calibration");
  const int ranks = sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
  const std::vector<std::string> bench = {"bench", "--calibrate", "--config",
                                          config,  "--output",    path};
  std::vector<std::string> argv;
  if (ranks == 1) {
    argv = {launch::self_executable()};
    argv.insert(argv.end(), bench.begin(), bench.end());
  } else {
    argv = launch::mpirun_command(ranks, "", launch::threads_per_rank(ranks, 0, true), bench);
  }
  std::string by_hand = "strata launch -n " + std::to_string(ranks) + " --";
  for (const std::string& a : bench) by_hand.append(" ").append(launch::shell_quote(a));
  std::printf(
      "no calibration of this machine at %s: measuring it now at this config's shapes on %d "
      "rank(s) (%s); the plans after it read the file\n",
      path.c_str(), ranks, by_hand.c_str());
  std::fflush(stdout);
  std::string cmd;
  for (const std::string& a : argv) cmd.append(launch::shell_quote(a)).append(" ");
  const int code = launch::exit_code_of(std::system(cmd.c_str()));
  STRATA_INPUT_CHECK(code != 2, "could not calibrate this machine into ", path,
                     " (the reason is above): give a --calibration FILE that can be written, or "
                     "a device profile with --device FILE");
  if (code != 0) {
    STRATA_RUNTIME_FAIL("the calibration of this machine failed (exit ", code, "); run `", by_hand,
                        "` to see why");
  }
  std::printf("\n");
}

std::vector<size_t> verify_rows(const std::vector<planner::Row>& rows, int k) {
  std::vector<size_t> pick;
  size_t valid = 0;
  for (const planner::Row& r : rows) valid += r.valid() ? 1 : 0;
  for (size_t i = 0; i < valid && pick.size() < size_t(k); ++i) pick.push_back(i);
  for (size_t i = size_t(k) + 3, extra = 0; i < valid && extra < size_t(k); i += 4, ++extra) {
    pick.push_back(i);
  }
  return pick;
}

void verify_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows, int k,
                 int steps, int repeats, const std::vector<planner::Candidate>& probes) {
  STRATA_INPUT_CHECK(!in.device.gpu,
                     "--verify runs the layouts here, on the CPU: plan with "
                     "--device cpu (or a CPU profile file) to verify");
  const std::vector<size_t> pick = verify_rows(rows, k);
  char tmpl[] = "/tmp/strata_plan_verify_XXXXXX";
  STRATA_CHECK(mkdtemp(tmpl) != nullptr, "cannot create a directory under /tmp");
  const std::string dir = tmpl;
  std::printf("\nverify: %zu layouts, %s (configs and logs in %s)\n", pick.size(),
              runs_text(steps, repeats).c_str(), dir.c_str());
  std::fflush(stdout);
  std::vector<Job> jobs;
  for (size_t i : pick) jobs.push_back({&in, &rows[i], int(i + 1)});
  const std::vector<Measured> measured = run_passes(jobs, dir, steps, repeats);
  std::printf(
      "| # | layout | predicted s | measured s | error | memory per category |\n"
      "|---|---|---|---|---|---|\n");
  std::vector<double> errors;
  double fastest = 1e300, first = 0;
  int exact = 0, compared = 0, in_sample = 0;
  std::vector<double> unseen;  // the errors of the layouts the fit did not measure
  std::vector<double> spreads;
  for (size_t j = 0; j < pick.size(); ++j) {
    const size_t i = pick[j];
    const planner::Row& r = rows[i];
    const Measured& m = measured[j];
    if (!m.ok) {
      std::printf("| %zu | %s | %.4f | failed | | %s |\n", i + 1, planner::describe(r.c).c_str(),
                  r.p.step_s, m.error.c_str());
      continue;
    }
    const double err = (r.p.step_s - m.step_s) / m.step_s;
    errors.push_back(std::fabs(err));
    spreads.push_back(m.spread());
    fastest = std::min(fastest, m.step_s);
    if (i == 0) first = m.step_s;
    std::string mem;
    bool all = true;
    for (int c = 0; c < kNumMemCategories; ++c) {
      const size_t want = r.p.bytes[size_t(c)], got = m.bytes[size_t(c)];
      if (want == 0 && got == 0) continue;
      const bool same = want == got;
      // The communicators' scratch and the kernels' packing buffers are not predicted (a lower
      // bound); every other category is, exactly.
      const MemCategory cat = MemCategory(c);
      if (cat != MemCategory::CommBuffers && cat != MemCategory::Workspace) all &= same;
      if (!mem.empty()) mem.append(", ");
      mem.append(mem_category_name(MemCategory(c)));
      mem.append(" ");
      mem.append(same ? format_bytes(got) + " =" : format_bytes(want) + " vs " + format_bytes(got));
    }
    exact += all ? 1 : 0;
    ++compared;
    // A layout the fit measured too is no test of it: marked, and counted apart.
    const std::string name = planner::describe(r.c);
    const bool probe = std::any_of(probes.begin(), probes.end(), [&](const planner::Candidate& c) {
      return planner::describe(c) == name;
    });
    in_sample += probe ? 1 : 0;
    if (!probe) unseen.push_back(std::fabs(err));
    std::printf("| %zu | %s%s | %.4f | %s | %+.1f%% | %s |\n", i + 1, name.c_str(),
                probe ? " (a probe of the fit)" : "", r.p.step_s, m.text().c_str(), 100.0 * err,
                mem.c_str());
  }
  STRATA_CHECK(!errors.empty(),
               "verify: no layout ran (see the failures above and their logs "
               "in ",
               dir, ")");
  std::printf(
      "verify: %d layouts ran; step time error median %.1f%%, worst %.1f%%; model states, "
      "activations and checkpoints exact for %d of %d (communication buffers and workspace: "
      "lower bounds); the first choice measured %.4f s, the fastest %.4f s (%+.1f%%); %d of "
      "the layouts were probes of the fit",
      compared, 100.0 * median(errors), 100.0 * *std::max_element(errors.begin(), errors.end()),
      exact, compared, first, fastest, first > 0 ? 100.0 * (first - fastest) / fastest : 0.0,
      in_sample);
  if (in_sample > 0 && !unseen.empty()) {
    std::printf(" (the others: median %.1f%%, worst %.1f%%)", 100.0 * median(unseen),
                100.0 * *std::max_element(unseen.begin(), unseen.end()));
  }
  if (repeats > 1) {
    std::printf("; one layout's runs within ±%.1f%% of their median (median), ±%.1f%% (worst)",
                100.0 * median(spreads), 100.0 * *std::max_element(spreads.begin(), spreads.end()));
  }
  std::printf("\n");
}

// The rows a fit's "leading" probes are drawn from: beyond the 30 --verify 6 samples.
constexpr size_t kLeadingRows = 48;
// How much more a leading probe weighs in the fit than another.
constexpr double kLeadingWeight = 10.0;

cost::StepFit fit_plan(const planner::PlanInput& in, const std::vector<planner::Row>& rows, int k,
                       int steps, int repeats, const std::string& profile_path,
                       const std::string& source, int verify_k,
                       std::vector<planner::Candidate>* probed) {
  STRATA_INPUT_CHECK(!in.device.gpu,
                     "--fit runs probe layouts here, on the CPU: plan with --device cpu (or a CPU "
                     "profile file)");
  STRATA_INPUT_CHECK(k >= 8, "--fit ", k, ": a step fit has eight terms; give at least 8 probes");
  // A quarter of the probes at half the config's global batch (twice it when odd): the same
  // kinds of layout over half the compute, so that the fit can tell what grows with the model's
  // work from what each step costs whatever the work (on one batch those move together, and a
  // fit read on one model then misjudged the others). Not more: the model does not miss the
  // measured step by the same share at both (with half the probes at each, the fit read the
  // 2-core Xeon's steps 0-12% over at half the batch and 3-11% under at the config's), and the
  // plan is for the config's.
  planner::PlanInput other = in;
  const int64_t batch = in.base.value("train_batch_size", int64_t(0));
  other.base["train_batch_size"] = batch % 2 == 0 ? batch / 2 : batch * 2;
  const std::vector<planner::Row> other_rows = planner::plan(other);
  size_t valid = 0, other_valid = 0;
  for (const planner::Row& r : rows) valid += r.valid() ? 1 : 0;
  for (const planner::Row& r : other_rows) other_valid += r.valid() ? 1 : 0;
  STRATA_INPUT_CHECK(valid >= 8, "--fit needs at least 8 valid layouts to probe; this plan has ",
                     valid);
  // At each batch, half the probes spread evenly over the whole ranking (best and worst
  // included: every term of the fit sees a range), half over its leading rows, where the plan's
  // choice is made (a fit read far from there misjudged the best layouts by one bias); at the
  // config's batch, none of the rows --verify will run, so that the verification stays a test.
  std::vector<const planner::Row*> pick;
  auto spread = [&](const std::vector<planner::Row>& from, size_t valid_rows, size_t count,
                    const std::vector<size_t>& skip) {
    // n of the rows `among` not picked yet, evenly (the first and the last included); how many.
    auto evenly = [&](std::vector<size_t> among, size_t n) {
      std::erase_if(among, [&](size_t i) {
        return std::find(pick.begin(), pick.end(), &from[i]) != pick.end();
      });
      n = std::min(n, among.size());
      for (size_t i = 0; i < n; ++i) {
        pick.push_back(&from[among[n == 1 ? 0 : (i * (among.size() - 1) + (n - 1) / 2) / (n - 1)]]);
      }
      return n;
    };
    std::vector<size_t> all, unverified, near;
    for (size_t i = 0; i < valid_rows; ++i) {
      all.push_back(i);
      if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
      unverified.push_back(i);
      if (i < kLeadingRows) near.push_back(i);
    }
    size_t left = count - evenly(unverified, count - count / 2);
    left -= evenly(near, left);
    left -= evenly(unverified, left);  // few leading rows: others
    evenly(all, left);                 // few rows at all: the verified ones too
  };
  const size_t others = other_valid >= 2 ? std::min(other_valid, size_t(k) / 4) : 0;
  spread(rows, valid, size_t(k) - others, verify_rows(rows, verify_k));
  const size_t first = pick.size();  // at the config's batch; the rest at the other
  spread(other_rows, other_valid, others, {});
  char tmpl[] = "/tmp/strata_plan_fit_XXXXXX";
  STRATA_CHECK(mkdtemp(tmpl) != nullptr, "cannot create a directory under /tmp");
  const std::string dir = tmpl;
  std::printf(
      "\nfit: %zu probe layouts (%zu at batch %lld, %zu at %lld), %s (configs and logs in %s)\n",
      pick.size(), first, static_cast<long long>(batch), pick.size() - first,
      static_cast<long long>(other.base["train_batch_size"].get<int64_t>()),
      runs_text(steps, repeats).c_str(), dir.c_str());
  std::fflush(stdout);
  std::vector<Job> jobs;
  for (size_t i = 0; i < pick.size(); ++i)
    jobs.push_back({i < first ? &in : &other, pick[i], int(i + 1)});
  const std::vector<Measured> measured = run_passes(jobs, dir, steps, repeats);
  std::vector<planner::StepSample> samples;
  std::vector<size_t> used;
  for (size_t i = 0; i < pick.size(); ++i) {
    const planner::Row& r = *pick[i];
    const Measured& m = measured[i];
    if (!m.ok) {
      std::printf("probe %zu %s failed: %s\n", i + 1, planner::describe(r.c).c_str(),
                  m.error.c_str());
      continue;
    }
    if (probed != nullptr && i < first) probed->push_back(r.c);
    // A probe from its ranking's leading rows weighs kLeadingWeight times the others: the plan's
    // choice is made there, and the model's misses are not the same far from it (ZeRO-3, full
    // recompute, context parallelism over every rank). The others keep every term's range in
    // view. (Refitting each of 14 earlier fits' probes left out one at a time: the leading ones'
    // median error 6.1% at equal weights, 4.5% at ten times, the others' 7.2% at both.)
    const std::vector<planner::Row>& from = i < first ? rows : other_rows;
    const bool leading = size_t(pick[i] - from.data()) < kLeadingRows;
    samples.push_back({r.p.model_step_s, r.p.collectives, r.p.messages, r.p.kernel_calls,
                       r.p.gathers, r.p.tp_beside_reductions, r.p.contended_collectives, m.step_s,
                       leading ? kLeadingWeight : 1.0});
    used.push_back(i);
  }
  cost::StepFit f = planner::fit_step(samples, in.cluster.per_node);
  f.source = source;
  std::printf(
      "| # | layout | batch | weight | collectives | gathers | messages | kernel calls | tp beside "
      "reductions | contended tp/cp | model s | fitted s | measured s | error |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<double> errors;
  for (size_t j = 0; j < samples.size(); ++j) {
    const planner::StepSample& s = samples[j];
    const double fit = planner::fitted_step(f, s);
    errors.push_back(std::fabs(fit - s.measured_s) / s.measured_s);
    const planner::Candidate& c = pick[used[j]]->c;
    std::printf(
        "| %zu | %s | %lld | %g | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.4f | %.4f | %s | "
        "%+.1f%% |\n",
        used[j] + 1, planner::describe(c).c_str(),
        static_cast<long long>(int64_t(c.dp) * c.micro_batch * c.accumulation), s.weight,
        s.collectives, s.gathers, s.messages, s.calls, s.tp_beside, s.contended, s.model_s, fit,
        measured[used[j]].text().c_str(), 100.0 * (fit - s.measured_s) / s.measured_s);
  }
  std::printf(
      "fit at %d ranks per node: step = %.3f x model + %.1f us x collectives + %.1f us x messages "
      "+ %.2f us x kernel calls + %.1f us x ZeRO-3 gathers + %.1f us x tp collectives beside "
      "reductions + %.1f us x contended tp/cp collectives + %.1f us; error on the probes median "
      "%.1f%%, worst %.1f%%\n",
      f.ranks_per_node, f.model_scale, f.per_collective_s * 1e6, f.per_message_s * 1e6,
      f.per_call_s * 1e6, f.per_gather_s * 1e6, f.per_tp_beside_s * 1e6, f.per_contended_s * 1e6,
      f.per_step_s * 1e6, 100.0 * median(errors),
      100.0 * *std::max_element(errors.begin(), errors.end()));
  cost::DeviceProfile p = cost::read_profile(profile_path);
  std::erase_if(p.step_fits,
                [&](const cost::StepFit& g) { return g.ranks_per_node == f.ranks_per_node; });
  p.step_fits.push_back(f);
  cost::write_profile(p, profile_path);
  std::printf("wrote the fit into %s\n", profile_path.c_str());
  return f;
}

}  // namespace strata::planner
