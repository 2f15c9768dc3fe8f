// strata plan through the CLI: the ranked table for a GPU cluster, a row written as a config that
// `strata train` runs as is on 2 ranks, one row explained, rows verified by runs here, and bad
// input refused with exit 2, a message naming what to fix, and no file written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "strata/planner/search.h"
#include "tests/cli/fixture.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// gpt2-tiny: 2 layers, hidden 32, 4 heads, vocab 64 (good.bin's ids are < 64), seq 16.
constexpr const char* kTiny = R"({"train_batch_size": 4, "model": {"preset": "gpt2-tiny"}})";
constexpr const char* kGpt2 =
    R"({"train_batch_size": 64, "bf16": {"enabled": true}, "model": {"preset": "gpt2-124M"}})";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The cells of a markdown table row "| a | b | c |": {"a", "b", "c"}.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  size_t at = row.find('|');
  while (at != std::string::npos) {
    const size_t next = row.find('|', at + 1);
    if (next == std::string::npos) break;
    std::string c = row.substr(at + 1, next - at - 1);
    c.erase(0, c.find_first_not_of(' '));
    c.erase(c.find_last_not_of(' ') + 1);
    out.push_back(c);
    at = next;
  }
  return out;
}

// The step a `strata bench --report` file records.
double step_of(const std::string& report) {
  std::ifstream in(report);
  EXPECT_TRUE(in) << "no report " << report;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() ? j.value("step_s", 0.0) : 0.0;
}

// The rows of the layout table: "| 1 | dp2 tp1 pp1 z3 mb2x1 | ... |" split into cells.
std::vector<std::vector<std::string>> table_rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : lines_of(out)) {
    if (std::regex_search(line, std::regex("^\\| [0-9]+ \\| dp[0-9]+ tp"))) {
      rows.push_back(cells(line));
    }
  }
  return rows;
}

const std::string kTableHeader =
    "| # | layout | GiB/rank | compute s | bubble s | comm s (tp+cp+ep+pp+dp exposed) | step s | "
    "tokens/s | MFU |";

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_cli_dir("strata_plan_cli");
    ASSERT_FALSE(dir_.empty());
    write(path("tiny.json"), kTiny);
    write(path("gpt2.json"), kGpt2);
  }
  void TearDown() override {
    std::error_code ec;
    for (const std::string& d : verify_dirs_) fs::remove_all(d, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  static void write(const std::string& file, const std::string& text) {
    std::ofstream(file, std::ios::binary) << text;
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Exit status of `strata <args>`; its stderr in *err, its stdout in out().
  int strata(const std::string& args, std::string* err = nullptr) {
    return run_binary(STRATA_BINARY, dir_, args, err);
  }
  std::string out() const { return read(path("stdout.txt")); }
  // A profile of this machine, as `strata bench --calibrate` writes it (one thread: ~6 s).
  std::string calibrate() {
    setenv("OMP_NUM_THREADS", "1", 1);
    const std::string cal = path("cal.json");
    std::string err;
    EXPECT_EQ(strata("bench --calibrate --output '" + cal + "'", &err), 0) << err;
    return cal;
  }
  // The files in the test's directory, but the binary's stdout and stderr captures.
  std::set<std::string> files() const {
    std::set<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name != "stdout.txt" && name != "stderr.txt") out.insert(name);
    }
    return out;
  }
  std::string dir_;
  std::vector<std::string> verify_dirs_;  // --verify's configs and logs, under /tmp
};

TEST_F(PlanCli, RanksTheLayoutsOfGpt2OnTwoH100Nodes) {
  std::string err;
  ASSERT_EQ(strata("plan --config '" + path("gpt2.json") +
                       "' --device h100 --devices 16 --devices-per-node 8",
                   &err),
            0)
      << err;
  const std::string text = out();
  EXPECT_NE(text.find("model gpt2: 12 layers, hidden 768, seq 1024; global batch 64; 16 ranks, "
                      "8 per node\n"),
            std::string::npos)
      << text;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      text, m,
      std::regex("\n([0-9]+) layouts: ([0-9]+) valid, ([0-9]+) refused; planned in [0-9.]+ s\n")))
      << text;
  const long total = std::stol(m[1]), valid = std::stol(m[2]), refused = std::stol(m[3]);
  EXPECT_GT(valid, 0);
  EXPECT_GT(refused, 0);  // heads 12 refuse tp 8 and 16
  EXPECT_EQ(total, valid + refused);
  EXPECT_NE(text.find(kTableHeader + "\n|---|---|---|---|---|---|---|---|---|\n"),
            std::string::npos)
      << text;
  const auto rows = table_rows(text);
  ASSERT_GE(rows.size(), 3u) << text;
  EXPECT_LE(rows.size(), 10u);  // --top's default
  double last = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 9u) << text;
    EXPECT_EQ(rows[i][0], std::to_string(i + 1));
    const double step = std::stod(rows[i][6]);
    EXPECT_GT(step, 0.0) << rows[i][1];
    EXPECT_GE(step, last) << "rows are ranked by predicted step time: " << rows[i][1];
    last = step;
    // Every layout the table offers uses the 16 ranks.
    std::smatch d;
    ASSERT_TRUE(std::regex_search(rows[i][1], d,
                                  std::regex("^dp([0-9]+) tp([0-9]+)(\\+sp)? "
                                             "pp([0-9]+)")))
        << rows[i][1];
    EXPECT_EQ(std::stoi(d[1]) * std::stoi(d[2]) * std::stoi(d[4]), 16) << rows[i][1];
  }
  const size_t section = text.find("\nrefused, by first reason (");
  ASSERT_NE(section, std::string::npos) << text;
  EXPECT_TRUE(std::regex_search(text.substr(section),
                                std::regex("\n +[0-9]+  e\\.g\\. dp[0-9]+ tp[0-9]+[^:]*: .+")))
      << text.substr(section);

  // With --rejected every refusal is listed: the groups' counts add up to the refused.
  ASSERT_EQ(strata("plan --config '" + path("gpt2.json") +
                       "' --device h100 --devices 16 --devices-per-node 8 --rejected",
                   &err),
            0)
      << err;
  const std::string all = out();
  const size_t at = all.find("\nrefused, by first reason (all):\n");
  ASSERT_NE(at, std::string::npos) << all;
  long listed = 0;
  for (const std::string& line : lines_of(all.substr(at + 1))) {
    std::smatch g;
    if (std::regex_search(line, g, std::regex("^ +([0-9]+)  e\\.g\\. "))) listed += std::stol(g[1]);
  }
  EXPECT_EQ(listed, refused);
}

// The row's layout as describe() writes it, read back from the config --emit-config wrote.
std::string layout_of(const nlohmann::json& j) {
  planner::Candidate c;
  const nlohmann::json& p = j.at("parallelism");
  c.tp = p.at("tensor").get<int>();
  c.pp = p.at("pipeline").get<int>();
  c.sequence_parallel = p.at("sequence_parallel").get<bool>();
  c.schedule = p.at("schedule").get<std::string>();
  c.virtual_stages = p.at("virtual_stages").get<int>();
  c.zero = j.at("zero_optimization").at("stage").get<int>();
  c.mics = j["zero_optimization"].value("mics_shard_size", int64_t(-1));
  c.micro_batch = j.at("train_micro_batch_size_per_gpu").get<int64_t>();
  c.accumulation = j.at("gradient_accumulation_steps").get<int64_t>();
  c.dp = int(j.at("train_batch_size").get<int64_t>() / (c.micro_batch * c.accumulation));
  if (j.contains("activation_checkpointing")) {
    c.recompute = j["activation_checkpointing"].at("recompute_granularity").get<std::string>();
  }
  return planner::describe(c);
}

// A first plan on a CPU calibrates this machine itself, saying so, into a calibration file that
// does not exist yet (its directory neither); the next plan reads it.
TEST_F(PlanCli, AnEmittedConfigTrainsAsIsOnTwoRanks) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string cal = path("cache/strata/cal.json");
  const std::string emitted = path("row1.json");
  std::string err;
  ASSERT_EQ(strata("plan --config '" + path("tiny.json") +
                       "' --devices 2 --device cpu "
                       "--calibration '" +
                       cal + "'",
                   &err),
            0)
      << err;
  EXPECT_NE(out().find("no calibration of this machine at " + cal + ": measuring it now"),
            std::string::npos)
      << out();
  ASSERT_TRUE(fs::exists(cal));
  const auto calibrated = fs::last_write_time(cal);
  ASSERT_EQ(strata("plan --config '" + path("tiny.json") +
                       "' --devices 2 --device cpu "
                       "--calibration '" +
                       cal + "' --emit-config '" + emitted + "' --row 1",
                   &err),
            0)
      << err;
  const std::string text = out();
  EXPECT_EQ(text.find("no calibration"), std::string::npos) << text;
  EXPECT_EQ(fs::last_write_time(cal), calibrated);
  const auto rows = table_rows(text);
  ASSERT_FALSE(rows.empty()) << text;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("\nwrote (.+): row 1, (.+)\n"))) << text;
  EXPECT_EQ(m[1].str(), emitted);
  const std::string layout = m[2];
  EXPECT_EQ(layout, rows[0][1]);  // the table's first row
  ASSERT_TRUE(fs::exists(emitted));
  const nlohmann::json j = nlohmann::json::parse(read(emitted), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << read(emitted);
  EXPECT_EQ(layout_of(j), layout) << j.dump(2);
  EXPECT_EQ(j["train_batch_size"], 4);  // the global batch is the user's
  EXPECT_EQ(j["model"], nlohmann::json({{"preset", "gpt2-tiny"}}));
  std::smatch d;
  ASSERT_TRUE(std::regex_search(layout, d, std::regex("^dp([0-9]+) tp([0-9]+)")));
  EXPECT_EQ(std::stoi(d[1]) * std::stoi(d[2]) * j["parallelism"]["pipeline"].get<int>(), 2);
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }

  const std::string run = path("run");
  ASSERT_EQ(strata("launch -n 2 -- train --config '" + emitted + "' --data '" + path("good.bin") +
                       "' --steps 2 --run-dir '" + run + "'",
                   &err),
            0)
      << layout << "\n"
      << err;
  EXPECT_EQ(lines_of(read(run + "/metrics.jsonl")).size(), 2u) << layout;
}

TEST_F(PlanCli, ExplainGivesEveryMemoryCategoryAndTheStepSplit) {
  std::string err;
  ASSERT_EQ(strata("plan --config '" + path("gpt2.json") +
                       "' --device h100 --devices 16 --devices-per-node 8 --explain 1",
                   &err),
            0)
      << err;
  const std::string text = out();
  const auto rows = table_rows(text);
  ASSERT_FALSE(rows.empty()) << text;
  // The explanation follows the refusals: the row's layout, then its memory, then its time.
  const size_t at = text.find("\n\n" + rows[0][1] + "\nmemory per rank (stage ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string explained = text.substr(at);
  for (const char* name :
       {"params", "master_params", "grads", "optimizer_state", "activations",
        "checkpointed_activations", "comm_buffers", "workspace", "host_checkpoints"}) {
    EXPECT_TRUE(std::regex_search(
        explained, std::regex(std::string("\n  ") + name + " +[0-9.]+ (B|KiB|MiB|GiB)\n")))
        << name << " missing from\n"
        << explained;
  }
  std::string step;
  for (const std::string& line : lines_of(explained)) {
    if (starts_with(line, "step ")) step = line;
  }
  ASSERT_FALSE(step.empty()) << explained;
  // The same step time as the table's row 1.
  EXPECT_TRUE(starts_with(step, "step " + rows[0][6] + " s = compute ")) << step;
}

TEST_F(PlanCli, VerifyRunsRowsHereAndMatchesTheirMemory) {
  const std::string cal = calibrate();
  std::string err;
  ASSERT_EQ(strata("plan --config '" + path("tiny.json") + "' --devices 2 --device '" + cal +
                       "' --verify 1 --verify-steps 2",
                   &err),
            0)
      << err;
  const std::string text = out();
  std::smatch m;
  // Each layout run twice by default, in two passes over them.
  ASSERT_TRUE(std::regex_search(
      text, m,
      std::regex("\nverify: ([0-9]+) layouts, 2 runs of 2 timed steps each \\(in 2 passes over "
                 "them\\) \\(configs and logs in (.+)\\)\n")))
      << text;
  const std::string dir = m[2];
  const int picked = std::stoi(m[1]);
  verify_dirs_.push_back(m[2]);
  EXPECT_GE(picked, 1);
  const size_t at = text.find(
      "\n| # | layout | predicted s | measured s | error | memory per category |\n"
      "|---|---|---|---|---|---|\n");
  ASSERT_NE(at, std::string::npos) << text;
  int ran = 0;
  for (const std::string& line : lines_of(text.substr(at + 1))) {
    if (!std::regex_search(line, std::regex("^\\| [0-9]+ \\| dp"))) continue;
    const std::vector<std::string> c = cells(line);
    ASSERT_EQ(c.size(), 6u) << line;
    ASSERT_NE(c[3], "failed") << line;
    // "0.0123 ±1.4%": the median of the two runs' steps (their mean), and half their range.
    std::smatch v;
    ASSERT_TRUE(std::regex_match(c[3], v, std::regex("([0-9.]+) ±([0-9.]+)%"))) << line;
    const std::string row = dir + "/row" + c[0];
    const double a = step_of(row + ".report.json"), b = step_of(row + ".run2.report.json");
    EXPECT_NEAR(std::stod(v[1]), 0.5 * (a + b), 6e-5) << line;
    EXPECT_NEAR(std::stod(v[2]), 100.0 * std::fabs(a - b) / (a + b), 0.06) << line;
    ++ran;
    // "params 164.2 KiB =, grads 120.5 KiB =, ..., comm_buffers 0 B vs 16.4 KiB, ..."
    std::set<std::string> seen;
    std::stringstream entries(c[5]);
    for (std::string e; std::getline(entries, e, ',');) {
      e.erase(0, e.find_first_not_of(' '));
      const std::string name = e.substr(0, e.find(' '));
      seen.insert(name);
      if (name == "params" || name == "master_params" || name == "grads" ||
          name == "optimizer_state" || name == "activations") {
        EXPECT_TRUE(e.size() > 2 && e.compare(e.size() - 2, 2, " =") == 0)
            << "predicted " << name << " differs from the run's: " << e << "\n"
            << line;
      }
    }
    for (const char* name : {"params", "grads", "optimizer_state", "activations"}) {
      EXPECT_TRUE(seen.count(name)) << name << " missing from " << line;
    }
  }
  EXPECT_EQ(ran, picked) << text;
  EXPECT_NE(text.find("\nverify: " + std::to_string(ran) + " layouts ran; step time error median "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("; one layout's runs within ±"), std::string::npos) << text;
}

// --fit runs its probes here, writes the fit into the profile it planned with, and the table after
// it (and every later plan at that many ranks per node) prices steps with it.
TEST_F(PlanCli, FitMeasuresProbesAndThePlanThenUsesIt) {
  const std::string cal = calibrate();
  std::string err;
  ASSERT_EQ(strata("plan --config '" + path("tiny.json") + "' --devices 2 --device '" + cal +
                       "' --fit 8 --verify-steps 2 --verify-repeats 1",
                   &err),
            0)
      << err;
  const std::string text = out();
  EXPECT_NE(text.find("no step fit at 2 ranks per node: the model's step"), std::string::npos)
      << text;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      text, m,
      std::regex("\nfit: ([0-9]+) probe layouts \\(([0-9]+) at batch ([0-9]+), ([0-9]+) at "
                 "([0-9]+)\\), 2 timed steps each \\(configs and logs in (.+)\\)\n")))
      << text;
  verify_dirs_.push_back(m[6]);
  EXPECT_EQ(std::stoi(m[1]), 8) << text;
  // The probes from a ranking's leading rows (all of this tiny plan's 276 but the last ones) weigh
  // ten times the others in the fit; the last row of each ranking is probed too.
  std::map<std::string, int> weights;
  for (const std::string& line : lines_of(text.substr(text.find(m[0])))) {
    if (starts_with(line, "fit at ")) break;  // the table's end
    if (!std::regex_search(line, std::regex("^\\| [0-9]+ \\| dp"))) continue;
    const std::vector<std::string> c = cells(line);
    ASSERT_EQ(c.size(), 14u) << line;
    ++weights[c[3]];
  }
  EXPECT_EQ(weights["10"] + weights["1"], 8) << text;
  EXPECT_GE(weights["10"], 4) << text;
  EXPECT_GE(weights["1"], 2) << text;
  // Probes at two global batches, so that the per-step terms are told from the compute's.
  EXPECT_EQ(std::stoi(m[2]) + std::stoi(m[4]), 8) << text;
  EXPECT_EQ(std::stoi(m[4]), 2) << text;  // a quarter
  EXPECT_EQ(std::stoi(m[5]) * 2, std::stoi(m[3])) << text;
  ASSERT_TRUE(std::regex_search(
      text, m,
      std::regex(
          "\nfit at 2 ranks per node: step = ([0-9.]+) x model \\+ ([0-9.]+) us x "
          "collectives \\+ ([0-9.]+) us x messages \\+ ([0-9.]+) us x kernel calls \\+ "
          "([0-9.]+) us x ZeRO-3 gathers \\+ ([0-9.]+) us x tp collectives beside reductions "
          "\\+ ([0-9.]+) us x contended tp/cp collectives \\+ ([0-9.]+) us; error on the "
          "probes median ([0-9.]+)%")))
      << text;
  const cost::DeviceProfile p = cost::read_profile(cal);
  const cost::StepFit* f = p.step_fit(2);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->probes, 8);
  EXPECT_NEAR(f->model_scale, std::stod(m[1]), 1e-3);
  EXPECT_NE(f->source.find("strata plan --fit 8 on"), std::string::npos) << f->source;
  EXPECT_NE(text.find("\nwith the fit:\n" + kTableHeader), std::string::npos) << text;
  // A later plan says it uses the fit.
  ASSERT_EQ(
      strata("plan --config '" + path("tiny.json") + "' --devices 2 --device '" + cal + "'", &err),
      0)
      << err;
  EXPECT_NE(out().find("step fit at 2 ranks per node: strata plan --fit 8 on"), std::string::npos)
      << out();
}

// Each bad input exits 2 before anything is written: stderr says what is wrong, and the
// directory holds only what the test put there.
TEST_F(PlanCli, BadInputExitsTwoNamingTheProblemAndWritesNothing) {
  write(path("nobatch.json"), R"({"model": {"preset": "gpt2-tiny"}})");
  write(path("micro_only.json"),
        R"({"train_micro_batch_size_per_gpu": 2, "model": {"preset": "gpt2-tiny"}})");
  write(path("hosts"), "localhost slots=2\n");
  fs::create_directories(path("run"));  // an existing directory as --emit-config's file
  // A CPU profile (--verify needs one) written here rather than measured: nothing runs.
  cost::DeviceProfile cpu;
  cpu.name = "cpu: test";
  cpu.memory_bytes = cpu.host_memory_bytes = uint64_t(1) << 34;
  cpu.fp32_flops = 1e11;
  cpu.memory_bytes_per_s = 1e10;
  cpu.intra_node = cpu.inter_node = {5e-6, 1e9};
  cost::write_profile(cpu, path("cpu.json"));
  const std::set<std::string> before = files();
  const std::string tiny = " --config '" + path("tiny.json") + "'";
  struct Case {
    std::string args;
    std::vector<std::string> says;
    bool before_the_table;  // refused before planning: stdout stays empty
  };
  const std::string missing_dir = path("no/such/dir/out.json");
  const std::vector<Case> cases = {
      {"plan --config '" + path("nobatch.json") + "' --devices 2 --device h100",
       {"train_batch_size"},
       true},
      {"plan --config '" + path("micro_only.json") + "' --devices 2 --device h100",
       {"strata plan needs the global batch: set train_batch_size"},
       true},
      {"plan" + tiny + " --devices 2 --device h300",
       {"\"h300\"", "cpu, a100, h100, h200", "device profile"},
       true},
      {"plan" + tiny + " --devices 2 --device cpu --calibration '" + path("tiny.json") + "/x.json'",
       {"--calibration " + path("tiny.json") + "/x.json: cannot create its directory"},
       true},
      {"plan" + tiny + " --devices 2 --device h100 --hostfile '" + path("hosts") +
           "' --devices-per-node 2",
       {"give --hostfile or --devices-per-node, not both"},
       true},
      {"plan --config '" + path("absent.json") + "' --devices 2 --device h100",
       {"cannot read the config file " + path("absent.json")},
       true},
      {"plan" + tiny + " --devices 2 --device h100 --devices-per-node -3",
       {"--devices-per-node"},
       true},
      {"plan" + tiny + " --devices 2 --device '" + path("cpu.json") +
           "' --verify 1 --verify-steps 0",
       {"--verify-steps"},
       true},
      {"plan" + tiny + " --devices 2 --device '" + path("cpu.json") +
           "' --verify 1 --verify-repeats 0",
       {"--verify-repeats"},
       true},
      {"plan" + tiny + " --devices 2 --device h100 --explain 999",
       {"--explain 999: not a row number (1..", "nor a layout of the table"},
       false},
      {"plan" + tiny + " --devices 2 --device h100 --emit-config '" + missing_dir + "'",
       {"cannot create " + missing_dir + ".tmp.",
        "check that the directory " + path("no/such/dir") + " exists"},
       false},
      {"plan" + tiny + " --devices 2 --device h100 --emit-config '" + path("run") + "'",
       {"to " + path("run") + ": Is a directory"},
       false},
  };
  for (const Case& c : cases) {
    std::string err;
    EXPECT_EQ(strata(c.args, &err), 2) << c.args << "\n" << err;
    for (const std::string& s : c.says) {
      EXPECT_NE(err.find(s), std::string::npos) << c.args << ": stderr lacks \"" << s << "\"\n"
                                                << err;
    }
    EXPECT_EQ(files(), before) << c.args;  // no config, no temporary file beside one
    if (c.before_the_table) {
      EXPECT_EQ(out(), "") << c.args;
    }
  }
  EXPECT_TRUE(fs::is_empty(path("run")));
}

}  // namespace
}  // namespace strata
